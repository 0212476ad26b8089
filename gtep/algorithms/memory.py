"""Exemplar memory with herding selection (Rebuffi et al., iCaRL, CVPR 2017, Algorithm 4).

The memory has a fixed total size spread evenly over the classes seen so far (PyCIL's fixed-memory
mode): after each task every old class is cut to size // seen exemplars, keeping its herding order,
and each new class gets that many exemplars chosen by herding on the current model's features.
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

FeatureFn = Callable[[Tensor], Tensor]


def herding_order(features: Tensor, count: int) -> Tensor:
    """Indices of `count` samples whose running feature mean best tracks the class mean (herding).

    Features are L2-normalised first, as in iCaRL. Each step picks the sample that brings the mean of the
    chosen set closest to the class mean; a sample is never chosen twice.
    """
    feats = torch.nn.functional.normalize(features.float(), dim=1)
    mu = feats.mean(0)
    chosen: list[int] = []
    running = torch.zeros_like(mu)
    available = torch.ones(len(feats), dtype=torch.bool, device=feats.device)
    for k in range(1, min(count, len(feats)) + 1):
        candidate_means = (running.unsqueeze(0) + feats) / k
        dist = (mu.unsqueeze(0) - candidate_means).norm(dim=1)
        dist[~available] = float("inf")
        pick = int(torch.argmin(dist))
        chosen.append(pick)
        available[pick] = False
        running += feats[pick]
    return torch.tensor(chosen, dtype=torch.long, device=feats.device)


class ExemplarMemory:
    """Stored training images (already on the device as float tensors) and their ordered labels."""

    def __init__(self, size: int) -> None:
        if size < 0:
            raise ValueError(f"memory size must be >= 0, got {size}")
        self.size = size
        self._x: dict[int, Tensor] = {}  # class label -> exemplars in herding order

    def __len__(self) -> int:
        return sum(len(v) for v in self._x.values())

    @property
    def classes(self) -> list[int]:
        return sorted(self._x)

    def per_class(self, seen_classes: int) -> int:
        return self.size // max(seen_classes, 1)

    def update(self, x: Tensor, y: Tensor, new_classes: list[int], seen_classes: int, feature_fn: FeatureFn) -> None:
        """Shrink old classes to the new per-class quota, then herd exemplars of each new class."""
        quota = self.per_class(seen_classes)
        for label in list(self._x):
            self._x[label] = self._x[label][:quota]
        if quota == 0:
            return
        for label in new_classes:
            xs = x[y == label]
            if len(xs) == 0:
                continue
            with torch.no_grad():
                feats = feature_fn(xs)
            self._x[label] = xs[herding_order(feats, quota)]

    def tensors(self) -> tuple[Tensor, Tensor]:
        """All exemplars and their labels, or empty tensors when the memory holds nothing."""
        if not self._x:
            return torch.empty(0), torch.empty(0, dtype=torch.long)
        labels = self.classes
        xs = torch.cat([self._x[c] for c in labels])
        ys = torch.cat([torch.full((len(self._x[c]),), c, dtype=torch.long, device=xs.device) for c in labels])
        return xs, ys

    def class_means(self, feature_fn: FeatureFn) -> dict[int, Tensor]:
        """Normalised mean of each class's normalised exemplar features (iCaRL's nearest-mean prototypes)."""
        means = {}
        with torch.no_grad():
            for label, xs in self._x.items():
                feats = torch.nn.functional.normalize(feature_fn(xs).float(), dim=1)
                means[label] = torch.nn.functional.normalize(feats.mean(0), dim=0)
        return means

    def state_dict(self) -> dict[str, Tensor]:
        return {str(k): v.cpu() for k, v in self._x.items()}

    def load_state_dict(self, state: dict[str, Tensor], device: torch.device | str = "cpu") -> None:
        self._x = {int(k): v.to(device) for k, v in state.items()}
