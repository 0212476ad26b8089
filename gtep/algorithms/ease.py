"""EASE (Zhou et al., CVPR 2024, "Expandable Subspace Ensemble for Pre-Trained Model-Based Class-Incremental
Learning").

Each task trains a new set of lightweight adapters on the frozen ViT (a new "subspace"), with a cosine head
over that task's classes only; earlier sets stay frozen, so the feature of an image is the concatenation of
its [CLS] features under every set (embed_dim per task). Classes are represented by prototypes:
- a new class's prototype in every subspace is its mean feature there (each training image passes once
  through each adapter set, when its task arrives; old images are never needed again);
- an old class has no images in a newer subspace, so its prototype there is synthesised (section 4.3,
  semantic-guided prototype complement): cosine similarities between the old class and newer classes,
  measured in the old class's own subspace where both have real prototypes, softmax-normalised, weight
  the newer classes' prototypes in the target subspace.
Inference (section 4.4) scores a class by cosine similarity in the subspace of its own task plus
`alpha` times the mean similarity over the other subspaces (PILOT's EaseCosineLinear.forward_reweight).

As PILOT's `ease` with its default switches (use_init_ptm false, use_reweight true): the pretrained ViT's
own feature is not part of the ensemble, and `recalc_sim` (true by default) re-synthesises an old class in
every newer subspace from all classes that arrived since that subspace, not only in the newest one from
the newest classes (the paper's equation; recalc_sim=False). Adapters are PILOT's (AdaptFormer, "lora"
initialisation, scale 0.1, dropout 0.1), fresh for each task.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gtep.algorithms._pretrained import PretrainedLearner, class_means
from gtep.algorithms.aper import CosineHead, adapter_set
from gtep.algorithms.base import (
    ALGORITHMS,
    AT_LEAST_ONE,
    DROPOUT,
    NON_NEGATIVE,
    CommonParams,
    FitFn,
    TaskData,
    freeze,
    parameter_count,
)
from gtep.models.vit import PromptableViT


@dataclass(frozen=True)
class EASEParams(CommonParams):
    ffn_num: int = 64  # adapter bottleneck width (Table 5: 4-64)
    alpha: float = 0.1  # weight of the other subspaces' similarities at inference (Table 5: 0.01-0.2)
    adapter_dropout: float = 0.1  # fixed in PILOT; stated here, not tuned by Table 5
    recalc_sim: bool = True  # PILOT's default; False = complement only the newest subspace (paper, eq. 9)
    ranges = {"ffn_num": AT_LEAST_ONE, "alpha": NON_NEGATIVE, "adapter_dropout": DROPOUT}


class EASENet(nn.Module):
    """Frozen ViT, one adapter set per task, prototypes (classes, subspaces, embed_dim)."""

    prototypes: Tensor
    class_task: Tensor

    def __init__(self, backbone: PromptableViT, alpha: float) -> None:
        super().__init__()
        self.backbone = backbone
        self.alpha = alpha
        self.subspaces = nn.ModuleList()  # one adapter set (a ModuleList over blocks) per task
        self.head: CosineHead | None = None  # the current task's head, only while it trains
        self.register_buffer("prototypes", torch.empty(0, 0, backbone.out_dim))
        # The task that brought each class: it picks the subspace weighted 1 at inference.
        self.register_buffer("class_task", torch.empty(0, dtype=torch.long))

    def expand(self, total: int, task: int) -> None:
        """Rows for the new classes and a column for the new subspace, zero until filled."""
        classes, subspaces, dim = self.prototypes.shape
        grown = self.prototypes.new_zeros(total, subspaces + 1, dim)
        grown[:classes, :subspaces] = self.prototypes
        self.prototypes = grown
        self.class_task = torch.cat([self.class_task, self.class_task.new_full((total - classes,), task)])

    def encode(self, x: Tensor, subspace: int) -> Tensor:
        return self.backbone(x, adapters=self.subspaces[subspace])["features"]

    def forward(self, x: Tensor) -> dict[str, Tensor]:
        features = torch.stack([self.encode(x, k) for k in range(len(self.subspaces))], dim=1)  # (B, T, D)
        cos = torch.einsum("btd,ctd->bct", F.normalize(features, dim=2), F.normalize(self.prototypes, dim=2))
        return {"features": features.flatten(1), "logits": (cos * self.subspace_weights()).sum(2)}

    def subspace_weights(self) -> Tensor:
        """(classes, subspaces): 1 for a class's own task's subspace, alpha / (others) for every other one."""
        tasks = len(self.subspaces)
        own = F.one_hot(self.class_task, tasks).float()
        return own + (1 - own) * self.alpha / max(tasks - 1, 1)


@torch.no_grad()
def complement_prototypes(prototypes: Tensor, class_task: Tensor, recalc: bool = True) -> None:
    """Semantic-guided prototype complement (EASE section 4.3), in place, after the newest task's classes got
    real prototypes in every subspace. For an old task i and a newer subspace d, the pool is the classes of
    tasks >= d: they have real prototypes both in subspace i and in d."""
    last = int(class_task.max())
    for i in range(last):
        old = class_task == i
        for d in range(i + 1, last + 1) if recalc else (last,):
            pool = class_task >= d
            sim = F.normalize(prototypes[old, i], dim=1) @ F.normalize(prototypes[pool, i], dim=1).t()
            prototypes[old, d] = F.softmax(sim, dim=1) @ prototypes[pool, d]


@ALGORITHMS.register("ease")
class EASE(PretrainedLearner[EASEParams]):
    """EASE (Zhou et al. 2024): a new adapter subspace per task, prototype complement, reweighted ensemble."""

    net: EASENet

    def build_network(self) -> nn.Module:
        return EASENet(self.new_backbone(), self.params.alpha)

    def grow(self, task: TaskData) -> None:
        dim = self.net.backbone.out_dim
        adapters = adapter_set(self.net.backbone, self.params.ffn_num, self.params.adapter_dropout)  # fresh, as PILOT's
        self.net.subspaces.append(adapters.to(self.device))
        self.net.head = CosineHead(dim, task.total - task.known).to(self.device)
        self.net.expand(task.total, task.index)

    def fit_task(self, task: TaskData, fit: FitFn) -> None:
        current = self.net.subspaces[-1]
        fit(list(current.parameters()) + list(self.task_head().parameters()), self.loss, task.x, task.y,
            task.recipe, modules=[self.net])
        self.net.head = None  # the task head only shapes the subspace; classification uses prototypes
        freeze(current)
        new = slice(task.known, task.total)
        for k in range(len(self.net.subspaces)):  # each image once per subspace
            features = self.encode(partial(self.net.encode, subspace=k), task.x)
            self.net.prototypes[new, k] = class_means(features, task.y, task.new_classes)
        complement_prototypes(self.net.prototypes, self.net.class_task, self.params.recalc_sim)

    def loss(self, x: Tensor, y: Tensor) -> Tensor:
        # The head covers only this task's classes, so labels shift to start at 0 (PILOT's aux_targets).
        return F.cross_entropy(self.task_head()(self.net.encode(x, len(self.net.subspaces) - 1)), y - self.known)

    def task_head(self) -> CosineHead:
        if self.net.head is None:
            raise RuntimeError("EASE's cosine head exists only while its task trains")
        return self.net.head

    def parameter_counts(self) -> tuple[int, int]:
        """Trainable = every task's adapters (each learnt on its task, frozen after, all used at inference);
        the pretrained ViT is frozen and the task heads are discarded."""
        return parameter_count(self.net), parameter_count(self.net.subspaces)
