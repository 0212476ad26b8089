"""NCM on frozen features, FLUID's simplest and one of its strongest baselines (papers/fluid.txt Sec. 4;
notes 004.3): m_i = mean feature of class i (the paper omits the 1/|C_i|), P(y=i|x) = softmax_i(-d(m_i, f(x))),
updated after every sample, nothing trained. Here the features are L2-normalised (so one temperature fits any
backbone) and the logits are -d / temperature."""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from gtep.algorithms._stream import StreamLearner, StreamParams
from gtep.algorithms.base import ALGORITHMS


@dataclass(frozen=True)
class NCMParams(StreamParams):
    temperature: float = 0.1  # softmax(-d / temperature): shapes the softmax detector, not the argmax


@ALGORITHMS.register("fluid_ncm")
class FluidNCM(StreamLearner[NCMParams]):
    """Nearest class mean on the pretrained backbone's normalised features; the centroids are the class means."""

    def class_scores(self, features: Tensor) -> Tensor:
        distances = torch.cdist(F.normalize(features, dim=1), F.normalize(self.centroids(), dim=1))
        return -distances / self.params.temperature
