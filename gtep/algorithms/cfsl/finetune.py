"""Fine-tuning for continual few-shot learning: a linear head over the frozen pretrained features (and, with
tune_last_block, the backbone's last stage) trained on each support set in turn with `steps` full-batch
gradient steps of cross-entropy over all of the task's labels (a fresh optimiser per support set: its moments
are not kept). It keeps nothing but its parameters, so it forgets earlier support sets as they are trained
over: the lower bound a CFSL method has to beat. Across-task memory: the head (and the tuned stage)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gtep.algorithms.base import ALGORITHMS, NON_NEGATIVE, CommonParams
from gtep.algorithms.cfsl.base import FewShotLearner, LastStage


@dataclass(frozen=True)
class FinetuneParams(CommonParams):
    steps: int = 20  # gradient steps per support set
    tune_last_block: bool = False
    ranges = {"steps": NON_NEGATIVE}  # 0: the head from the prototypes, no step


def optimiser(params: CommonParams, parameters: list[nn.Parameter]) -> torch.optim.Optimizer:
    if params.optimizer == "sgd":
        return torch.optim.SGD(parameters, lr=params.lr, momentum=params.momentum, weight_decay=params.weight_decay)
    kind = torch.optim.Adam if params.optimizer == "adam" else torch.optim.AdamW
    return kind(parameters, lr=params.lr, weight_decay=params.weight_decay)


FP = TypeVar("FP", bound=FinetuneParams)


class HeadLearner(FewShotLearner[FP]):
    """A linear head (optionally with the last stage) trained by gradient steps on each support set."""

    head: nn.Linear
    last: LastStage | None = None

    @property
    def tunes_stage(self) -> bool:
        """Whether the last stage changes at all: with no step it stays the pretrained one and stores nothing."""
        return self.params.tune_last_block and self.params.steps > 0

    def start_task(self, num_labels: int) -> None:
        if self.tunes_stage:
            if self.last is None:  # made once, so it holds the pretrained stage, not one a task tuned
                self.last = LastStage(self.net)
            self.last.restore()
        self.head = nn.Linear(self.feature_dim, num_labels).to(self.device)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def initialise_rows(self, features: Tensor, y: Tensor) -> None:
        """Before the steps on a support set; the plain fine-tuning keeps the rows as they are."""

    def learn_support(self, x: Tensor, y: Tensor) -> None:
        inputs = self.last.frozen(x) if self.last is not None else self.embed(x)
        self.initialise_rows(self.features_of(inputs).detach(), y)
        tuned = list(self.head.parameters()) + (self.last.parameters_to_tune() if self.last is not None else [])
        opt = optimiser(self.params, tuned)
        for _ in range(self.params.steps):
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(self.head(self.features_of(inputs)), y)
            if not torch.isfinite(loss):
                raise FloatingPointError(f"non-finite support-set loss ({float(loss.detach())})")
            loss.backward()
            opt.step()

    def features_of(self, inputs: Tensor) -> Tensor:
        """The head's input: the frozen features, or the tuned last stage's output on its frozen input."""
        if self.last is None:
            return inputs
        self.net.eval()  # BatchNorm keeps its pretrained statistics: a support set holds a handful of images
        return self.last.head_features(inputs)

    @torch.no_grad()
    def scores(self, x: Tensor) -> Tensor:
        inputs = self.last.frozen(x) if self.last is not None else self.embed(x)
        return self.head(self.features_of(inputs))

    def task_state(self) -> list[Tensor]:
        tuned = self.last.parameters_to_tune() if self.last is not None and self.tunes_stage else []
        return [p.detach() for p in [*self.head.parameters(), *tuned]]


@ALGORITHMS.register("cfsl_finetune")
class CfslFinetune(HeadLearner[FinetuneParams]):
    """A zero-initialised linear head (and optionally the last stage) fine-tuned on each support set."""
