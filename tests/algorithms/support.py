"""What several learner tests check or build the same way: the comparison with fine-tuning, and tiny random tasks
for driving one learner by hand."""
from typing import Any

import torch
from torch.nn import Module

from gtep.algorithms import ALGORITHMS, FitRecipe, IncrementalLearner, TaskData
from gtep.algorithms.base import FitFn
from gtep.engine import OrderingOutcome
from gtep.engine.loop import Trainer
from tests.helpers import snapshot, unchanged

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


def begin_second_task_beside_a_frozen_copy(learner: IncrementalLearner, fit: FitFn) -> tuple[TaskData, Module, Module]:
    """An expansion method (BEEF, FOSTER) through tiny_task's first task and into the second's begin_task, checked to
    have added a trainable backbone that starts as a copy of the first, now frozen; the second task, the old and
    the new backbone."""
    first = tiny_task(0, 0, 2)
    learner.begin_task(first), learner.learn_task(first, fit), learner.end_task(first, fit)
    second = tiny_task(1, 2, 4)
    learner.begin_task(second)
    old, new = learner.net.stack.backbones
    assert not any(p.requires_grad for p in old.parameters())
    assert all(p.requires_grad for p in new.parameters())
    assert unchanged(new, snapshot(old))  # the new backbone starts as a copy of the old one
    return second, old, new
