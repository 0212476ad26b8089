"""Learning without Forgetting in FLUID (Li & Hoiem, TPAMI 2017; papers/fluid.txt Sec. 4, App. C; notes 004.3):
standard training on the fine-tune schedule (every `update_every` samples, `epochs` over all seen data; every
layer, lr 0.01, as the paper's LwF "freely trains its features") with a distillation term that keeps the outputs
of a frozen old model: loss = CE over the seen classes + kd_weight * KD(T) over the classes the old model knew,
KD the cross-entropy between the old and new softmax at temperature T (2, the paper's, after Li & Hoiem; base.py's
distillation_loss). Only the classes seen in the stream enter the softmax, as in the paper.

The old model: the paper freezes the network after pretraining, whose 1,000-way head scores the stream's pretrain
classes. gtep's pretrained weights hold the backbone without its head, and a learner knows the stream's classes by
position only, so here the old model is the network frozen at the end of the previous update (backbone and head
over the classes it knew): LwF's task-by-task recipe, one update playing one task. The first update has no old
model and trains with cross-entropy alone. The old model's forward passes are counted with the update's (the
paper's LwF GMACs are twice standard training's)."""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gtep.algorithms.base import ALGORITHMS, NON_NEGATIVE, POSITIVE, FitFn, FitRecipe, distillation_loss, freeze
from gtep.algorithms.fluid.base import Meter
from gtep.algorithms.fluid.finetune import FinetuneParams, FluidFinetune


@dataclass(frozen=True)
class LwFParams(FinetuneParams):
    lr: float = 0.01  # standard training's (the paper's LwF trains every layer)
    depth: int = -1  # every block; 0 trains the head alone on cached features (then only the head is distilled)
    temperature: float = 2.0
    kd_weight: float = 1.0  # Li & Hoiem's lambda_o
    ranges = {"temperature": POSITIVE, "kd_weight": NON_NEGATIVE}


@ALGORITHMS.register("fluid_lwf")
class FluidLwF(FluidFinetune[LwFParams]):
    """Fine-tuning (all layers by default) distilled towards the network of the previous update."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.old_net: nn.Module | None = None
        self.old_total = 0  # classes the old model scores

    def logits(self, net: nn.Module, inputs: Tensor) -> Tensor:
        """`net`'s class scores of cached features (depth 0) or of images."""
        if self.caches_features:
            return cast(Tensor, cast(Any, net).head(inputs))
        return cast(Tensor, net(inputs)["logits"])

    def loss(self, inputs: Tensor, y: Tensor) -> Tensor:
        logits = self.logits(self.net, inputs)
        ce = F.cross_entropy(logits[:, : self.total], y)
        if self.old_net is None or self.params.kd_weight == 0:
            return ce
        with torch.no_grad():
            old = self.logits(self.old_net, inputs)[:, : self.old_total]
        kd = distillation_loss(logits[:, : self.old_total], old, self.params.temperature)
        return ce + self.params.kd_weight * kd

    def update(self, fit: FitFn, recipe: FitRecipe, meter: Meter) -> None:
        if self.caches_features:
            self.train_head(fit, recipe, meter, list(self.head.parameters()), self.loss)
        else:
            old = self.old_net

            def forward(x: Tensor) -> Any:  # the old model's pass is part of every step's cost
                return (self.net(x), old(x)) if old is not None else self.net(x)

            self.train_network(fit, recipe, meter, [*self.tuned, self.head], self.loss, forward)
        self.old_net = freeze(copy.deepcopy(self.net).eval())
        self.old_total = self.total
