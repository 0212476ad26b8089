"""Prototypes (nearest class mean, ProtoNet-style; Snell et al. 2017) for continual few-shot learning: the
simplest CFSL baseline of the notes (002.3). The backbone is frozen (pretrained on classes kept out of both
phases); each support set updates one prototype per label it holds, by the rule `prototype_update`:

    mean     the running mean of every support sample of the label so far (a sum and a count are kept)
    replace  the mean of the latest support set's samples of the label
    ema      (1 - ema_rate) * prototype + ema_rate * the latest support set's mean (the mean the first time)

With overwrite (O = true) a label is reused by every class block, so `mean` pools the classes that shared it
and `replace` keeps the latest block's; which fits the target set (which holds every block's classes under
the shared labels) is what tuning finds out. Scores: -squared Euclidean distance or cosine similarity, over
`temperature`. Across-task memory: the prototypes and counts (num_labels x (feature dim + 1) float32;
atm_count: num_labels vectors, the counts annotate them)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from gtep.algorithms.base import ALGORITHMS, POSITIVE, PROBABILITY, CommonParams
from gtep.algorithms.cfsl.base import FewShotLearner, label_means


@dataclass(frozen=True)
class PrototypeParams(CommonParams):
    prototype_update: Literal["mean", "replace", "ema"] = "mean"
    ema_rate: float = 0.5
    metric: Literal["euclidean", "cosine"] = "euclidean"
    temperature: float = 1.0
    ranges = {"ema_rate": PROBABILITY, "temperature": POSITIVE}


@ALGORITHMS.register("cfsl_prototypes")
class CfslPrototypes(FewShotLearner[PrototypeParams]):
    """Frozen pretrained features, one prototype per label, updated per support set (module docstring)."""

    def start_task(self, num_labels: int) -> None:
        self.prototypes = torch.zeros(num_labels, self.feature_dim, device=self.device)
        self.counts = torch.zeros(num_labels, device=self.device)

    def learn_support(self, x: Tensor, y: Tensor) -> None:
        sums, counts = label_means(self.embed(x), y, len(self.counts))
        present = counts > 0
        latest = sums[present] / counts[present, None]
        rule = self.params.prototype_update
        if rule == "mean":
            total = self.counts[present, None] * self.prototypes[present] + sums[present]
            self.prototypes[present] = total / (self.counts[present] + counts[present])[:, None]
        elif rule == "replace":
            self.prototypes[present] = latest
        else:
            seen = self.counts[present] > 0
            rate = torch.where(seen, torch.full_like(self.counts[present], self.params.ema_rate),
                               torch.ones_like(self.counts[present]))[:, None]
            self.prototypes[present] = (1 - rate) * self.prototypes[present] + rate * latest
        self.counts[present] += counts[present]

    @torch.no_grad()
    def scores(self, x: Tensor) -> Tensor:
        features = self.embed(x)
        if self.params.metric == "cosine":
            logits = F.normalize(features, dim=1) @ F.normalize(self.prototypes, dim=1).t()
        else:  # -|f - p|^2 through a matrix product (which the MAC count sees; torch.cdist's it does not)
            logits = (2 * features @ self.prototypes.t() - features.pow(2).sum(1, keepdim=True)
                      - self.prototypes.pow(2).sum(1)[None, :])
        # a label no support set has shown cannot be predicted
        logits = logits.masked_fill(self.counts[None, :] == 0, float("-inf"))
        return logits / self.params.temperature

    def task_state(self) -> list[Tensor]:
        return [self.prototypes, self.counts]
