"""iCaRL-CNN in the IIRC setting (Abdelsalam et al., CVPR 2021, section 5 and appendix B).

iCaRL (Rebuffi et al., CVPR 2017) with its rehearsal of herded exemplars and its distillation of the old
network's outputs, adapted to multi-label tasks as the paper does: BCE to the labels on the new labels plus
BCE to the old network's sigmoid outputs on the old labels (the reference code replaces the old labels'
targets by those outputs, for task and memory samples alike), averaged over the seen labels. The number of
labels of a sample varies, so the nearest-mean-of-exemplars classifier does not apply: it predicts with the
trained network's head (sigmoid >= 0.5). The memory keeps stale labels, herded per label."""
from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from gtep.algorithms.base import ALGORITHMS, NON_NEGATIVE, POSITIVE, CommonParams
from gtep.algorithms.iirc.base import MultiLabelLearner


@dataclass(frozen=True)
class IIRCICaRLParams(CommonParams):
    T: float = 1.0  # distillation temperature on the old labels' logits and targets (1: the reference code)
    lambda_aux: float = 1.0  # weight of the distillation part against the new labels' BCE (1: the reference)
    ranges = {"T": POSITIVE, "lambda_aux": NON_NEGATIVE}


@ALGORITHMS.register("iirc_icarl_cnn")
class IIRCICaRLCNN(MultiLabelLearner[IIRCICaRLParams]):
    """iCaRL-CNN: distilled BCE, herded stale-label memory, the network's head at inference."""

    distills = True
    memory_selection = "herding"

    def loss(self, x: Tensor, y: Tensor) -> Tensor:
        return self.distilled_bce(x, y, self.params.T, self.params.lambda_aux)
