"""APER with adapters, "Adam-Adapter" in the GTEP paper (Zhou et al. 2023, "Revisiting Class-Incremental
Learning with Pre-Trained Models: Generalizability and Adaptivity are All You Need").

Adapt once, then freeze: in the first task only, bottleneck adapters beside every block's MLP (AdaptFormer,
`ffn_num` wide) and a cosine head are trained on the first task's classes. The model used from then on
merges the frozen pretrained ViT and its adapted copy (the "merge" of ADapt and mERge): an image's feature
is the concatenation [pretrained ; adapted] (2 x embed_dim), and each class is represented by its mean
feature, computed once when its task arrives, compared by cosine similarity. Later tasks train nothing.
Adapting only once keeps the generalizable pretrained embedding while closing the gap to the downstream data.

As PILOT's `aper_adapter`: the first-task head is PILOT's CosineLinear (cosine logits times a learnable
scale, not a plain linear layer) and is dropped afterwards; adapters are "lora"-initialised (zero
up-projection), scaled by 0.1 and drop 10% of their bottleneck activations while training.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gtep.algorithms._pretrained import PretrainedLearner, class_means
from gtep.algorithms.base import (
    ALGORITHMS,
    AT_LEAST_ONE,
    DROPOUT,
    CommonParams,
    FitFn,
    TaskData,
    freeze,
    parameter_count,
)
from gtep.models.vit import Adapter, PromptableViT


class DropoutAdapter(Adapter):
    """The shared AdaptFormer adapter with PILOT's dropout on the bottleneck (p=0.1 in APER and EASE)."""

    def __init__(self, dim: int, bottleneck: int, dropout: float) -> None:
        super().__init__(dim, bottleneck)
        self.dropout = dropout

    def forward(self, x: Tensor) -> Tensor:
        return self.up(F.dropout(F.relu(self.down(x)), self.dropout, self.training)) * self.scale


def adapter_set(backbone: PromptableViT, ffn_num: int, dropout: float) -> nn.ModuleList:
    """One adapter per transformer block: what PromptableViT's `adapters=` takes."""
    return nn.ModuleList(DropoutAdapter(backbone.out_dim, ffn_num, dropout) for _ in range(backbone.depth))


class CosineHead(nn.Module):
    """PILOT's CosineLinear: sigma * cos(feature, weight), sigma learnt from 1, weights U(+-dim^-0.5)."""

    def __init__(self, dim: int, classes: int) -> None:
        super().__init__()
        bound = 1.0 / math.sqrt(dim)
        self.weight = nn.Parameter(torch.empty(classes, dim).uniform_(-bound, bound))
        self.sigma = nn.Parameter(torch.ones(1))

    def forward(self, features: Tensor) -> Tensor:
        return self.sigma * (F.normalize(features, dim=1) @ F.normalize(self.weight, dim=1).t())


@dataclass(frozen=True)
class APERParams(CommonParams):
    ffn_num: int = 64  # adapter bottleneck width (Table 5: 4-64; the paper's original run used 100)
    adapter_dropout: float = 0.1  # fixed in PILOT; a field so it is stated, not tuned by Table 5
    ranges = {"ffn_num": AT_LEAST_ONE, "adapter_dropout": DROPOUT}


class APERNet(nn.Module):
    """Frozen ViT, one adapter set, class prototypes over [pretrained ; adapted] features."""

    prototypes: Tensor

    def __init__(self, backbone: PromptableViT, ffn_num: int, dropout: float) -> None:
        super().__init__()
        self.backbone = backbone
        self.adapters = adapter_set(backbone, ffn_num, dropout)
        self.head: CosineHead | None = None  # exists only while the first task trains
        self.register_buffer("prototypes", torch.empty(0, 2 * backbone.out_dim))

    def expand(self, total: int) -> None:
        extra = total - len(self.prototypes)
        if extra > 0:
            zeros = self.prototypes.new_zeros(extra, self.prototypes.shape[1])
            self.prototypes = torch.cat([self.prototypes, zeros])

    def adapted(self, x: Tensor) -> Tensor:
        return self.backbone(x, adapters=self.adapters)["features"]

    def forward(self, x: Tensor) -> dict[str, Tensor]:
        # Pretrained first, adapted second, as PILOT's MultiBranchCosineIncrementalNet concatenates them.
        features = torch.cat([self.backbone(x)["features"], self.adapted(x)], dim=1)
        logits = F.normalize(features, dim=1) @ F.normalize(self.prototypes, dim=1).t()
        return {"features": features, "logits": logits}


@ALGORITHMS.register("aper_adapter")
class APERAdapter(PretrainedLearner[APERParams]):
    """APER / Adam-Adapter (Zhou et al. 2023): adapters tuned on task 1, prototypes of merged features."""

    net: APERNet

    def build_network(self) -> nn.Module:
        return APERNet(self.new_backbone(), self.params.ffn_num, self.params.adapter_dropout)

    def grow(self, task: TaskData) -> None:
        self.net.expand(task.total)
        if task.index == 0:
            self.net.head = CosineHead(self.net.backbone.out_dim, task.total).to(self.device)

    def fit_task(self, task: TaskData, fit: FitFn) -> None:
        if task.index == 0:
            fit(list(self.net.adapters.parameters()) + list(self.first_task_head().parameters()), self.loss,
                task.x, task.y, task.recipe, modules=[self.net])
            self.net.head = None  # the first-task classifier is replaced by prototypes (PILOT does the same)
            freeze(self.net.adapters)
        features = self.encode(self.features, task.x)  # each image through both branches once
        self.net.prototypes[task.known:task.total] = class_means(features, task.y, task.new_classes)

    def loss(self, x: Tensor, y: Tensor) -> Tensor:
        return F.cross_entropy(self.first_task_head()(self.net.adapted(x)), y)

    def first_task_head(self) -> CosineHead:
        if self.net.head is None:
            raise RuntimeError("APER's cosine head exists only while the first task trains")
        return self.net.head

    def parameter_counts(self) -> tuple[int, int]:
        """Trainable = the adapters this run learnt (frozen after task 1, kept for inference); the
        pretrained ViT is frozen and the first-task head is discarded, so neither counts."""
        return parameter_count(self.net), parameter_count(self.net.adapters)
