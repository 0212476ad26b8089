"""Fifteen learners that cost nothing but answer like the paper's fifteen algorithms (issue 34's rehearsal).

A paper-scale matrix (15 algorithms x 8 cells x R = 30 sets x S = 5 orderings, plus each evaluation) exercises
gtep's driver, journal, MLflow store, reports and UI at 20,000+ units; the training is the GPUs' business and is
left out. Each learner here is registered as `ps_<algorithm>` and, per task, only reads the class means of its
images' 4x4-pooled pixels (the synthetic datasets' classes are fixed colour patterns, so the nearest mean is the
true class), then answers with an accuracy drawn from a profile of its paper algorithm:

    accuracy of a class learnt at task k, seen after task t  =  base * quality(set) * (1 - forgetting) ** (t - k)

quality(set) peaks at the profile's best learning rate and batch size and falls off with their distance (log
scale), so tuning has a real optimum and sets really differ; a set's learning rate a decade above the best
diverges (a non-finite loss through the engine's `fit`, recorded as diverged like a real run). An image is
answered right when a uniform number drawn from the ordering's seed and the image's own pixels is below that
accuracy, else as another seen class: the same config and seed give the same accuracy matrices, bit for bit.

Registered from outside the package, as benchmarks/noop_learner.py is:

    GTEP_PLUGINS=paper_scale_learners PYTHONPATH=benchmarks gtep tune --config exp.yaml   # algorithm: ps_replay
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gtep.algorithms import ALGORITHMS, CommonParams, IncrementalLearner, TaskData


@dataclass(frozen=True)
class Profile:
    """How a paper algorithm answers: accuracy when a task is learnt, forgetting per later task, best lr and batch."""

    base: float
    forgetting: float
    best_lr: float
    best_batch: int = 128
    sensitivity: float = 0.5  # how fast quality falls with the distance to the best set (per decade of lr)


# The paper's nine ResNet methods and six pretrained-ViT methods (Tables 1-2 give their orders of magnitude).
PROFILES = {
    "replay": Profile(0.78, 0.10, 0.1), "icarl": Profile(0.80, 0.08, 0.1), "bic": Profile(0.80, 0.07, 0.1),
    "wa": Profile(0.81, 0.06, 0.1), "podnet": Profile(0.79, 0.07, 0.05), "der": Profile(0.84, 0.05, 0.1),
    "foster": Profile(0.84, 0.05, 0.1), "beef": Profile(0.83, 0.05, 0.1), "memo": Profile(0.83, 0.06, 0.1),
    "l2p": Profile(0.86, 0.03, 0.03, 16, 0.3), "dualprompt": Profile(0.87, 0.03, 0.01, 16, 0.3),
    "coda_prompt": Profile(0.88, 0.03, 0.001, 16, 0.3), "aper_adapter": Profile(0.88, 0.02, 0.05, 16, 0.3),
    "ranpac": Profile(0.91, 0.02, 0.05, 16, 0.3), "ease": Profile(0.90, 0.02, 0.01, 16, 0.3),
}


def quality(profile: Profile, lr: float, batch_size: int) -> float:
    """1 at the profile's best set, falling as a Gaussian of the log-distances of lr and batch size."""
    distance = math.log10(lr / profile.best_lr) ** 2 + (math.log2(batch_size / profile.best_batch) / 3) ** 2
    return math.exp(-profile.sensitivity * distance)


def diverges(profile: Profile, lr: float) -> bool:
    return lr >= 10 * profile.best_lr


def uniforms(x: Tensor, seed: int, task: int) -> Tensor:
    """One number in [0, 1) per image, from its pixels, the ordering's seed and the task it is tested after."""
    generator = torch.Generator().manual_seed(int(hashlib.sha256(f"{seed}/{task}".encode()).hexdigest()[:12], 16))
    weights = torch.rand(x[0].numel(), generator=generator, dtype=torch.float64)
    return torch.remainder((x.flatten(1).double().cpu() @ weights) * 1e3, 1.0)


class MeansNet(nn.Module):
    """The class means of 4x4-pooled images and the task each class was learnt at; no parameters."""

    means: Tensor
    learnt_at: Tensor

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("means", torch.zeros(0, 48))
        self.register_buffer("learnt_at", torch.zeros(0, dtype=torch.long))

    def expand(self, total: int) -> None:
        grow = total - len(self.means)
        if grow > 0:
            self.means = torch.cat([self.means, torch.zeros(grow, 48, device=self.means.device)])
            self.learnt_at = torch.cat([self.learnt_at, torch.full((grow,), -1, device=self.means.device)])

    def forward(self, x: Tensor) -> dict[str, Tensor]:
        features = pooled(x)
        return {"logits": -torch.cdist(features, self.means[: max(len(self.means), 1)]), "features": features}


def pooled(x: Tensor) -> Tensor:
    view = x.as_tensor() if hasattr(x, "as_tensor") else x
    return F.adaptive_avg_pool2d(view.float(), 4).flatten(1)


class PaperScaleLearner(IncrementalLearner[CommonParams]):
    """Answers with its profile's accuracy matrix (module docstring); trains nothing."""

    profile: Profile
    uses_memory = False
    fixed_first_task = False

    def build_network(self) -> nn.Module:
        self.task = -1
        self.seed = int(torch.randint(0, 2**31 - 1, (1,)))  # built under the ordering's seed: the answers' seed
        return MeansNet()

    def fit_task(self, task: TaskData, fit) -> None:
        self.task = task.index
        p = self.params
        if task.index > 0 and diverges(self.profile, p.lr):  # as a real run ends: a non-finite loss in fit
            weight = nn.Parameter(torch.zeros(1, device=task.y.device))
            fit([weight], lambda x, y: weight.sum() * float("nan"), task.x[:2], task.y[:2],
                task.recipe.replace(epochs=1))
            return
        net: MeansNet = self.net  # type: ignore[assignment]
        features = self.batched(pooled)(task.x)
        for label in task.new_classes:
            net.means[label] = features[task.y == label].mean(0)
            net.learnt_at[label] = task.index

    @torch.no_grad()
    def predict(self, x: Tensor) -> Tensor:
        net: MeansNet = self.net  # type: ignore[assignment]
        x = x.as_tensor() if hasattr(x, "as_tensor") else x
        scores = net(x)["logits"][:, : self.total]
        truth = scores.argmax(1)
        p = self.params
        age = (self.task - net.learnt_at[truth]).clamp(min=0).double().cpu()
        accuracy = self.profile.base * quality(self.profile, p.lr, p.batch_size) * (1 - self.profile.forgetting) ** age
        right = uniforms(x, self.seed, self.task) < accuracy
        wrong = (truth + 1 + (uniforms(x, self.seed + 1, self.task) * max(self.total - 1, 1)).long().to(truth.device))
        answer = torch.where(right.to(truth.device), truth, wrong % max(self.total, 1))
        return F.one_hot(answer, max(self.total, 1)).float()


def register(name: str, profile: Profile) -> type[PaperScaleLearner]:
    """A module-level class per learner: checkpoints pickle the learner, which finds its class by this name."""
    learner = type(f"PaperScale_{name}", (PaperScaleLearner,), {"profile": profile, "__module__": __name__,
                                                                 "__doc__": f"{name}'s answers, at no cost"})
    globals()[learner.__name__] = learner
    return ALGORITHMS.register(f"ps_{name}")(learner)


LEARNERS = {name: register(name, profile) for name, profile in PROFILES.items()}
