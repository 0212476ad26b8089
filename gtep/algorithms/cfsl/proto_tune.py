"""Prototype-initialised fine-tuning for continual few-shot learning: before the gradient steps on a support
set, the head rows of its labels are set from their support means as a nearest-mean classifier written as a
linear layer (Snell et al. 2017, section 2.4: w = 2 mu, b = -|mu|^2, scaled by init_scale), then the head (and,
with tune_last_block, the last stage) takes `steps` gradient steps on the support set. The adaptation starts
where the prototypes are instead of at zero, so few steps go further (as Proto-MAML's initialisation, Triantafillou
et al. 2020); the rows of labels earlier support sets set stay as they were trained. Across-task memory: the
head (and the tuned stage)."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from gtep.algorithms.base import ALGORITHMS, POSITIVE
from gtep.algorithms.cfsl.base import label_means
from gtep.algorithms.cfsl.finetune import FinetuneParams, HeadLearner


@dataclass(frozen=True)
class ProtoTuneParams(FinetuneParams):
    init_scale: float = 1.0
    ranges = {"init_scale": POSITIVE}


@ALGORITHMS.register("cfsl_proto_tune")
class CfslProtoTune(HeadLearner[ProtoTuneParams]):
    """The support set's means as the head's rows of its labels, then gradient steps (module docstring)."""

    @torch.no_grad()
    def initialise_rows(self, features: Tensor, y: Tensor) -> None:
        sums, counts = label_means(features, y, self.head.out_features)
        present = counts > 0
        means = sums[present] / counts[present, None]
        scale = self.params.init_scale
        self.head.weight[present] = 2 * scale * means
        self.head.bias[present] = -scale * means.pow(2).sum(1)
