"""One ordering of a multi-label family (IIRC, gtep/protocol/families/iirc/__init__.py) with one hyperparameter set.

    hierarchy   the phase's classes are the subclasses; superclasses from scenario.iirc.hierarchy (the
                dataset's class groups or a JSON file), with label ids num_classes + k
    tasks       iirc_tasks seeded by (study seed, ordering); labels are ids 0..total-1 in order of appearance
    samples     assign_samples seeded by the study seed: the same training images per class in every
                ordering and set (a subclass keeps sub_keep of its images, its superclass gets super_share)
    TaskData    x: the task's training images (StoredImages, as the class-incremental runner builds them);
                y: a float multi-hot N x total of the TRAINING labels (incomplete information: only the
                current task's labels). A learner with `complete_history = True` (the incremental joint
                bound) gets every training image of the tasks so far, with complete labels over the labels
                seen so far.
    memory      scenario.iirc.memory_per_class: the learner keeps that many samples per seen label (the
                paper's budget) in place of job.memory_size's fixed total
    validation  scenario.iirc.in_task_validation > 0: that share of each subclass's training images is held out
                (seeded by the study seed: the same images in every ordering and set) and assigned to classes
                as the training images are; they are never trained on. Every training stage of a task (every
                `fit` its learner calls) decays its lr on a plateau of the pw-JS on the task's held-out images,
                with the task's incomplete labels over the seen labels (the paper's in-task validation, as its
                reference code scores it), in place of the recipe's schedule
    evaluation  after every task, on the phase's test images of the tasks so far, against the complete labels
                observed so far; label j is predicted when sigmoid(logit) >= learner.threshold (0.5 when it
                has none); columns of labels not yet observed count as not predicted
    outcome     acc_matrix = the task matrix R of pw-JS (row k: after task k; NaN above the diagonal),
                test_counts = each task's evaluation samples, metrics = iirc_metrics.summarize + the aliases
                acc/avg_acc/acc_t (iirc_family.with_aliases); "diverged" on a non-finite loss

Not supported on this path: the study's shared first task (every (set, ordering) trains its own task 1) and
per-task checkpoints (a retried unit restarts its ordering; finished units are still kept by the trainable).
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Callable, Iterable

import numpy as np
import torch
from torch import nn

from gtep.algorithms import ALGORITHMS, IncrementalLearner, TaskData
from gtep.algorithms.base import FitFn, FitRecipe
from gtep.algorithms.iirc.base import MultiLabelLearner
from gtep.data import ImageSet
from gtep.data.pipelines import choose_pipeline
from gtep.engine.device import describe_device, resolve_device
from gtep.engine.first_task import FirstTaskStore
from gtep.engine.flows.base import FLOWS, Flow, TaskHook
from gtep.engine.loop import DivergedError, FitMode, Plateau, Precision, Trainer
from gtep.engine.runner import OrderingJob, OrderingOutcome, PhaseTensors, task_recipe
from gtep.protocol.families.iirc import (
    MULTI_LABEL,
    PLATEAU_THRESHOLD,
    IircOptions,
    ordering_tasks,
    phase_hierarchy,
    with_aliases,
)
from gtep.protocol.families.iirc import metrics as iirc_metrics
from gtep.protocol.families.iirc.generator import (
    assign_samples,
    evaluation_targets,
    hold_out,
    label_kinds,
    task_members,
    task_training_indices,
    training_targets,
)
from gtep.protocol.scenarios import TaskSpec, ordering_seed

THRESHOLD = 0.5


class MultiLabelRun:
    """One IIRC ordering's state between tasks: the learner, the trainer and the predictions so far."""

    def __init__(self, job: OrderingJob, data: ImageSet, fit_mode: FitMode | None = None) -> None:
        self.job, self.data = job, data
        self.device = resolve_device(job.device)
        self.seed = ordering_seed(job.seed, job.ordering)
        self.options = IircOptions.of(dict(job.family_options))
        self.hierarchy = phase_hierarchy(job.classes, self.options.source, data.class_names, data.class_groups)
        self.tasks: list[TaskSpec] = ordering_tasks(self.hierarchy, self.options, job.seed, job.ordering)
        self.labels = list(self.tasks[-1].seen_classes)  # label id of position j: ids in order of appearance
        # in-task validation images: held out of every class's training images (none when the option is 0)
        self.held_out = hold_out(data.y_train, self.hierarchy.subclasses, self.options.in_task_validation, job.seed)
        self.per_class = self.assign(np.where(self.held_out, -1, data.y_train))
        self.per_class_validation = self.assign(np.where(self.held_out, data.y_train, -1))
        self.plateaus: list[Plateau] = []  # one per training stage with in-task validation, in order
        self.outcome = OrderingOutcome(job.ordering, "finished", list(self.labels), device=describe_device(self.device))
        self.algorithm = ALGORITHMS.get(job.algorithm)
        self.params = self.algorithm.Params.from_mapping(job.hparams)
        self.complete_history = bool(getattr(self.algorithm, "complete_history", False))
        pipeline = choose_pipeline(job.augment, job.dataset or data.name, job.backbone, job.algorithm)
        self.trainer = Trainer(self.device, self.seed, pipeline.augments,
                               Precision.for_device(self.device, job.mixed_precision), job.compile, fit_mode)
        self.images = PhaseTensors(data, list(job.classes), self.device, pipeline, job.weights)
        test_mask = np.isin(data.y_test, np.asarray(job.classes))
        self.test_mask = test_mask
        self.test_subclass = data.y_test[test_mask]
        self.members = task_members(self.test_subclass, self.hierarchy, self.tasks)
        self.predictions: list[np.ndarray] = []
        self.targets: list[np.ndarray] = []
        torch.manual_seed(self.seed)  # the same initial model for every set on this ordering
        self.learner: IncrementalLearner = self.algorithm(self.params, job.backbone, job.memory_size, self.device,
                                                          job.weights)
        if self.options.memory_per_class is not None and self.learner.uses_memory:
            if not isinstance(self.learner, MultiLabelLearner):
                raise TypeError(f"{job.algorithm} keeps no multi-label memory; memory_per_class needs one")
            self.learner.keep_per_label(self.options.memory_per_class)
        self.kinds = label_kinds(self.hierarchy, self.labels)

    def assign(self, subclass_labels: np.ndarray) -> dict[int, np.ndarray]:
        """assign_samples over the images of `subclass_labels` (-1: an image left out of this part)."""
        return assign_samples(subclass_labels, self.hierarchy, self.job.seed, sub_keep=self.options.sub_keep,
                              super_share=self.options.super_share)

    def task_data(self, task: TaskSpec) -> TaskData:
        """The task as the learner sees it (module docstring): training labels only, or the complete history."""
        total = len(task.seen_classes)
        if self.complete_history:
            index = task_training_indices(self.per_class, task.seen_classes)
            targets = evaluation_targets(self.data.y_train[index], self.hierarchy, task.seen_classes,
                                         self.labels[:total])
        else:
            index = task_training_indices(self.per_class, task)
            targets = training_targets(self.data.y_train[index], self.hierarchy, task.new_classes,
                                       self.labels[:total])
        mask = np.zeros(len(self.data.y_train), dtype=bool)
        mask[index] = True  # PhaseTensors.images keeps ascending order, as `index` is
        return TaskData(
            index=task.index, known=len(task.old_classes), total=total, x=self.images.images("train", mask),
            y=torch.from_numpy(targets.astype(np.float32)).to(self.device),
            recipe=task_recipe(task.index, self.params, self.job.first_task, self.job.epoch_scale,
                               self.algorithm.fixed_first_task),
            epoch_scale=self.job.epoch_scale)

    def validation_set(self, task: TaskSpec) -> tuple[torch.Tensor, np.ndarray] | None:
        """The task's in-task validation images and their incomplete labels over the seen labels (bool), or None
        without a validation split (or when the task's classes hold out no image)."""
        index = task_training_indices(self.per_class_validation, task)
        if not len(index):
            return None
        targets = training_targets(self.data.y_train[index], self.hierarchy, task.new_classes,
                                   self.labels[: len(task.seen_classes)])
        mask = np.zeros(len(self.data.y_train), dtype=bool)
        mask[index] = True
        return self.images.images("train", mask), targets

    def task_fit(self, task: TaskSpec, data: TaskData) -> FitFn:
        """The trainer's fit, with the lr decayed on a plateau of the task's in-task validation pw-JS when the
        run has a validation split (module docstring)."""
        validation = self.validation_set(task)
        if validation is None:
            return self.trainer.fit
        images, targets = validation
        patience = data.scaled_epochs(self.options.plateau_patience)

        def fit(parameters: Iterable[nn.Parameter], loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
                x: torch.Tensor, y: torch.Tensor, recipe: FitRecipe, *, augment: bool = True,
                modules: Iterable[nn.Module] = ()) -> None:
            plateau = Plateau(lambda: self.validation_score(images, targets), patience, PLATEAU_THRESHOLD)
            self.plateaus.append(plateau)
            self.trainer.fit(parameters, loss_fn, x, y, recipe, augment=augment, modules=modules, plateau=plateau)
        return fit

    def validation_score(self, x: torch.Tensor, targets: np.ndarray) -> float:
        """pw-JS on the in-task validation images; the network's train/eval modes are left as they were."""
        modes = [(module, module.training) for module in self.learner.net.modules()]
        predicted = self.predicted_labels(x, targets.shape[1])
        for module, training in modes:
            module.training = training
        return iirc_metrics.pw_jaccard(predicted, targets)

    def train_task(self, task: TaskSpec) -> None:
        tic = time.perf_counter()
        data = self.task_data(task)
        fit = self.task_fit(task, data)
        try:
            self.learner.begin_task(data)
            self.learner.learn_task(data, fit)
            self.learner.end_task(data, fit)
        except DivergedError as err:
            self.outcome.status, self.outcome.message = "diverged", f"task {task.index + 1}: {err}"
            return
        self.outcome.acc_matrix.append(self.test_row(task))
        self.outcome.test_counts.append(int(self.members[task.index].sum()))
        self.outcome.task_seconds.append(time.perf_counter() - tic)

    @torch.no_grad()
    def predict(self, mask: np.ndarray, total: int, batch: int = 512) -> np.ndarray:
        """Predicted label sets (bool, n_test x all labels) of the masked test images; other rows, and the
        columns of labels not observed yet, are False."""
        out = np.zeros((len(self.test_subclass), len(self.labels)), dtype=bool)
        if not mask.any():
            return out
        full = np.zeros(len(self.data.y_test), dtype=bool)
        full[np.flatnonzero(self.test_mask)[mask]] = True
        predicted = self.predicted_labels(self.images.images("test", full), total, batch)
        out[np.flatnonzero(mask), : predicted.shape[1]] = predicted
        return out

    @torch.no_grad()
    def predicted_labels(self, x: torch.Tensor, total: int, batch: int = 512) -> np.ndarray:
        """The learner's predicted label sets of images `x` over the first `total` labels (bool), in eval mode."""
        self.learner.net.eval()
        threshold = float(getattr(self.learner, "threshold", THRESHOLD))
        scores = torch.cat([self.learner.predict(x[i: i + batch]) for i in range(0, len(x), batch)])
        return (torch.sigmoid(scores.float()) >= threshold)[:, :total].cpu().numpy()

    def test_row(self, task: TaskSpec) -> list[float]:
        """pw-JS after this task on each seen task's evaluation samples (R's row), NaN for the tasks to come."""
        k = task.index
        seen = np.logical_or.reduce(self.members[: k + 1])
        prediction = self.predict(seen, len(task.seen_classes))
        target = evaluation_targets(self.test_subclass, self.hierarchy, task.seen_classes, self.labels)
        self.predictions.append(prediction)
        self.targets.append(target)
        row = [iirc_metrics.pw_jaccard(prediction[m], target[m]) for m in self.members[: k + 1]]
        return row + [float("nan")] * (len(self.tasks) - len(row))

    def finish(self) -> OrderingOutcome:
        outcome = self.outcome
        outcome.train_seconds = float(sum(outcome.task_seconds))
        outcome.params_total, outcome.params_trainable = self.learner.parameter_counts()
        if self.predictions and not outcome.diverged:
            outcome.metrics = with_aliases(iirc_metrics.summarize(self.predictions, self.targets,
                                                                  self.members[: len(self.predictions)], self.kinds))
        return outcome


class MultiLabelFlow(Flow):
    """IIRC's tasks of incompletely labelled images: its units are tasks; the calibration times every task."""

    unit = "task"

    def start(self, job: OrderingJob, data: ImageSet, fit_mode: FitMode | None = None) -> MultiLabelRun:
        return MultiLabelRun(job, data, fit_mode)

    def run(self, job: OrderingJob, data: ImageSet, on_task_end: TaskHook | None = None,
            checkpoint: Path | None = None, first_tasks: FirstTaskStore | None = None,
            fit_mode: FitMode | None = None) -> OrderingOutcome:
        """Train one multi-label ordering task by task; never raises for a diverged run (module docstring)."""
        run = self.start(job, data, fit_mode)
        for task in run.tasks:
            run.train_task(task)
            if run.outcome.diverged:
                break
            if on_task_end is not None:
                on_task_end(task.index, run.outcome)
        return run.finish()


FLOWS.register(MULTI_LABEL)(MultiLabelFlow())
