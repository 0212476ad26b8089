"""What the prompt-pool methods L2P and DualPrompt share, as PILOT builds them (Sun et al. 2023,
`vit_l2p.py`, `vit_dualprompt.py`, `l2p.py`, `dualprompt.py`).

- The query is the frozen pretrained ViT's [CLS] feature without prompts (PILOT's "original backbone";
  the prompted backbone is frozen too, so one module serves both and no copy is kept).
- Prompts are chosen by cosine similarity between the query and one learnable key per prompt, and the
  surrogate (pull) loss draws the chosen keys toward their queries (L2P eq. 5; DualPrompt eq. 4).
- One linear head over all classes seen so far, grown per task; during training the logits of old classes
  are masked out (PILOT's train mask), so a task's cross-entropy only separates its own classes.
- Prompts and keys start uniform in [-1, 1] (PILOT's "uniform" prompt and key init); only prompts, keys
  and the head train.
Not auto-imported (leading underscore): it registers nothing.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gtep.algorithms._pretrained import PretrainedLearner
from gtep.algorithms.base import (
    AT_LEAST_ONE,
    NON_NEGATIVE,
    CommonParams,
    Constraint,
    FitFn,
    Optimizer,
    Scheduler,
    TaskData,
    freeze,
)
from gtep.models.vit import PromptableViT

# L2P and DualPrompt choose top_k prompts per image from a pool of pool_size
TOP_K_IN_POOL = Constraint(("top_k", "pool_size"), lambda top_k, pool_size: top_k <= pool_size,
                           "top_k prompts are chosen from a pool of pool_size; lower top_k or raise pool_size")


@dataclass(frozen=True)
class PromptParams(CommonParams):
    """What both methods' Params have: PILOT's shared recipe (l2p.json, dualprompt.json; GTEP paper appendix A.2),
    a pool of pool_size prompts with one key each, top_k of them chosen per image, and the weight of the
    key-query pull loss. Each method's Params restate the defaults in which the two differ."""

    epochs: int = 10
    weight_decay: float = 0.0
    scheduler: Scheduler = "constant"
    optimizer: Optimizer = "adam"
    pool_size: int = 10
    top_k: int = 1
    lamb: float = 0.1
    ranges = {"pool_size": AT_LEAST_ONE, "top_k": AT_LEAST_ONE, "lamb": NON_NEGATIVE}
    constraints = (TOP_K_IN_POOL,)


def check_top_k_in_pool(method: str, top_k: int, pool_size: int) -> None:
    """A network built without its Params' validation (a test, a benchmark) refuses a pool too small as well."""
    if not 1 <= top_k <= pool_size:
        raise ValueError(f"{method} top_k={top_k} and pool_size={pool_size} conflict: top_k prompts are chosen from "
                         "a pool of pool_size (top_k >= 1); lower top_k or raise pool_size")


# L2PParams or DualPromptParams
PP = TypeVar("PP", bound=PromptParams)


def uniform_parameter(*shape: int) -> nn.Parameter:
    return nn.Parameter(torch.empty(*shape).uniform_(-1.0, 1.0))


class GrowingHead(nn.Module):
    """A linear classifier grown by rows per task; new rows take timm's head init (trunc normal, std 0.02)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(0, dim))
        self.bias = nn.Parameter(torch.empty(0))

    def expand(self, total: int) -> None:
        extra = total - len(self.weight)
        if extra <= 0:
            return
        rows = torch.empty(extra, self.weight.shape[1], device=self.weight.device)
        nn.init.trunc_normal_(rows, std=0.02)
        self.weight = nn.Parameter(torch.cat([self.weight.detach(), rows]))
        self.bias = nn.Parameter(torch.cat([self.bias.detach(), torch.zeros(extra, device=self.bias.device)]))

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(x, self.weight, self.bias)


def key_similarity(query: Tensor, keys: Tensor) -> Tensor:
    """Cosine similarity of each query (B, D) with each key (M, D): (B, M)."""
    return F.normalize(query, dim=1) @ F.normalize(keys, dim=1).t()


def pull_loss(similarity: Tensor, chosen: Tensor) -> Tensor:
    """Surrogate loss drawing chosen keys to their queries: sum over the chosen keys of (1 - cos), batch mean.

    Summed over the k chosen keys as in L2P's eq. 5 and PILOT's reduce_sim (sum / batch), so the tuned
    lambda means the same as there; the constant 1 only shifts the value."""
    return (1 - similarity.gather(1, chosen)).sum(1).mean()


def mask_old_classes(logits: Tensor, known: int) -> Tensor:
    """PILOT's train mask: old classes get -inf logits, so the current task's cross-entropy ignores them."""
    old = torch.arange(logits.shape[1], device=logits.device) < known
    return logits.masked_fill(old, float("-inf"))


class PromptNet(nn.Module):
    """A frozen PromptableViT, a growing head and the prompt-free query; subclasses add prompts and keys."""

    def __init__(self, backbone: PromptableViT) -> None:
        super().__init__()
        self.backbone = freeze(backbone)  # the learner's backbone is frozen already; a net built alone too
        self.head = GrowingHead(backbone.out_dim)

    def expand(self, total: int) -> None:
        self.head.expand(total)

    @torch.no_grad()
    def query(self, x: Tensor) -> Tensor:
        return self.backbone(x)["features"]


class PromptLearner(PretrainedLearner[PP]):
    """The task loop of both methods: grow the head, one fit of prompts, keys and head, masked CE + pull.

    No snapshot of the old network (distills stays False): neither method distils."""

    net: PromptNet
    task_index: int | None = None  # the task being trained (DualPrompt uses it); None at test time

    def make_net(self, backbone: PromptableViT) -> PromptNet:
        raise NotImplementedError

    def build_network(self) -> nn.Module:
        return self.make_net(self.new_backbone())

    def fit_task(self, task: TaskData, fit: FitFn) -> None:
        self.task_index = task.index
        try:
            super().fit_task(task, fit)
        finally:
            self.task_index = None

    def loss(self, x: Tensor, y: Tensor) -> Tensor:
        out = self.net(x, task=self.task_index)
        logits = mask_old_classes(out["logits"][:, : self.total], self.known)
        return F.cross_entropy(logits, y) + self.params.lamb * out["pull"]
