"""NCM on frozen features, FLUID's simplest and one of its strongest baselines (papers/fluid.txt Sec. 4;
notes 004.3): m_i = mean feature of class i (the paper omits the 1/|C_i|), P(y=i|x) = softmax_i(-d(m_i, f(x))),
updated after every sample, nothing trained. Here the features are L2-normalised (so one temperature fits any
backbone) and the logits are -d / temperature."""
from __future__ import annotations

from dataclasses import dataclass

import torch.nn.functional as F
from torch import Tensor

from gtep.algorithms._distances import euclidean
from gtep.algorithms.base import ALGORITHMS, POSITIVE
from gtep.algorithms.fluid.base import StreamLearner, StreamParams


@dataclass(frozen=True)
class NCMParams(StreamParams):
    temperature: float = 0.1  # softmax(-d / temperature): shapes the softmax detector, not the argmax
    ranges = {"temperature": POSITIVE}


@ALGORITHMS.register("fluid_ncm")
class FluidNCM(StreamLearner[NCMParams]):
    """Nearest class mean on the pretrained backbone's normalised features; the centroids are the class means."""

    def class_scores(self, features: Tensor) -> Tensor:
        distances = euclidean(F.normalize(features, dim=1), F.normalize(self.centroids(), dim=1))
        return -distances / self.params.temperature

    def unseen_score(self, logits: Tensor, features: Tensor) -> float:
        """MDT's minimum distance is the largest logit times -temperature: the classifier computed it already,
        so it costs nothing more (and its MACs were counted with the classifier's)."""
        if self.stream_params.detector == "mdt":
            return float(-logits.max() * self.params.temperature)
        return super().unseen_score(logits, features)
