"""Backbones whose features are concatenated, all but the newest frozen: the "old model + new model" shape
that FOSTER's feature boosting (Wang et al., ECCV 2022) and BEEF's expansion (Wang et al., ICLR 2023) share.

A frozen backbone keeps its weights (requires_grad False) and its BatchNorm statistics (it stays in eval
mode whatever the training loop asks), so the old model's outputs are exactly what they were.
"""
from __future__ import annotations

from typing import cast

import torch
from torch import Tensor, nn

from gtep.algorithms.base import freeze
from gtep.models import Backbone, create_backbone


class BackboneStack(nn.Module):
    """Backbones added one at a time; forward returns their concatenated flat features, oldest first."""

    def __init__(self, backbone: str, statistics_kept: str = "all") -> None:
        super().__init__()
        self.backbone_name = backbone
        self.backbones = nn.ModuleList()
        self.frozen = 0  # backbones [0, frozen) are frozen
        # whose BatchNorm statistics stay fixed: "all" frozen backbones, or only the "first" (PyCIL's BEEF)
        self.statistics_kept = statistics_kept

    @property
    def out_dim(self) -> int:
        """Features of one backbone."""
        return cast(Backbone, self.backbones[0]).out_dim

    @property
    def feature_dim(self) -> int:
        return self.out_dim * len(self.backbones)

    def grow(self, init_from: int | None = None) -> nn.Module:
        """Freeze every backbone so far and add a new trainable one, copied from backbone `init_from`
        (FOSTER copies the newest, BEEF the first) or freshly initialised when None."""
        new = create_backbone(self.backbone_name)
        if len(self.backbones):
            new = new.to(next(self.backbones.parameters()).device)
            if init_from is not None:
                new.load_state_dict(self.backbones[init_from].state_dict())
            freeze(self.backbones)
        self.frozen = len(self.backbones)
        self.backbones.append(new)
        self.train(self.training)
        return new

    @property
    def middle(self) -> list[nn.Module]:
        """Frozen backbones whose BatchNorm statistics follow the training batches (statistics_kept "first")."""
        return [] if self.statistics_kept == "all" else list(self.backbones[1: self.frozen])

    def train(self, mode: bool = True) -> "BackboneStack":
        """The training loop calls module.train() every fit; frozen backbones stay in eval mode so their
        BatchNorm statistics never move (PyCIL only protects the first one; by default we protect them all)."""
        super().train(mode)
        kept = self.frozen if self.statistics_kept == "all" else min(self.frozen, 1)
        for backbone in self.backbones[:kept]:
            backbone.eval()
        return self

    def newest(self, x: Tensor) -> Tensor:
        return self.backbones[-1](x)["features"]

    def forward(self, x: Tensor) -> Tensor:
        # Frozen backbones need no graph unless a gradient with respect to the input is being taken.
        with torch.set_grad_enabled(torch.is_grad_enabled() and x.requires_grad):
            old = [b(x)["features"] for b in self.backbones[: self.frozen]]
        return torch.cat(old + [self.newest(x)], dim=1)
