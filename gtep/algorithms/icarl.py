"""iCaRL (Rebuffi et al., CVPR 2017): rehearsal with herded exemplars, distillation of the old model's
outputs, and a nearest-mean-of-exemplars classifier. Distillation as PyCIL runs it: a temperature-softened
KD term on the old classes, weighted by lambda_aux (the GTEP paper's Table 4)."""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from gtep.algorithms._distances import euclidean
from gtep.algorithms.base import (
    ALGORITHMS,
    NON_NEGATIVE,
    POSITIVE,
    CommonParams,
    FitFn,
    IncrementalLearner,
    TaskData,
    distillation_loss,
)


@dataclass(frozen=True)
class ICaRLParams(CommonParams):
    T: float = 2.0  # distillation temperature
    lambda_aux: float = 1.0  # weight of the distillation term
    ranges = {"T": POSITIVE, "lambda_aux": NON_NEGATIVE}


@ALGORITHMS.register("icarl")
class ICaRL(IncrementalLearner[ICaRLParams]):
    distills = True
    fuses_orderings = True

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.class_means: Tensor | None = None

    def loss(self, x: Tensor, y: Tensor) -> Tensor:
        logits = self.net(x)["logits"]
        loss = F.cross_entropy(logits, y)
        if self.old_net is not None:
            with torch.no_grad():
                old_logits = self.old_net(x)["logits"]
            kd = distillation_loss(logits[:, : self.known], old_logits[:, : self.known], self.params.T)
            loss = loss + self.params.lambda_aux * kd
        return loss

    def consolidate(self, task: TaskData, fit: FitFn) -> None:
        """The nearest-mean classifier's prototypes, from the memory just updated."""
        self.net.eval()
        means = self.memory.class_means(self.batched(self.features))
        self.class_means = torch.stack([means[c] for c in range(task.total)]) if len(means) == task.total else None

    @torch.no_grad()
    def predict(self, x: Tensor) -> Tensor:
        """Nearest mean of exemplars: negative distance of normalised features to each class mean."""
        if self.class_means is None:  # no memory to build means from: fall back to the network's head
            return super().predict(x)
        feats = F.normalize(self.features(x).float(), dim=1)
        return -euclidean(feats, self.class_means)  # a matmul: MAC counters see it (torch.cdist's they do not)
