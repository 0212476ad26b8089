"""A learner that learns nothing: it predicts at chance and costs next to nothing, so a study of it
measures gtep's orchestration (Ray Tune, the MLflow writer, the journal, the manifest), not training.

It is registered as "noop" from outside the package, through the plugin mechanism of gtep.algorithms:

    GTEP_PLUGINS=noop_learner PYTHONPATH=benchmarks gtep tune --config exp.yaml   # algorithm: noop

benchmarks/controller_overhead.py sets both variables before Ray starts, so Ray's workers import it too.
Its search space is written by that benchmark (any CommonParams value sets will do).
"""
from __future__ import annotations

import torch
from torch import Tensor, nn

from gtep.algorithms import ALGORITHMS, CommonParams, IncrementalLearner, TaskData


class ChanceNet(nn.Module):
    """No parameters; `expand` only counts the classes, so checkpoints stay a few hundred bytes."""

    def __init__(self) -> None:
        super().__init__()
        self.classes = 0

    def expand(self, total: int) -> None:
        self.classes = max(self.classes, total)

    def forward(self, x: Tensor) -> dict[str, Tensor]:
        return {"logits": torch.rand(len(x), max(self.classes, 1), device=x.device),
                "features": torch.zeros(len(x), 1, device=x.device)}


@ALGORITHMS.register("noop")
class NoOp(IncrementalLearner[CommonParams]):
    """No training, no memory, uniform random scores: accuracy at chance level."""

    uses_memory = False  # so nothing happens after a task either
    fixed_first_task = False  # nothing to share: keeps the study's first-task store out of the measurement

    def build_network(self) -> nn.Module:
        return ChanceNet()

    def fit_task(self, task: TaskData, fit) -> None:
        pass
