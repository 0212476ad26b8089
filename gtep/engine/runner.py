"""Run one class ordering of one phase with one hyperparameter set: GTEP's TrainCL (Algorithms 2-3).

The first task trains with the fixed recipe of the paper's Table 3; sampled hyperparameters apply from
task 2 on (appendix A.1). After every task the model is tested on the test images of all classes seen so
far, filling one row of the accuracy matrix. A non-finite loss ends the ordering as diverged.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from gtep.algorithms import ALGORITHMS, CommonParams, FitRecipe, IncrementalLearner, TaskData
from gtep.data import ImageSet
from gtep.engine.checkpoint import TaskCheckpoint, fingerprint, load_checkpoint, restore_rng, rng_state, save_checkpoint
from gtep.engine.device import resolve_device
from gtep.engine.loop import DivergedError, Trainer
from gtep.protocol import metrics
from gtep.protocol.sampling import steplr_milestones
from gtep.protocol.scenarios import build_scenario, ordering_seed


@dataclass(frozen=True)
class FirstTaskSpec:
    """The paper's Table 3. scheduler 'sampled' lets the set's scheduler reach task 1, as the reference code does."""

    epochs: int = 200
    lr: float = 0.1
    milestones: tuple[int, ...] = (60, 120, 170)
    lr_decay: float = 0.1
    weight_decay: float = 5e-4
    batch_size: int = 128
    scheduler: str = "sampled"


@dataclass(frozen=True)
class OrderingJob:
    algorithm: str
    hparams: dict[str, Any]
    backbone: str
    increments: tuple[int, ...]
    classes: tuple[int, ...]  # the phase's class ids in its dataset
    seed: int
    ordering: int
    memory_size: int = 1000
    first_task: FirstTaskSpec = FirstTaskSpec()
    epoch_scale: float = 1.0
    augment: bool = True
    device: str = "auto"
    weights: str | None = None  # a local pretrained-weights file for ViT backbones


@dataclass
class OrderingOutcome:
    ordering: int
    status: str  # "finished" | "diverged"
    class_order: list[int]
    acc_matrix: list[list[float]] = field(default_factory=list)
    test_counts: list[int] = field(default_factory=list)
    metrics: dict[str, Any] = field(default_factory=dict)
    params_total: int = 0
    params_trainable: int = 0
    train_seconds: float = 0.0
    task_seconds: list[float] = field(default_factory=list)
    message: str = ""
    resumed_tasks: int = 0  # tasks restored from a checkpoint instead of trained in this process

    @property
    def diverged(self) -> bool:
        return self.status == "diverged"


def _scaled(epochs: int, scale: float) -> int:
    return max(1, round(epochs * scale))


def task_recipe(index: int, params: CommonParams, first: FirstTaskSpec, scale: float,
                fixed_first_task: bool = True) -> FitRecipe:
    """Task 1 uses Table 3 (ResNet methods); later tasks the sampled set, with milestones from the paper's rule."""
    if index == 0 and fixed_first_task:
        epochs = _scaled(first.epochs, scale)
        scheduler = params.scheduler if first.scheduler == "sampled" else first.scheduler
        milestones = tuple(sorted({max(1, round(m * scale)) for m in first.milestones}))
        return FitRecipe(epochs, first.lr, first.batch_size, first.weight_decay, scheduler, milestones,
                         first.lr_decay, params.optimizer, params.momentum)
    epochs = _scaled(params.epochs, scale)
    if params.milestones is not None:
        milestones = tuple(sorted({max(1, round(m * scale)) for m in params.milestones}))
    else:
        milestones = tuple(steplr_milestones(epochs, params.milestone_num))
    return FitRecipe(epochs, params.lr, params.batch_size, params.weight_decay, params.scheduler, milestones,
                     params.lr_decay, params.optimizer, params.momentum)


def to_tensor(images: np.ndarray, mean: torch.Tensor, std: torch.Tensor, device: torch.device) -> torch.Tensor:
    x = torch.from_numpy(images).to(device).permute(0, 3, 1, 2).float().div_(255)
    return ((x - mean.view(1, 3, 1, 1)) / std.view(1, 3, 1, 1)).contiguous()


@torch.no_grad()
def evaluate(learner: IncrementalLearner, x: torch.Tensor, y: torch.Tensor, task_of_label: torch.Tensor,
             tasks_seen: int, batch: int = 512) -> list[float]:
    """Accuracy on each seen task's test images (one row of the accuracy matrix)."""
    learner.net.eval()
    preds = torch.cat([learner.predict(x[i : i + batch]).argmax(1) for i in range(0, len(x), batch)])
    correct = (preds == y).float()
    task = task_of_label[y]
    sums = torch.zeros(tasks_seen, device=x.device).index_add_(0, task, correct)
    counts = torch.zeros(tasks_seen, device=x.device).index_add_(0, task, torch.ones_like(correct))
    return (sums / counts.clamp(min=1)).tolist()


def run_ordering(job: OrderingJob, data: ImageSet,
                 on_task_end: Callable[[int, OrderingOutcome], None] | None = None,
                 checkpoint: Path | None = None) -> OrderingOutcome:
    """Train one ordering task by task; never raises for a diverged run.

    With `checkpoint`, the learner and RNG states are saved there after every finished task, and a run
    that finds a checkpoint of the same job continues after its last task with the same result."""
    device = resolve_device(job.device)
    run_seed = ordering_seed(job.seed, job.ordering)
    torch.manual_seed(run_seed)  # the same initial model for every set on this ordering
    tasks = build_scenario(job.classes, job.increments, job.seed, job.ordering)
    order = list(tasks[-1].seen_classes)
    outcome = OrderingOutcome(job.ordering, "finished", order)

    algorithm = ALGORITHMS.get(job.algorithm)
    params = algorithm.Params.from_mapping(job.hparams)
    trainer = Trainer(device, run_seed, job.augment)
    job_key = fingerprint(job)
    saved = load_checkpoint(checkpoint, job_key, device) if checkpoint is not None else None
    if saved is not None:
        learner = saved.learner
        restore_rng(saved.rng, trainer.generator)
        outcome.acc_matrix, outcome.test_counts = saved.acc_matrix, saved.test_counts
        outcome.task_seconds, outcome.resumed_tasks = saved.task_seconds, saved.tasks_done
    else:
        learner = algorithm(params, job.backbone, job.memory_size, device, job.weights)

    train_pixels = data.x_train[np.isin(data.y_train, order)].reshape(-1, 3).astype(np.float32) / 255
    mean = torch.tensor(train_pixels.mean(0), device=device)
    std = torch.tensor(train_pixels.std(0) + 1e-6, device=device)
    label_map = np.full(int(max(data.y_train.max(), data.y_test.max())) + 1, -1, dtype=np.int64)
    label_map[order] = np.arange(len(order))
    task_of_label = torch.tensor([t.index for t in tasks for _ in t.new_classes], device=device)

    for task in tasks[outcome.resumed_tasks:]:
        tic = time.perf_counter()
        train_mask = np.isin(data.y_train, task.new_classes)
        test_mask = np.isin(data.y_test, task.seen_classes)
        task_data = TaskData(
            index=task.index, known=len(task.old_classes), total=len(task.seen_classes),
            x=to_tensor(data.x_train[train_mask], mean, std, device),
            y=torch.from_numpy(label_map[data.y_train[train_mask]]).to(device),
            recipe=task_recipe(task.index, params, job.first_task, job.epoch_scale, algorithm.fixed_first_task),
            epoch_scale=job.epoch_scale,
        )
        try:
            learner.begin_task(task_data)
            learner.learn_task(task_data, trainer.fit)
            learner.end_task(task_data)
        except DivergedError as err:
            outcome.status, outcome.message = "diverged", f"task {task.index + 1}: {err}"
            break
        x_test = to_tensor(data.x_test[test_mask], mean, std, device)
        y_test = torch.from_numpy(label_map[data.y_test[test_mask]]).to(device)
        row = evaluate(learner, x_test, y_test, task_of_label, task.index + 1)
        outcome.acc_matrix.append(row + [float("nan")] * (len(tasks) - len(row)))
        outcome.test_counts.append(int(np.isin(data.y_test, task.new_classes).sum()))
        outcome.task_seconds.append(time.perf_counter() - tic)
        if checkpoint is not None and task.index + 1 < len(tasks):
            save_checkpoint(checkpoint, TaskCheckpoint(job_key, task.index + 1, learner, rng_state(trainer.generator),
                                                       outcome.acc_matrix, outcome.test_counts, outcome.task_seconds))
        if on_task_end is not None:
            on_task_end(task.index, outcome)
    outcome.train_seconds = float(sum(outcome.task_seconds))
    outcome.params_total, outcome.params_trainable = learner.parameter_counts()
    if outcome.acc_matrix and not outcome.diverged:
        outcome.metrics = metrics.summarize(np.array(outcome.acc_matrix), outcome.test_counts)
    return outcome
