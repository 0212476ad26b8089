"""What several learner tests check or build the same way: the comparison with fine-tuning, and tiny random tasks
for driving one learner by hand."""
from typing import Any

import torch

from gtep.algorithms import ALGORITHMS, FitRecipe, IncrementalLearner, TaskData
from gtep.engine import OrderingOutcome
from gtep.engine.loop import Trainer

CPU = torch.device("cpu")


def assert_keeps_more_old_classes(out: OrderingOutcome, finetune: OrderingOutcome,
                                  first_task: float | None = 0.6) -> None:
    """The learner finished, learnt the first task (above `first_task`; chance is 0.25; None: not checked), and
    beats fine-tuning with no memory by 0.3 on the old classes and on the final accuracy."""
    assert out.status == "finished"
    if first_task is not None:
        assert out.metrics["acc_t"][0] > first_task
    assert out.metrics["old_acc"] > finetune.metrics["old_acc"] + 0.3
    assert out.metrics["acc"] > finetune.metrics["acc"]


def tiny_task(index: int, known: int, total: int, per_class: int = 6) -> TaskData:
    """Classes known..total-1, `per_class` random 32x32 images each (seeded by the task's index), one epoch of
    constant-rate SGD: enough to run every stage of a learner, not to learn."""
    g = torch.Generator().manual_seed(index)
    y = torch.arange(known, total).repeat_interleave(per_class)
    recipe = FitRecipe(epochs=1, lr=0.01, batch_size=8, weight_decay=5e-4, scheduler="constant",
                       milestones=(), lr_decay=0.1)
    return TaskData(index, known, total, torch.randn(len(y), 3, 32, 32, generator=g), y, recipe)


def tiny_learner(algorithm: str, *, augment: bool = False, **params: Any) -> tuple[IncrementalLearner, Trainer]:
    """`algorithm` with `params` on a ResNet-8 with room for 8 exemplars, and the engine's trainer (seed 0) to
    drive it through tiny_task's tasks."""
    learner_class = ALGORITHMS.get(algorithm)
    return learner_class(learner_class.Params(**params), "resnet8", 8, CPU), Trainer(CPU, seed=0, augment=augment)
