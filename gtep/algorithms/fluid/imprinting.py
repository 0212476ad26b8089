"""Weight Imprinting in FLUID (Qi, Brown & Lowe, "Low-shot learning with imprinted weights", CVPR 2018; papers/
fluid.txt Sec. 4, App. B/C/I; notes 004.3): a cosine classifier, p(y=i|x) = softmax_i(s * cos(w_i, f(x))), whose
weight rows are imprinted: w_i = the normalised mean of class i's L2-normalised features (Qi et al. Sec. 3.2), then
fine-tuned with a learnable scale s on frozen features.

The FLUID paper's streaming reading: until `switch_after` samples the classifier is NCM under the cosine metric,
every weight re-imprinted after every sample (instance-based, as for NCM); from then on, every `update_every`
samples, `epochs` over all seen data train the weights and s (lr 0.1, its fine-tune schedule). A class seen
first after the switch is imprinted the same way, and its row follows its class mean until an update trains it
(the point of imprinting: a new class starts at its embedding). The paper switches after 10,000 samples (where NCM
saturated on its validation sequence) and its best initial s is 4 (Table 9)."""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gtep.algorithms.base import ALGORITHMS, NON_NEGATIVE, POSITIVE, FitFn, FitRecipe
from gtep.algorithms.fluid.base import Meter, StreamLearner, StreamParams


@dataclass(frozen=True)
class ImprintingParams(StreamParams):
    scale: float = 4.0  # initial s of the cosine classifier (learned from there)
    switch_after: int = 100  # samples of pure imprinting (NCM, cosine metric) before fine-tuning starts
    ranges = {"scale": POSITIVE, "switch_after": NON_NEGATIVE}


@ALGORITHMS.register("fluid_imprinting")
class FluidImprinting(StreamLearner[ImprintingParams]):
    """Imprinted cosine classifier over frozen features, fine-tuned after `switch_after` samples."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.weight = nn.Parameter(torch.zeros(0, self.centroid_sum.shape[1], device=self.device))
        self.tuned = torch.zeros(0, dtype=torch.bool, device=self.device)  # rows an update has trained
        self.scale = nn.Parameter(torch.tensor(float(self.params.scale), device=self.device))

    def grow_classes(self, total: int) -> None:
        super().grow_classes(total)
        fresh = total - len(self.weight)
        self.weight = nn.Parameter(torch.cat([self.weight.data, self.weight.new_zeros(fresh, self.weight.shape[1])]))
        self.tuned = torch.cat([self.tuned, self.tuned.new_zeros(fresh)])

    def imprinted(self) -> Tensor:
        """Each class's imprinted row: its normalised mean of normalised features (total, dim)."""
        return F.normalize(self.centroids(), dim=1)

    def class_weights(self) -> Tensor:
        """The trained row of a class an update has trained, else its imprinted row."""
        return torch.where(self.tuned[:, None], self.weight, self.imprinted())

    def class_scores(self, features: Tensor) -> Tensor:
        return self.scale * F.normalize(features, dim=1) @ F.normalize(self.class_weights(), dim=1).t()

    def update(self, fit: FitFn, recipe: FitRecipe, meter: Meter) -> None:
        if len(self.seen_y) < self.params.switch_after:
            return  # still NCM: the rows follow the class means, nothing trains
        with torch.no_grad():  # untrained rows start from their imprint
            self.weight.data = self.class_weights().clone()
        self.tuned[:] = True

        def loss(f: Tensor, y: Tensor) -> Tensor:
            return F.cross_entropy(self.class_scores(f), y)

        self.train_head(fit, recipe, meter, [self.weight, self.scale], loss)

    def parameter_counts(self) -> tuple[int, int]:
        """The backbone, the cosine classifier and its scale (the unused linear head is not counted)."""
        backbone = sum(p.numel() for p in self.backbone.parameters())
        trained = self.weight.numel() + 1
        return backbone + trained, trained
