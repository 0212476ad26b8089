"""Prototypical Networks in FLUID (Snell, Swersky & Zemel, NeurIPS 2017; papers/fluid.txt Sec. 4-5, App. C/G; notes
004.3), the paper's few-shot representative: a backbone meta-trained episodically on the pretrain classes (the
`pretrain:` section's `method: protonet`, on gtep/algorithms/_episodic.py: 30-way 5-shot episodes, the paper's),
then, on the stream, a nearest-prototype classifier with ProtoNet's own metric: p(y=i|x) = softmax_i(-||f(x) -
mu_i||^2), mu_i the mean raw feature of class i's samples so far, updated after every sample ("instance-based", as
the paper runs PTN), nothing trained on the stream. It differs from fluid_ncm in the backbone's training (episodic,
not cross-entropy) and in the metric (squared Euclidean on unnormalised features, the one ProtoNets train with, not
the Euclidean distance of normalised features).

The meta-training is part of what the learner requires: on a supervised backbone it would be NCM with ProtoNet's
metric under another name, so the pre-flight pass refuses a study whose `pretrain:` section (or, without one,
whose weights' metadata) does not say `method: protonet`."""
from __future__ import annotations

from torch import Tensor

from gtep.algorithms._distances import euclidean
from gtep.algorithms.base import ALGORITHMS
from gtep.algorithms.fluid.base import StreamLearner, StreamParams


@ALGORITHMS.register("fluid_protonet")
class FluidProtoNet(StreamLearner[StreamParams]):
    """Nearest prototype (squared Euclidean, raw features) on a meta-trained backbone."""

    required_pretrain_method = "protonet"

    def class_scores(self, features: Tensor) -> Tensor:
        return -euclidean(features, self.class_means()).pow(2)

    def parameter_counts(self) -> tuple[int, int]:
        """The backbone only: nothing trains on the stream (the prototypes are statistics)."""
        return sum(p.numel() for p in self.backbone.parameters()), 0
