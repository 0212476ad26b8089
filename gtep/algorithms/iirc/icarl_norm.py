"""iCaRL-norm in the IIRC setting (Abdelsalam et al., CVPR 2021, eq. 3): iCaRL-CNN with a cosine-normalised
last layer, p_i(x) = sigmoid(eta * <theta_i / |theta_i|, f(x) / |f(x)|>), eta learnt (the paper found
learning it better than fixing it; the reference code starts it at 1). As iCaRL-CNN: distilled BCE, herded
stale-label memory, no nearest-mean classifier (a varying number of labels)."""
from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from gtep.algorithms.base import ALGORITHMS, POSITIVE
from gtep.algorithms.iirc.base import CosineHead, MultiLabelNet
from gtep.algorithms.iirc.icarl_cnn import IIRCICaRLCNN, IIRCICaRLParams


@dataclass(frozen=True)
class IIRCICaRLNormParams(IIRCICaRLParams):
    eta_init: float = 1.0  # the cosine head's learnable scale at the start (the reference code's sigma = 1)
    ranges = {"eta_init": POSITIVE}


@ALGORITHMS.register("iirc_icarl_norm")
class IIRCICaRLNorm(IIRCICaRLCNN):
    """iCaRL-norm: iCaRL-CNN with a cosine head and a learnt scale eta."""

    Params = IIRCICaRLNormParams
    params: IIRCICaRLNormParams
    first_task_hparams = ("eta_init",)

    def build_network(self) -> nn.Module:
        backbone = self.new_backbone()
        return MultiLabelNet(backbone, CosineHead(backbone.out_dim, self.params.eta_init))
