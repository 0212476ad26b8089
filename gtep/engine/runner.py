"""Run one class ordering of one phase with one hyperparameter set: GTEP's TrainCL (Algorithms 2-3).

The first task trains with the fixed recipe of the paper's Table 3; sampled hyperparameters apply from
task 2 on (appendix A.1). After every task the model is tested on the test images of all classes seen so
far, filling one row of the accuracy matrix. A non-finite loss ends the ordering as diverged.
"""
from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
import torch
from torch import Tensor

from gtep.algorithms import ALGORITHMS, CommonParams, FitRecipe, IncrementalLearner, TaskData
from gtep.algorithms.base import Scheduler, names_reaching_first_task
from gtep.data import ImageSet
from gtep.data.pipelines import Pipeline, PipelineSpec, choose_pipeline, normalisation, pretrained_normalisation
from gtep.engine.checkpoint import TaskCheckpoint, fingerprint, restore_rng, rng_state
from gtep.engine.device import describe_device, resolve_device
from gtep.engine.first_task import TRAINED, first_task_key
from gtep.engine.images import StoredImages
from gtep.engine.loop import DivergedError, FitMode, Precision, Trainer
from gtep.protocol.families import CLASS_INCREMENTAL, FAMILIES, ScenarioFamily, TaskFamily
from gtep.protocol.sampling import steplr_milestones
from gtep.protocol.scenarios import TaskSpec, few_shot_indices, ordering_seed, shots_at_phase_positions


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
    # the data pipeline (gtep.data.pipelines): true = the dataset's default, false = none, a name, or the
    # description a study records ('pycil-imagenet@224')
    augment: bool | str = True
    device: str = "auto"
    weights: str | None = None  # a local pretrained-weights file for ViT backbones
    dataset: str = ""  # the phase's dataset name: part of what a stored first task is keyed by
    mixed_precision: bool = True  # bf16 autocast + channels-last on CUDA (no effect on the CPU)
    compile: bool = False
    # the scenario family (gtep/protocol/families/) and its options (scenario.<family> of the experiment file)
    family: str = CLASS_INCREMENTAL
    family_options: tuple[tuple[str, Any], ...] = ()
    # the first k tasks only (search.protocol first_task: sets compared on them); None: the whole scenario
    max_tasks: int | None = None

    @property
    def scenario_family(self) -> ScenarioFamily:
        return FAMILIES.get(self.family)

    @property
    def task_family(self) -> TaskFamily:
        """The job's family as the accuracy-matrix flow needs it: tasks of classes, an accuracy matrix."""
        family = self.scenario_family
        if not isinstance(family, TaskFamily):
            raise TypeError(f"the {family.name} family's data flow is {family.data_flow}, not class_incremental")
        return family

    def tasks(self) -> list[TaskSpec]:
        """F(D, s): this ordering's tasks under the job's family."""
        options = {"increments": list(self.increments), **dict(self.family_options)}
        tasks = self.task_family.tasks(self.classes, options, self.seed, self.ordering)
        return tasks[:self.max_tasks] if self.max_tasks else tasks


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
    first_task: str = TRAINED  # trained here, reused from the study's first-task store, or resumed
    device: str = ""  # what it trained on: 'cpu' or 'cuda:0 (<GPU name>)'
    images_trained: int = 0  # images through a training step in this process (not those of a reused task)

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
        scheduler = params.scheduler if first.scheduler == "sampled" else cast(Scheduler, first.scheduler)
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


class PhaseTensors:
    """The phase's images as stored (uint8 NCHW) and its pipeline; each task's images leave as StoredImages on
    the run's device, which learners use as the test view and the trainer crops per batch.

    On the CPU the tensors share the arrays' memory. On CUDA they are copied to the device when they take
    less than a quarter of its memory, so no task copies images from the host."""

    def __init__(self, data: ImageSet, order: list[int], device: torch.device,
                 pipeline: PipelineSpec | None = None, weights: str | None = None) -> None:
        self.data, self.device = data, device
        spec = pipeline or choose_pipeline(True, data.name, "", "")
        rows = np.flatnonzero(np.isin(data.y_train, order))  # the phase's classes' training images
        mean, std = normalisation(spec, data.name, data.x_train, rows, pretrained_normalisation(weights))
        self.pipeline = Pipeline(spec, mean, std, device)
        self.home = device if self._fits(device) else torch.device("cpu")
        with warnings.catch_warnings():  # arrays from Ray's object store are read-only; nothing writes to them
            warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
            self.x_train = torch.from_numpy(data.x_train).to(self.home).permute(0, 3, 1, 2)
            self.x_test = torch.from_numpy(data.x_test).to(self.home).permute(0, 3, 1, 2)

    def _fits(self, device: torch.device) -> bool:
        if device.type != "cuda":
            return True
        size = self.data.x_train.nbytes + self.data.x_test.nbytes
        return size < torch.cuda.get_device_properties(device).total_memory // 4

    def images(self, split: str, mask: np.ndarray) -> Tensor:
        """The masked images, stored, on the run's device. Typed as the tensor they stand in for: learners use
        them as their test view (gtep/engine/images.py), and Trainer.fit finds the stored pixels."""
        source = self.x_train if split == "train" else self.x_test
        index = torch.from_numpy(np.flatnonzero(mask)).to(self.home)
        return cast(Tensor, StoredImages(source.index_select(0, index).to(self.device), self.pipeline))


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


def hparams_reaching_first_task(algorithm: type[IncrementalLearner], job: OrderingJob) -> set[str] | None:
    """The sampled names task 1 depends on; None (all of them) for methods that train task 1 with the set."""
    return names_reaching_first_task(algorithm, job.first_task.scheduler)


class OrderingRun:
    """One ordering's state between tasks: the learner, the trainer's RNG and the accuracy rows so far."""

    def __init__(self, job: OrderingJob, data: ImageSet, fit_mode: FitMode | None = None) -> None:
        """`fit_mode`: how the learner's fits run (gtep/engine/loop.py, FitMode; plain by default)."""
        self.job, self.data = job, data
        self.device = resolve_device(job.device)
        self.seed = ordering_seed(job.seed, job.ordering)
        self.tasks: list[TaskSpec] = job.tasks()
        # a shot index file's positions are the dataset's training arrays'; the run holds the phase's subset
        given = job.task_family.given_shots(dict(job.family_options))  # a benchmark's own shots, or None
        self.given_shots = shots_at_phase_positions(given, data.dataset_train_index()) if given else None
        order = list(self.tasks[-1].seen_classes)
        self.outcome = OrderingOutcome(job.ordering, "finished", order, device=describe_device(self.device))
        self.algorithm = ALGORITHMS.get(job.algorithm)
        self.params = self.algorithm.Params.from_mapping(job.hparams)
        pipeline = choose_pipeline(job.augment, job.dataset or data.name, job.backbone, job.algorithm)
        self.trainer = Trainer(self.device, self.seed, pipeline.augments,
                               Precision.for_device(self.device, job.mixed_precision), job.compile, fit_mode)
        self.key = fingerprint(job)
        self._learner: IncrementalLearner | None = None
        self.images = PhaseTensors(data, order, self.device, pipeline, job.weights)
        label_map = np.full(int(max(data.y_train.max(), data.y_test.max())) + 1, -1, dtype=np.int64)
        label_map[order] = np.arange(len(order))
        self.label_map = label_map
        self.task_of_label = torch.tensor([t.index for t in self.tasks for _ in t.new_classes], device=self.device)

    @property
    def learner(self) -> IncrementalLearner:
        if self._learner is None:  # built only when this run trains (a restored one comes whole)
            torch.manual_seed(self.seed)  # the same initial model for every set on this ordering
            self._learner = self.algorithm(self.params, self.job.backbone, self.job.memory_size, self.device,
                                           self.job.weights)
        return self._learner

    @property
    def tasks_done(self) -> int:
        return len(self.outcome.acc_matrix)

    def first_task_key(self) -> str:
        return first_task_key(self.job, self.job.dataset, hparams_reaching_first_task(self.algorithm, self.job))

    def train_task(self, task: TaskSpec) -> None:
        """Learn one task and append its accuracy row; a non-finite loss marks the run diverged."""
        tic = time.perf_counter()
        try:
            self.learn(self.task_data(task))
        except DivergedError as err:
            self.outcome.status, self.outcome.message = "diverged", f"task {task.index + 1}: {err}"
            return
        self.outcome.acc_matrix.append(self.test_row(task))
        self.outcome.test_counts.append(int(np.isin(self.data.y_test, task.new_classes).sum()))
        self.outcome.task_seconds.append(time.perf_counter() - tic)

    def task_data(self, task: TaskSpec) -> TaskData:
        """The task as the learner sees it: its training images on the device, labels as ordered positions."""
        train_mask = np.isin(self.data.y_train, task.new_classes)
        if task.shots is not None:  # a few-shot session: K images per class, the same for every set
            train_mask = np.zeros_like(train_mask)
            train_mask[few_shot_indices(self.data.y_train, task, self.job.seed, self.job.ordering,
                                        self.given_shots)] = True
        return TaskData(
            index=task.index, known=len(task.old_classes), total=len(task.seen_classes),
            x=self.images.images("train", train_mask),
            y=torch.from_numpy(self.label_map[self.data.y_train[train_mask]]).to(self.device),
            recipe=task_recipe(task.index, self.params, self.job.first_task, self.job.epoch_scale,
                               self.algorithm.fixed_first_task),
            epoch_scale=self.job.epoch_scale,
        )

    def learn(self, task: TaskData) -> None:
        """The learner's three steps (gtep/algorithms/base.py); its bookkeeping is its own, not the engine's."""
        learner = self.learner
        fit = self.trainer.fit_for(learner)
        learner.begin_task(task)
        learner.learn_task(task, fit)
        learner.end_task(task, fit)

    def test_row(self, task: TaskSpec) -> list[float]:
        """Accuracy on each seen task's test images, NaN for the tasks still to come."""
        test_mask = np.isin(self.data.y_test, task.seen_classes)
        y_test = torch.from_numpy(self.label_map[self.data.y_test[test_mask]]).to(self.device)
        row = evaluate(self.learner, self.images.images("test", test_mask), y_test, self.task_of_label,
                       task.index + 1)
        return row + [float("nan")] * (len(self.tasks) - len(row))

    def snapshot(self, key: str) -> TaskCheckpoint:
        return TaskCheckpoint(key, self.tasks_done, self.learner, rng_state(self.trainer.generator),
                              self.outcome.acc_matrix, self.outcome.test_counts, self.outcome.task_seconds,
                              self.outcome.status, self.outcome.message, self.outcome.first_task)

    def restore(self, saved: TaskCheckpoint, first_task: str) -> None:
        """Continue from a saved state; the learner takes this run's set (a stored first task is another's)."""
        self._learner = saved.learner
        self._learner.params = self.params
        restore_rng(saved.rng, self.trainer.generator)
        self.outcome.acc_matrix, self.outcome.test_counts = list(saved.acc_matrix), list(saved.test_counts)
        self.outcome.task_seconds = list(saved.task_seconds)
        self.outcome.status, self.outcome.message = saved.status, saved.message
        self.outcome.first_task = first_task

    def train_first_task(self) -> TaskCheckpoint:
        self.train_task(self.tasks[0])
        return self.snapshot(self.first_task_key())

    def finish(self) -> OrderingOutcome:
        outcome = self.outcome
        outcome.train_seconds = float(sum(outcome.task_seconds))
        outcome.images_trained = self.trainer.images_trained
        outcome.params_total, outcome.params_trainable = self.learner.parameter_counts()
        if outcome.acc_matrix and not outcome.diverged:
            outcome.metrics = self.job.task_family.summarize(np.array(outcome.acc_matrix), outcome.test_counts,
                                                                 self.tasks)
        return outcome
