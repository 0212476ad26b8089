"""One ordering of the continual few-shot family (CFSL, gtep/protocol/families/cfsl/) with one hyperparameter
set.

    pool        the phase's training and test images together (a CFSL task has no train/test split of its own:
                the sampler draws every support and target sample from the phase's classes' images, unique
                within the task); pool index i < n_train is training image i, else test image i - n_train
    tasks       gtep.protocol.families.cfsl.generator.ordering_tasks: tasks_per_ordering tasks, task t drawn
                with (seed, ordering, t)
    data flow   per task: learner.start_task, then each support set through a SupportStream (built when reached,
                yielded once, a second pass raises: the learner never holds the list), learner.learn_support
                once per set; only then learner.scores on the target set (the test view of the images, no
                augmentation: a support set is a handful of images)
    metrics     per task: target accuracy and cross-entropy; `atm`, the most bytes of learner.task_state() after
                any support set / the bytes of the support tensors as the learner received them (float32, the
                unit its state is measured in: storing every image gives the paper's anchor 1); `atm_count`, the
                most learner.stored_vectors() / the support samples (the paper's Eq. 1 as written); MACs
                (FlopCounterMode's FLOPs / 2, of learning and scoring); per ordering
                gtep.protocol.families.cfsl.metrics.summarize + the aliases acc/avg_acc/acc_t (cfsl_family.with_aliases)
    outcome     acc_matrix: one row per task holding its target accuracy; test_counts: target set sizes;
                class_order: the classes of the tasks, task after task; "diverged" on a non-finite loss or score

The learner is built once per ordering (the same seed for every set) and reset by start_task for every task.
Not supported on this path (as on the multi-label one): the shared first task and per-task checkpoints.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Callable, ClassVar, Iterator, Sequence, cast

import numpy as np
import torch
from torch import Tensor
from torch.utils.flop_counter import FlopCounterMode

from gtep.algorithms import ALGORITHMS
from gtep.algorithms.cfsl.base import FewShotLearner
from gtep.data import ImageSet
from gtep.data.pipelines import choose_pipeline
from gtep.engine.device import describe_device, resolve_device
from gtep.engine.first_task import FirstTaskStore
from gtep.engine.flows.base import FLOWS, Flow, StopCheck, TaskHook, TimedPart
from gtep.engine.loop import FitMode
from gtep.engine.runner import OrderingJob, OrderingOutcome, PhaseTensors
from gtep.protocol.families.cfsl import CONTINUAL_FEW_SHOT, with_aliases
from gtep.protocol.families.cfsl import metrics as cfsl_metrics
from gtep.protocol.families.cfsl.generator import CfslOptions, CfslTask, SupportSet, ordering_tasks
from gtep.protocol.scenarios import ordering_seed


class SupportStream:
    """A task's support sets for the learner: each is loaded when reached and yielded once; iterating the stream
    a second time raises, and it keeps no loaded set, so a learner can only keep what it extracts."""

    def __init__(self, sets: Sequence[SupportSet], load: Callable[[SupportSet], tuple[Tensor, Tensor]]) -> None:
        self._sets = list(sets)
        self._load = load
        self._started = False

    def __len__(self) -> int:
        return len(self._sets)

    def __iter__(self) -> Iterator[tuple[Tensor, Tensor]]:
        if self._started:
            raise RuntimeError("a CFSL task's support sets are seen once: this stream was already iterated")
        self._started = True
        return self._each()

    def _each(self) -> Iterator[tuple[Tensor, Tensor]]:
        while self._sets:
            yield self._load(self._sets.pop(0))


class Pool:
    """The phase's images as one pool (module docstring): test views of pool indices, on the run's device."""

    def __init__(self, data: ImageSet, classes: Sequence[int], images: PhaseTensors) -> None:
        self.n_train = len(data.y_train)
        labels = np.concatenate([data.y_train, data.y_test]).astype(np.int64)
        # images of other classes can never be drawn: their label is outside every phase
        self.labels = np.where(np.isin(labels, np.asarray(classes)), labels, -1)
        self.images = images

    def view(self, indices: Sequence[int], labels: Sequence[int]) -> tuple[Tensor, Tensor]:
        """The images at `indices` (float test views) and their labels, in ascending pool order."""
        index = np.asarray(indices, dtype=np.int64)
        order = np.argsort(index, kind="stable")
        index = index[order]
        parts = []
        for split, chosen in (("train", index[index < self.n_train]), ("test", index[index >= self.n_train])):
            if len(chosen):
                size = self.n_train if split == "train" else len(self.labels) - self.n_train
                mask = np.zeros(size, dtype=bool)
                mask[chosen - (0 if split == "train" else self.n_train)] = True
                parts.append(self.images.images(split, mask).float())
        y = torch.as_tensor(np.asarray(labels, dtype=np.int64)[order], device=self.images.device)
        return torch.cat(parts), y


class CfslRun:
    """One CFSL ordering: its tasks, its learner and the per-task results so far."""

    def __init__(self, job: OrderingJob, data: ImageSet) -> None:
        self.job = job
        self.device = resolve_device(job.device)
        self.seed = ordering_seed(job.seed, job.ordering)
        self.options = CfslOptions.of(dict(job.family_options))
        pipeline = choose_pipeline(job.augment, job.dataset or data.name, job.backbone, job.algorithm)
        self.pool = Pool(data, job.classes, PhaseTensors(data, list(job.classes), self.device, pipeline, job.weights))
        self.tasks: list[CfslTask] = ordering_tasks(self.pool.labels, job.classes, self.options, job.seed,
                                                    job.ordering)
        self.outcome = OrderingOutcome(job.ordering, "finished", [c for t in self.tasks for c in t.classes],
                                       device=describe_device(self.device))
        algorithm = ALGORITHMS.get(job.algorithm)
        torch.manual_seed(self.seed)  # the same initial learner for every set on this ordering
        self.learner = cast(FewShotLearner, algorithm(algorithm.Params.from_mapping(job.hparams), job.backbone, 0,
                                                      self.device, job.weights))
        self.accuracies: list[float] = []
        self.cross_entropies: list[float] = []
        self.atms: list[float] = []
        self.atm_counts: list[float] = []
        self.macs: list[float] = []

    def support_stream(self, task: CfslTask) -> SupportStream:
        return SupportStream(task.support, lambda s: self.pool.view(s.samples, s.labels))

    def run_task(self, task: CfslTask) -> None:
        tic = time.perf_counter()
        learner = self.learner
        state_bytes: list[int] = []
        state_vectors: list[int] = []
        support_bytes = support_samples = 0
        learner.start_task(task.num_labels)
        with FlopCounterMode(display=False) as counter:
            for x, y in self.support_stream(task):
                # the input as the learner gets it (float32 after the pipeline), the unit its state is counted in
                support_bytes += x.numel() * x.element_size()
                support_samples += len(x)
                learner.learn_support(x, y)
                state_bytes.append(learner.state_bytes())
                state_vectors.append(learner.stored_vectors())
            xt, yt = self.pool.view(task.target_samples, task.target_labels)
            scores = learner.scores(xt).float()
        if not bool(torch.isfinite(scores).any(1).all()):
            raise FloatingPointError("non-finite target scores")
        s, labels = scores.cpu().numpy(), yt.cpu().numpy()
        self.accuracies.append(cfsl_metrics.accuracy(s, labels))
        self.cross_entropies.append(cfsl_metrics.cross_entropy(s, labels))
        self.atms.append(cfsl_metrics.across_task_memory(state_bytes, support_bytes))
        self.atm_counts.append(cfsl_metrics.across_task_memory(state_vectors, support_samples))
        self.macs.append(counter.get_total_flops() / 2)
        self.outcome.acc_matrix.append([self.accuracies[-1]])
        self.outcome.test_counts.append(len(labels))
        self.outcome.task_seconds.append(time.perf_counter() - tic)

    def finish(self) -> OrderingOutcome:
        outcome = self.outcome
        outcome.train_seconds = float(sum(outcome.task_seconds))
        outcome.params_total, outcome.params_trainable = self.learner.parameter_counts()
        if self.accuracies and not outcome.diverged:
            outcome.metrics = with_aliases(cfsl_metrics.summarize(self.accuracies, self.cross_entropies, self.atms,
                                                                  self.atm_counts, self.macs))
        return outcome


class ContinualFewShotFlow(Flow):
    """CFSL's support sets seen once, then a target set: its units are support sets; the calibration runs task 1
    as the warm-up and times the next `calibration_tasks` tasks."""

    unit = "support set"
    calibration_tasks: ClassVar[int] = 1

    def start(self, job: OrderingJob, data: ImageSet, fit_mode: FitMode | None = None) -> CfslRun:
        """(Its learners train their episodes themselves, without the engine's Trainer: no fits for `fit_mode`.)"""
        return CfslRun(job, data)

    def run(self, job: OrderingJob, data: ImageSet, on_task_end: TaskHook | None = None,
            checkpoint: Path | None = None, first_tasks: FirstTaskStore | None = None,
            fit_mode: FitMode | None = None) -> OrderingOutcome:
        """Run one CFSL ordering's tasks one by one; never raises for a diverged run (module docstring)."""
        run = self.start(job, data)
        for task in run.tasks:
            try:
                run.run_task(task)
            except FloatingPointError as err:
                run.outcome.status, run.outcome.message = "diverged", f"task {task.index + 1}: {err}"
                break
            if on_task_end is not None:
                on_task_end(task.index, run.outcome)
        return run.finish()

    def units(self, run: CfslRun) -> int:
        return sum(len(task.support) for task in run.tasks)

    def time_part(self, run: CfslRun, stop: StopCheck | None = None) -> TimedPart:
        run.run_task(run.tasks[0])  # the warm-up: kernels, allocator, the learner's first reset
        timed = run.tasks[1: 1 + self.calibration_tasks] or run.tasks[:1]
        tic = time.perf_counter()
        units = 0
        for n, task in enumerate(timed, 1):
            run.run_task(task)
            units += len(task.support)
            if stop is not None and n < len(timed) and stop(units, time.perf_counter() - tic):
                break
        return TimedPart(units, time.perf_counter() - tic)


FLOWS.register(CONTINUAL_FEW_SHOT)(ContinualFewShotFlow())
