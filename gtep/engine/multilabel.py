"""One ordering of a multi-label family (IIRC, gtep/protocol/iirc_family.py) with one hyperparameter set.

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
from typing import Callable

import numpy as np
import torch

from gtep.algorithms import ALGORITHMS, IncrementalLearner, TaskData
from gtep.data import ImageSet
from gtep.data.pipelines import choose_pipeline
from gtep.engine.device import describe_device, resolve_device
from gtep.engine.loop import DivergedError, Precision, Trainer
from gtep.engine.runner import DATA_FLOW_RUNNERS, OrderingJob, OrderingOutcome, PhaseTensors, task_recipe
from gtep.protocol import iirc_metrics
from gtep.protocol.iirc import (
    assign_samples,
    evaluation_targets,
    task_members,
    task_training_indices,
    training_targets,
)
from gtep.protocol.iirc_family import MULTI_LABEL, IircOptions, ordering_tasks, phase_hierarchy, with_aliases
from gtep.protocol.scenarios import TaskSpec, ordering_seed

THRESHOLD = 0.5


class MultiLabelRun:
    """One IIRC ordering's state between tasks: the learner, the trainer and the predictions so far."""

    def __init__(self, job: OrderingJob, data: ImageSet) -> None:
        self.job, self.data = job, data
        self.device = resolve_device(job.device)
        self.seed = ordering_seed(job.seed, job.ordering)
        self.options = IircOptions.of(dict(job.family_options))
        self.hierarchy = phase_hierarchy(job.classes, self.options.source, data.class_names, data.class_groups)
        self.tasks: list[TaskSpec] = ordering_tasks(self.hierarchy, self.options, job.seed, job.ordering)
        self.labels = list(self.tasks[-1].seen_classes)  # label id of position j: ids in order of appearance
        self.per_class = assign_samples(data.y_train, self.hierarchy, job.seed, sub_keep=self.options.sub_keep,
                                        super_share=self.options.super_share)
        self.outcome = OrderingOutcome(job.ordering, "finished", list(self.labels), device=describe_device(self.device))
        self.algorithm = ALGORITHMS.get(job.algorithm)
        self.params = self.algorithm.Params.from_mapping(job.hparams)
        self.complete_history = bool(getattr(self.algorithm, "complete_history", False))
        pipeline = choose_pipeline(job.augment, job.dataset or data.name, job.backbone, job.algorithm)
        self.trainer = Trainer(self.device, self.seed, pipeline.augments,
                               Precision.for_device(self.device, job.mixed_precision), job.compile)
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

    def train_task(self, task: TaskSpec) -> None:
        tic = time.perf_counter()
        data = self.task_data(task)
        try:
            self.learner.begin_task(data)
            self.learner.learn_task(data, self.trainer.fit)
            self.learner.end_task(data, self.trainer.fit)
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
        x = self.images.images("test", full)
        self.learner.net.eval()
        threshold = float(getattr(self.learner, "threshold", THRESHOLD))
        scores = torch.cat([self.learner.predict(x[i: i + batch]) for i in range(0, len(x), batch)])
        predicted = (torch.sigmoid(scores.float()) >= threshold)[:, :total].cpu().numpy()
        out[np.flatnonzero(mask), : predicted.shape[1]] = predicted
        return out

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
                                                                  self.members[: len(self.predictions)]))
        return outcome


def run_multilabel_ordering(job: OrderingJob, data: ImageSet,
                            on_task_end: Callable[[int, OrderingOutcome], None] | None = None) -> OrderingOutcome:
    """Train one multi-label ordering task by task; never raises for a diverged run (module docstring)."""
    run = MultiLabelRun(job, data)
    for task in run.tasks:
        run.train_task(task)
        if run.outcome.diverged:
            break
        if on_task_end is not None:
            on_task_end(task.index, run.outcome)
    return run.finish()


DATA_FLOW_RUNNERS[MULTI_LABEL] = run_multilabel_ordering
