"""Exemplar Tuning (FLUID, papers/fluid.txt Sec. 4; notes 004.3): class i's weight is its centroid of normalised
features plus a learned residual, C_i = (1/n_i) sum_{x in D_i} f(x)/|f(x)| + r_i, and p(y=i|x) =
softmax_i(C_i . f(x)) (dot product, the paper's best; it prints sum_{i != j}, a typo). The centroids follow
every sample; r_i starts at 0 and is batch-trained with cross-entropy on the fine-tune schedule (every
`update_every` samples, `epochs` over all seen data), the backbone frozen."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gtep.algorithms.base import ALGORITHMS, FitFn, FitRecipe
from gtep.algorithms.fluid.base import Meter, StreamLearner, StreamParams


@ALGORITHMS.register("fluid_et")
class FluidExemplarTuning(StreamLearner[StreamParams]):
    """Centroids plus residuals over frozen features."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.residual = nn.Parameter(torch.zeros(0, self.centroid_sum.shape[1], device=self.device))

    def grow_classes(self, total: int) -> None:
        super().grow_classes(total)
        with torch.no_grad():  # a new class's residual starts at 0 (the paper's init)
            fresh = torch.zeros(total - len(self.residual), self.residual.shape[1], device=self.device)
            self.residual = nn.Parameter(torch.cat([self.residual.data, fresh]))

    def class_scores(self, features: Tensor) -> Tensor:
        return features @ (self.centroids() + self.residual).t()

    def update(self, fit: FitFn, recipe: FitRecipe, meter: Meter) -> None:
        def loss(f: Tensor, y: Tensor) -> Tensor:
            return F.cross_entropy(self.class_scores(f), y)

        self.train_head(fit, recipe, meter, [self.residual], loss)

    def parameter_counts(self) -> tuple[int, int]:
        """The backbone and the residuals (the unused linear head is not counted; centroids are statistics)."""
        backbone = sum(p.numel() for p in self.backbone.parameters())
        return backbone + self.residual.numel(), self.residual.numel()
