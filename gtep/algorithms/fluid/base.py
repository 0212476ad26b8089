"""The shared base of FLUID's stream learners (papers/fluid.txt Sec. 4, App. B/C; notes 004.3).

The data flow "stream" (gtep/protocol/families/fluid/, run by gtep/engine/flows/stream.py): images come one at
a time; the learner predicts each (a class seen so far, or UNSEEN) before its label is revealed, then is told
the label, and decides itself when to update. Labels are positions in order of first appearance: the
engine maps dataset classes to them, so a new class is always position `self.total`.

    predict_sample(x, meter) -> (position or UNSEEN, unseen score)    before the label; counted as inference
    reveal(y)                   the label of the image just predicted: grows the head and the centroids
    update(fit, recipe, meter)  every `update_every` samples: the method's training (counted as updates)

The base keeps what every learner here needs: the seen images and labels (FLUID does not restrict memory;
the CL methods of the paper cache everything), the last image's features, and class centroids of the
L2-normalised features, which the minimum-distance detector uses. Unseen-class detectors (notes 004.3):

    msp  Hendrycks & Gimpel: unseen score = 1 - max softmax probability of the class scores
    mdt  minimum distance thresholding: unseen score = min_i || f/|f| - c_i/|c_i| || (c_i: class centroids)

A sample is predicted UNSEEN when its unseen score is >= `threshold` (always, while no class is known; its
score is then the detector's largest value). The detector runs inside the meter's inference count: MDT's
distances to every centroid are part of a prediction's MACs (gtep/algorithms/_distances.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Literal, Protocol, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gtep.algorithms._distances import euclidean
from gtep.algorithms.base import AT_LEAST_ONE, CommonParams, FitFn, FitRecipe, IncrementalLearner, P, Range
from gtep.protocol.families.fluid.generator import UNSEEN

STREAM = "stream"
Detector = Literal["msp", "mdt"]
MAX_SCORE = {"msp": 1.0, "mdt": 2.0}  # the largest unseen score each detector gives


class Meter(Protocol):
    """What the engine's compute meter offers a learner (gtep/engine/flows/stream.py ComputeMeter)."""

    def inference(self, fn: Callable[[Tensor], Any], x: Tensor) -> Any:
        """fn(x), its MACs counted as inference."""

    def training(self, forward: Callable[[Tensor], Any], x_one: Tensor, samples: int) -> None:
        """`samples` training passes of `forward` (measured on one sample), backward included by the meter."""


@dataclass(frozen=True)
class StreamParams(CommonParams):
    """The update schedule (the paper's: 4 epochs over all seen data every 5,000 samples) and the detector."""

    epochs: int = 4
    lr: float = 0.1
    update_every: int = 100  # samples between updates
    detector: Detector = "msp"
    threshold: float = 0.5  # flag UNSEEN when the unseen score >= threshold
    # threshold 0 flags every sample UNSEEN; one above the scores' top (msp 1, mdt 2) never flags, as presets use
    ranges = {"update_every": AT_LEAST_ONE, "threshold": Range(0, low_open=True)}


class StreamLearner(IncrementalLearner[P]):
    """Predict, reveal, update (module docstring). Subclasses give `class_scores` and `update`."""

    data_flows: ClassVar[frozenset[str]] = frozenset({STREAM})
    uses_memory = False
    fixed_first_task = False
    # the `pretrain:` section's method the learner's backbone must come from (None: any); the pre-flight pass
    # refuses a study without it (gtep/config/family_checks.py), since the learner means nothing on another
    required_pretrain_method: ClassVar[str | None] = None

    def __init__(self, params: P, backbone: str, memory_size: int, device: torch.device,
                 weights: str | None = None) -> None:
        super().__init__(params, backbone, memory_size, device, weights)
        dim = cast(int, self.backbone.out_dim)
        self.seen_x: list[Tensor] = []
        self.seen_y: list[int] = []
        self.seen_features: list[Tensor] = []
        self.centroid_sum = torch.zeros(0, dim, device=device)
        self.feature_sum = torch.zeros(0, dim, device=device)  # of the raw features: class_means()
        self.class_count = torch.zeros(0, device=device)
        # the sums above are of features taken at prediction time; an update that trains the backbone changes the
        # features, so it bumps backbone_version, and the sums are taken again before they are next read
        self.backbone_version = 0
        self.sums_version = 0
        self.last_features: Tensor | None = None
        self.last_x: Tensor | None = None
        self.backbone.requires_grad_(False)  # what trains is the method's (update)

    @property
    def backbone(self) -> nn.Module:
        return cast(nn.Module, self.net.backbone)

    @property
    def head(self) -> nn.Module:
        return cast(nn.Module, self.net.head)

    @property
    def caches_features(self) -> bool:
        """Frozen backbone: every seen image's features are computed once, at prediction, and trained on."""
        return True

    @property
    def stream_params(self) -> StreamParams:
        return cast(StreamParams, self.params)

    # ---- the stream's steps (the engine calls them in this order) -------------------------------------
    @torch.no_grad()
    def predict_sample(self, x: Tensor, meter: Meter) -> tuple[int, float]:
        """(predicted position or UNSEEN, unseen score) of one image (batch of 1), before its label."""
        self.net.eval()
        features = meter.inference(self.sample_features, x)
        self.last_x, self.last_features = x, features
        if self.total == 0:
            return UNSEEN, MAX_SCORE[self.stream_params.detector]
        logits = meter.inference(self.class_scores, features)
        # inside the meter: MDT's distances to every centroid are inference compute (the paper's A MACs)
        score = cast(float, meter.inference(lambda f: self.unseen_score(logits, f), features))
        if score >= self.stream_params.threshold:
            return UNSEEN, score
        return int(logits.argmax(1).item()), score

    @torch.no_grad()
    def reveal(self, y: int) -> None:
        """The label (position) of the image predicted last."""
        if self.last_x is None or self.last_features is None:
            raise RuntimeError("reveal comes after predict_sample")
        if y == self.total:  # a class not seen before
            self.total += 1
            self.grow_classes(self.total)
        self.seen_x.append(self.last_x)
        self.seen_y.append(y)
        self.seen_features.append(self.last_features)
        self.centroid_sum[y] += F.normalize(self.last_features, dim=1)[0]
        self.feature_sum[y] += self.last_features[0]
        self.class_count[y] += 1

    def due(self, step: int) -> bool:
        """Whether to update after `step` samples."""
        return step % max(1, self.stream_params.update_every) == 0

    # ---- hooks ---------------------------------------------------------------------------------------
    def sample_features(self, x: Tensor) -> Tensor:
        return cast(Tensor, self.backbone(x)["features"])

    def class_scores(self, features: Tensor) -> Tensor:
        """Logits (1, total) of one image's features over the classes seen so far."""
        return cast(Tensor, self.head(features))[:, : self.total]

    def grow_classes(self, total: int) -> None:
        """Room for a new class: a head row and a centroid row."""
        expand = cast(Callable[[int], None], self.net.expand)
        expand(total)
        self.net.to(self.device)
        dim = self.centroid_sum.shape[1]
        self.centroid_sum = torch.cat([self.centroid_sum, torch.zeros(1, dim, device=self.device)])
        self.feature_sum = torch.cat([self.feature_sum, torch.zeros(1, dim, device=self.device)])
        self.class_count = torch.cat([self.class_count, torch.zeros(1, device=self.device)])

    def update(self, fit: FitFn, recipe: FitRecipe, meter: Meter) -> None:
        """The method's training on everything seen so far; default: nothing (NCM)."""

    # ---- helpers -------------------------------------------------------------------------------------
    def centroids(self) -> Tensor:
        """Mean L2-normalised feature of each seen class (total, dim), under the backbone as it is now."""
        self.refresh_sums()
        return self.centroid_sum / self.class_count.clamp(min=1).unsqueeze(1)

    def class_means(self) -> Tensor:
        """Mean raw (unnormalised) feature of each seen class (total, dim): ProtoNet's prototypes, OLTR's memory."""
        self.refresh_sums()
        return self.feature_sum / self.class_count.clamp(min=1).unsqueeze(1)

    def backbone_trained(self) -> None:
        """Called after an update that trained backbone weights: the class sums are of the old features."""
        self.backbone_version += 1

    @torch.no_grad()
    def refresh_sums(self, batch: int = 256) -> None:
        """The class sums again from every seen image's features now, once per backbone version: without it MDT
        would measure distances to the centroids of a network that no longer exists. It runs where the detector
        first reads them after an update, so its MACs count as that prediction's inference."""
        if self.sums_version == self.backbone_version or not self.seen_x:
            return
        self.net.eval()
        x, y = torch.cat(self.seen_x), torch.tensor(self.seen_y, device=self.device)
        features = torch.cat([self.sample_features(x[i:i + batch]) for i in range(0, len(x), batch)]).float()
        self.centroid_sum = torch.zeros_like(self.centroid_sum).index_add_(0, y, F.normalize(features, dim=1))
        self.feature_sum = torch.zeros_like(self.feature_sum).index_add_(0, y, features)
        self.sums_version = self.backbone_version

    def unseen_score(self, logits: Tensor, features: Tensor) -> float:
        if self.stream_params.detector == "msp":
            return float(1 - F.softmax(logits.float(), dim=1).max())
        distances = euclidean(F.normalize(features, dim=1), F.normalize(self.centroids(), dim=1))
        return float(distances.min())

    def seen(self) -> tuple[Tensor, Tensor]:
        """(features if cached, else images; labels) of every sample seen so far."""
        x = torch.cat(self.seen_features if self.caches_features else self.seen_x)
        return x, torch.tensor(self.seen_y, device=self.device)

    def train_head(self, fit: FitFn, recipe: FitRecipe, meter: Meter, parameters: list[nn.Parameter],
                   loss: Callable[[Tensor, Tensor], Tensor]) -> None:
        """`recipe.epochs` over every cached feature, training `parameters` with `loss` (features, labels)."""
        x, y = self.seen()
        meter.training(lambda f: loss(f, y[:1]), x[:1], len(x) * recipe.epochs)
        fit(parameters, loss, x, y, recipe, augment=False, modules=[])

    def train_network(self, fit: FitFn, recipe: FitRecipe, meter: Meter, modules: list[nn.Module],
                      loss: Callable[[Tensor, Tensor], Tensor], forward: Callable[[Tensor], Any]) -> None:
        """`recipe.epochs` over every seen image, training `modules` (their BatchNorm statistics too) with `loss`
        (images, labels); `forward` on one image is what the meter counts per sample passed."""
        x, y = self.seen()
        meter.training(forward, x[:1], len(x) * recipe.epochs)
        fit([p for m in modules for p in m.parameters()], loss, x, y, recipe, modules=modules)
        self.net.eval()
        if any(m is not self.head for m in modules):  # backbone blocks trained: their features changed
            self.backbone_trained()
