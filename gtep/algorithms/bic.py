"""BiC (Wu et al., "Large Scale Incremental Learning", CVPR 2019): distillation plus bias correction.

Stage 1 trains the whole network on new data and exemplars with cross-entropy and distillation of the old
model's logits (paper eq. 3): loss = lambda * KD + (1 - lambda) * CE with lambda = n_old / n_total.
As in the GTEP reference code, a positive `lambda_kd` replaces that adaptive rule by CE + lambda_kd * KD.
Stage 2 corrects the bias towards new classes with a two-parameter layer on the new-class logits only
(paper eq. 4: alpha * o + beta), trained with cross-entropy on a small validation split held out from
stage 1, backbone and head frozen. Every task's layer stays applied afterwards, in training, in the old
model used for distillation, and at inference (PyCIL's IncrementalNetWithBias).

The validation split follows PyCIL: every class, old and new, gives the same number of held-out samples,
int(split_ratio * memory_size / n_old), i.e. split_ratio of an old class's exemplars, so the split is
balanced as the paper requires.

Deliberate differences from PyCIL, both in favour of the paper: stage 2 minimises the cross-entropy of
the corrected logits (PyCIL applies softmax before `F.cross_entropy`, a double softmax), and the frozen
network runs in eval mode, so its logits are computed once and stage 2 fits the two parameters on them
(PyCIL re-runs the network in train mode, which keeps updating BatchNorm statistics, on augmented views).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gtep.algorithms.base import (
    ALGORITHMS,
    NON_NEGATIVE,
    POSITIVE,
    CommonParams,
    FitFn,
    FitRecipe,
    IncrementalLearner,
    Range,
    TaskData,
)
from gtep.models import Backbone, IncrementalNet


@dataclass(frozen=True)
class BiCParams(CommonParams):
    T: float = 2.0  # distillation temperature
    lambda_kd: float = 0.0  # weight of the distillation term; 0 selects the paper's adaptive n_old / n_total
    split_ratio: float = 0.1  # held-out validation share, relative to an old class's exemplar count
    # Bias-correction epochs: PyCIL's 170, not tuned. 0 reuses the stage-1 epochs and schedule, which is what
    # the GTEP reference code does (it runs stage 2 for the sampled `epochs`).
    bias_epochs: int = 170
    # "eval": stage 2 as described above. "pycil": as PyCIL runs it (the network in train mode on augmented
    # views of the split, BatchNorm statistics following them, softmax before the cross-entropy). An ablation.
    bias_stage: Literal["eval", "pycil"] = "eval"
    ranges = {"T": POSITIVE, "lambda_kd": NON_NEGATIVE, "bias_epochs": NON_NEGATIVE,
              "split_ratio": Range(0, 1, low_open=True, high_open=True)}  # 1 would hold out every exemplar


class BiasLayer(nn.Module):
    """alpha * logits + beta on one task's classes (paper eq. 4); starts as the identity (1, 0)."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self.size = size
        self.alpha = nn.Parameter(torch.ones(1))
        self.beta = nn.Parameter(torch.zeros(1))


class BiasCorrectedNet(IncrementalNet):
    """IncrementalNet whose logits go through one BiasLayer per task, each on that task's class range."""

    def __init__(self, backbone: Backbone) -> None:
        super().__init__(backbone)
        self.bias_layers = nn.ModuleList()

    def expand(self, total_classes: int) -> None:
        if total_classes > self.head.out_dim:
            self.bias_layers.append(BiasLayer(total_classes - self.head.out_dim).to(self.head.weight.device))
        super().expand(total_classes)

    def correct(self, logits: Tensor) -> Tensor:
        """Apply every task's (alpha, beta) to its classes at once: tasks are contiguous label ranges."""
        if not len(self.bias_layers):
            return logits
        layers = self.layers()
        scale = torch.cat([layer.alpha.expand(layer.size) for layer in layers])
        shift = torch.cat([layer.beta.expand(layer.size) for layer in layers])
        return logits * scale + shift

    def layers(self) -> list[BiasLayer]:
        """The bias layers, one per task, oldest first."""
        return [cast(BiasLayer, layer) for layer in self.bias_layers]

    def forward(self, x: Tensor) -> dict[str, Tensor | list[Tensor]]:
        out = self.backbone(x)
        out["raw_logits"] = self.head(out["features"])
        out["logits"] = self.correct(out["raw_logits"])
        return out


def holdout_mask(y: Tensor, per_class: int) -> Tensor:
    """True for `per_class` randomly chosen samples of every class (all of a class that has fewer)."""
    order = torch.randperm(len(y), device=y.device)
    order = order[torch.argsort(y[order], stable=True)]  # grouped by class, random within a class
    sorted_y = y[order]
    counts = torch.bincount(sorted_y)
    starts = torch.cumsum(counts, 0) - counts
    rank = torch.arange(len(y), device=y.device) - starts[sorted_y]
    mask = torch.zeros(len(y), dtype=torch.bool, device=y.device)
    mask[order] = rank < per_class
    return mask


@ALGORITHMS.register("bic")
class BiC(IncrementalLearner[BiCParams]):
    distills = True
    fuses_orderings = True
    net: BiasCorrectedNet

    def build_network(self) -> nn.Module:
        return BiasCorrectedNet(self.new_backbone())

    def fit_task(self, task: TaskData, fit: FitFn) -> None:
        x, y = self.training_data(task)
        if task.known == 0:  # nothing old to be biased against: plain training, the layer stays (1, 0)
            fit(self.trainable_parameters(), self.loss, x, y, task.recipe, modules=[self.net])
            return
        # Both stages here, before the memory update: the split holds out old exemplars of the memory
        # the task was trained with.
        held_out = holdout_mask(y, self.validation_per_class(task))
        fit(self.trainable_parameters(), self.loss, x[~held_out], y[~held_out], task.recipe, modules=[self.net])
        self.correct_bias(task, fit, x[held_out], y[held_out])

    def trainable_parameters(self) -> list[nn.Parameter]:
        """Stage 1 trains everything but the bias layers (PyCIL gives them lr 0), which stay as corrected."""
        bias = {id(p) for p in self.net.bias_layers.parameters()}
        return [p for p in self.net.parameters() if id(p) not in bias]

    def validation_per_class(self, task: TaskData) -> int:
        # PyCIL: int(split_ratio * memory_size / known); at least one so that stage 2 always has data
        return max(1, int(self.params.split_ratio * self.memory.size / task.known))

    def loss(self, x: Tensor, y: Tensor) -> Tensor:
        return self.distilled_cross_entropy(x, y, self.params.T, self.params.lambda_kd)

    def correct_bias(self, task: TaskData, fit: FitFn, x_val: Tensor, y_val: Tensor) -> None:
        """Stage 2: fit this task's (alpha, beta) on the held-out split with everything else frozen."""
        if self.params.bias_stage == "pycil":
            self.correct_bias_as_pycil(task, fit, x_val, y_val)
            return
        self.net.eval()
        with torch.no_grad():
            raw = self.batched(lambda xb: self.net(xb)["raw_logits"])(x_val)
        layer = self.net.bias_layers[-1]
        loss = lambda z, y: F.cross_entropy(self.net.correct(z), y)  # noqa: E731
        # the inputs are logits, not images: no augmentation, and no module to put in train mode
        fit(layer.parameters(), loss, raw, y_val, self.bias_recipe(task), augment=False)

    def correct_bias_as_pycil(self, task: TaskData, fit: FitFn, x_val: Tensor, y_val: Tensor) -> None:
        """PyCIL's stage 2: every batch through the network in train mode (augmented; BatchNorm statistics move),
        cross-entropy of the softmax of the corrected logits. Only the layer trains."""
        layer = self.net.bias_layers[-1]
        others = [p for p in self.net.parameters() if p.requires_grad and all(p is not q for q in layer.parameters())]
        for p in others:
            p.requires_grad_(False)
        loss = lambda xb, yb: F.cross_entropy(F.softmax(self.net(xb)["logits"], dim=1), yb)  # noqa: E731
        try:
            fit(layer.parameters(), loss, x_val, y_val, self.bias_recipe(task), modules=[self.net])
        finally:
            for p in others:
                p.requires_grad_(True)

    def bias_recipe(self, task: TaskData) -> FitRecipe:
        """Stage 1's optimiser settings (as PyCIL) over bias_epochs, milestones stretched to keep their
        place in the schedule (identical to PyCIL's when both stages run 170 epochs)."""
        recipe = task.recipe
        if self.params.bias_epochs <= 0:
            return recipe
        epochs = task.scaled_epochs(self.params.bias_epochs)
        stretch = epochs / max(recipe.epochs, 1)
        milestones = tuple(sorted({max(1, round(m * stretch)) for m in recipe.milestones}))
        return recipe.replace(epochs=epochs, milestones=milestones)

    def bias_parameters(self) -> list[tuple[float, float]]:
        """(alpha, beta) of every task, for logs and tests."""
        return [(layer.alpha.item(), layer.beta.item()) for layer in self.net.layers()]
