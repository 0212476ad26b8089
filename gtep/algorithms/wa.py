"""WA (Zhao et al., "Maintaining Discrimination and Fairness in Class Incremental Learning", CVPR 2020).

Training keeps discrimination among old classes by distilling the old model's logits (PyCIL's loss:
(1 - lambda) * CE + lambda * KD with lambda = n_old / n_total; as in the GTEP reference code, a positive
`lambda_kd` replaces that adaptive rule by CE + lambda_kd * KD). After each incremental task, Weight
Aligning restores fairness between old and new classes: the new classes' head weight vectors are rescaled
by gamma = mean(||w_old||) / mean(||w_new||) (paper eq. 6-8), which removes the bias towards new classes
that the imbalanced training data puts into their norms. Biases of the head are left as they are (PyCIL).

The paper also clips the head weights to be non-negative during training; PyCIL does not, nor do we.
"""
from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from gtep.algorithms.base import ALGORITHMS, NON_NEGATIVE, POSITIVE, CommonParams, FitFn, IncrementalLearner, TaskData
from gtep.models.heads import IncrementalNet, align_weights


@dataclass(frozen=True)
class WAParams(CommonParams):
    T: float = 2.0  # distillation temperature
    lambda_kd: float = 0.0  # weight of the distillation term; 0 selects the adaptive n_old / n_total
    ranges = {"T": POSITIVE, "lambda_kd": NON_NEGATIVE}


@ALGORITHMS.register("wa")
class WA(IncrementalLearner[WAParams]):
    distills = True
    fuses_orderings = True
    net: IncrementalNet

    def loss(self, x: Tensor, y: Tensor) -> Tensor:
        return self.distilled_cross_entropy(x, y, self.params.T, self.params.lambda_kd)

    def consolidate(self, task: TaskData, fit: FitFn) -> None:
        # After the memory update, which herds on features only, so aligning the head first or last is alike.
        if task.known > 0:  # the first task has no old classes to align to
            align_weights(self.net.head, task.known)
