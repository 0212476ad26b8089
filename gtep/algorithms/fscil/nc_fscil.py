"""NC-FSCIL (Yang et al., "Neural Collapse Inspired Feature-Classifier Alignment for Few-Shot Class Incremental
Learning", ICLR 2023), as its reference code (github.com/NeuralCollapseApplications/FSCIL) builds it.

The classifier is fixed before any training: a simplex equiangular tight frame (ETF) of `etf_classes` unit
vectors, pairwise cosine -1/(K-1), one per class of every session to come, W = sqrt(K/(K-1)) U (I - 11^T/K)
with U a random orthonormal basis. It never trains. What learns is the backbone (base session only) and a
projection neck after it (every session), with the dot-regression loss

    L_DR = 1/2 (w_y^T h - 1)^2,  h the L2-normalised projected feature, w_y the class's ETF vector,

whose gradient only pulls a feature towards its own vector (no push from the other classes, so a few-shot
session does not disturb the old ones' geometry). Few-shot sessions freeze the backbone and fine-tune the
neck with the session's shots plus a memory of one feature per old class, its mean backbone feature (the
paper's memory M of class means). Prediction: argmax over the seen classes of w_c^T h.

Simplified: the neck is a residual two-layer MLP with LayerNorm (the reference MLPFFNNeck has three layers at
twice the width); its width is max(backbone width, etf_classes) so K vectors fit (the reference fixes 512
on 100 classes). Few-shot sessions train on features computed once in eval mode (no augmentation), since the
backbone is frozen. The reference code's extra base-session augmentations are not used.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gtep.algorithms._pretrained import class_means
from gtep.algorithms.base import (
    ALGORITHMS,
    NON_NEGATIVE,
    CommonParams,
    FitFn,
    IncrementalLearner,
    Range,
    TaskData,
    freeze,
)
from gtep.algorithms.fscil.frozen_prototypes import PROTOTYPE_BATCH
from gtep.models import Backbone


@dataclass(frozen=True)
class NCFSCILParams(CommonParams):
    etf_classes: int = 100  # K: every class of every session (CIFAR-100 and miniImageNet: 100; CUB-200: 200)
    loss_weight: float = 10.0  # the DR loss's weight in the reference configs (DRLoss loss_weight=10.0)
    ranges = {"etf_classes": Range(2), "loss_weight": NON_NEGATIVE}  # a simplex ETF needs two vectors


def simplex_etf(classes: int, dim: int, generator: torch.Generator) -> Tensor:
    """(classes, dim) unit vectors with pairwise cosine -1/(classes-1) (a simplex ETF); needs dim >= classes."""
    basis, _ = torch.linalg.qr(torch.randn(dim, classes, generator=generator))  # orthonormal columns
    centred = torch.eye(classes) - torch.full((classes, classes), 1.0 / classes)
    return ((classes / (classes - 1)) ** 0.5 * basis @ centred).t().contiguous()


class Neck(nn.Module):
    """Residual MLP projection: Linear-LayerNorm-LeakyReLU-Linear plus a linear shortcut."""

    def __init__(self, dim_in: int, dim_out: int) -> None:
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(dim_in, dim_out), nn.LayerNorm(dim_out), nn.LeakyReLU(0.1),
                                 nn.Linear(dim_out, dim_out))
        self.shortcut = nn.Linear(dim_in, dim_out, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.mlp(x) + self.shortcut(x)


class ETFNet(nn.Module):
    """Backbone, neck and the fixed ETF classifier (a buffer: nothing can train it)."""

    etf: Tensor
    memory: Tensor

    def __init__(self, backbone: Backbone, etf_classes: int) -> None:
        super().__init__()
        self.backbone = backbone
        dim = max(backbone.out_dim, etf_classes)
        self.neck = Neck(backbone.out_dim, dim)
        generator = torch.Generator().manual_seed(int(torch.randint(2**31 - 1, ()).item()))
        self.register_buffer("etf", simplex_etf(etf_classes, dim, generator))
        self.register_buffer("memory", torch.empty(0, backbone.out_dim))  # mean backbone feature per old class

    def head(self, backbone_features: Tensor) -> Tensor:
        """Cosine of the projected feature to every ETF vector (the vectors have unit norm)."""
        return F.normalize(self.neck(backbone_features), dim=1) @ self.etf.t()

    def forward(self, x: Tensor) -> dict[str, Tensor | list[Tensor]]:
        out = self.backbone(x)
        features = out["features"]
        assert isinstance(features, Tensor)
        out["logits"] = self.head(features)
        return out


def dot_regression(cosines: Tensor, y: Tensor, weight: float = 1.0) -> Tensor:
    """NC-FSCIL's DR loss on the cosines to the ETF vectors: weight * 1/2 (w_y^T h - 1)^2, averaged."""
    return weight * 0.5 * (cosines.gather(1, y[:, None]) - 1).pow(2).mean()


@ALGORITHMS.register("nc_fscil")
class NCFSCIL(IncrementalLearner[NCFSCILParams]):
    """NC-FSCIL (Yang et al. 2023): a fixed simplex-ETF classifier, the dot-regression loss, a backbone frozen
    after the base session and a projection neck fine-tuned on each session's shots and the old class means."""

    uses_memory = False
    fixed_first_task = True
    first_task_hparams = ("etf_classes", "loss_weight")
    net: ETFNet

    # the values a scenario's size limits: checked before any compute by gtep.preflight.check_learner_limits
    scenario_limits = ("etf_classes",)

    @classmethod
    def scenario_problem(cls, values: dict[str, Any], facts: dict[str, Any]) -> str | None:
        """The ETF is fixed before training: it needs a vector for every class the sessions reach."""
        if values["etf_classes"] < facts["classes"]:
            return (f"etf_classes {values['etf_classes']} is fewer than the {facts['classes']} classes the sessions "
                    f"reach; set etf_classes to at least {facts['classes']}")
        return None

    def build_network(self) -> nn.Module:
        return ETFNet(self.new_backbone(), self.params.etf_classes)

    def grow(self, task: TaskData) -> None:
        if task.total > self.params.etf_classes:
            raise ValueError(f"nc_fscil fixes {self.params.etf_classes} ETF vectors (etf_classes) before training, "
                             f"but the sessions reach {task.total} classes; set etf_classes to at least that")

    def loss(self, x: Tensor, y: Tensor) -> Tensor:
        logits = self.net(x)["logits"]
        assert isinstance(logits, Tensor)
        return dot_regression(logits, y, self.params.loss_weight)

    def fit_task(self, task: TaskData, fit: FitFn) -> None:
        """Base session: backbone and neck by dot regression (the default fit of `loss`). Later sessions: the neck
        alone, on the shots' frozen features plus one mean feature per old class."""
        if task.index == 0:
            super().fit_task(task, fit)
            return
        shots = self.backbone_features(task)
        # each old class's mean as often as a novel class has shots, so both weigh the same in the loss
        repeat = max(1, len(task.y) // max(1, len(task.new_classes)))
        x = torch.cat([shots, self.net.memory.repeat_interleave(repeat, dim=0)])
        y = torch.cat([task.y, torch.arange(task.known, device=task.y.device).repeat_interleave(repeat)])
        fit(self.net.neck.parameters(), self.neck_loss, x, y, task.recipe, augment=False, modules=[self.net.neck])

    def neck_loss(self, features: Tensor, y: Tensor) -> Tensor:
        return dot_regression(self.net.head(features), y, self.params.loss_weight)

    def consolidate(self, task: TaskData, fit: FitFn) -> None:
        """Freeze the backbone after the base session (BatchNorm statistics too: it runs in eval mode from now),
        and store each new class's mean backbone feature for the sessions to come."""
        if task.index == 0:
            freeze(self.net.backbone)
        means = class_means(self.backbone_features(task), task.y, task.new_classes)
        self.net.memory = torch.cat([self.net.memory, means])

    @torch.no_grad()
    def backbone_features(self, task: TaskData) -> Tensor:
        self.net.eval()
        return self.batched(lambda x: self.net.backbone(x)["features"], PROTOTYPE_BATCH)(task.x)

    def trainable_parameters(self) -> list[nn.Parameter]:
        return [p for p in self.net.parameters() if p.requires_grad]


__all__ = ["NCFSCIL", "NCFSCILParams", "dot_regression", "simplex_etf"]
