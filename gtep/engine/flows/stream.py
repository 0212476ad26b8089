"""One FLUID sequence (gtep/protocol/families/fluid/__init__.py) with one hyperparameter set: the paper's Algorithm 1.

    stream      phase_stream(...) seeded by (study seed, ordering, the phase's classes): pretrain classes' test
                images (and the training images pretraining held out, scenario.fluid.pretrain_holdout) and the
                phase's novel classes' images, Zipf-distributed, shuffled
    protocol    PredictThenReveal: the image of step t goes to the learner, its prediction is recorded, and only
                then is its label revealed (asking earlier raises); the learner updates when it decides
                (StreamLearner.due, every `update_every` samples) on what it has seen
    labels      the learner sees positions in order of first appearance; predictions map back to class ids
    compute     ComputeMeter: inference MACs counted with torch.utils.flop_counter.FlopCounterMode on every
                prediction (MACs = FLOPs / 2): features, classifier and unseen detector (distances are matrix
                products, gtep/algorithms/_distances.py: the counter sees no torch.cdist); an update counts its
                forward MACs per sample (measured the same way on one sample) x samples passed x (1 +
                backward_factor): the backward pass as a configurable multiple of the forward
                (scenario.fluid.backward_factor; 1.0 matches the paper's totals, notes 004.2). Pretraining is
                not counted, as in the paper.
    detection   the unseen detector's positives: first sightings of novel classes (scenario.fluid
                .unseen_positives: novel, the paper's App. H) or of every class (all)
    outcome     metrics = fluid_metrics.summarize + the aliases acc/avg_acc/acc_t; acc_matrix holds the rolling
                accuracy as one row (so generic tables have a row); "diverged" on a non-finite loss, and on a
                NaN unseen score (its AUROC and F1 are then NaN, never a number; the accuracies are kept)
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable, ClassVar, cast

import numpy as np
import torch
from torch import Tensor
from torch.utils.flop_counter import FlopCounterMode

from gtep.algorithms import ALGORITHMS
from gtep.algorithms.fluid.base import StreamLearner
from gtep.data import ImageSet
from gtep.data.pipelines import choose_pipeline
from gtep.engine.device import describe_device, resolve_device
from gtep.engine.first_task import FirstTaskStore
from gtep.engine.flows.base import FLOWS, Flow, StopCheck, TaskHook, TimedPart
from gtep.engine.images import StoredImages
from gtep.engine.loop import DivergedError, FitMode, Precision, Trainer
from gtep.engine.runner import OrderingJob, OrderingOutcome, PhaseTensors, task_recipe
from gtep.protocol.families.fluid import STREAM, FluidOptions, phase_stream, with_aliases
from gtep.protocol.families.fluid import metrics as fluid_metrics
from gtep.protocol.families.fluid.generator import UNSEEN, PredictThenReveal
from gtep.protocol.scenarios import ordering_seed


class ComputeMeter:
    """GMACs spent on inference and on updates (module docstring)."""

    def __init__(self, backward_factor: float) -> None:
        self.backward_factor = backward_factor
        self.macs = {"inference": 0.0, "update": 0.0}

    def inference(self, fn: Callable[[Tensor], Any], x: Tensor) -> Any:
        with FlopCounterMode(display=False) as counter:
            out = fn(x)
        self.macs["inference"] += counter.get_total_flops() / 2
        return out

    def training(self, forward: Callable[[Tensor], Any], x_one: Tensor, samples: int) -> None:
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            forward(x_one)
        self.macs["update"] += counter.get_total_flops() / 2 * samples * (1 + self.backward_factor)

    @property
    def gmacs(self) -> dict[str, float]:
        return {k: v / 1e9 for k, v in self.macs.items()}


class StreamRun:
    """One sequence's state: the stream, the learner and the compute so far."""

    def __init__(self, job: OrderingJob, data: ImageSet, fit_mode: FitMode | None = None) -> None:
        self.job, self.data = job, data
        self.device = resolve_device(job.device)
        self.seed = ordering_seed(job.seed, job.ordering)
        self.options = FluidOptions.of(dict(job.family_options))
        self.spec = phase_stream(data.y_train, data.y_test, job.classes, self.options, job.seed, job.ordering)
        self.stream = PredictThenReveal(self.spec)
        self.algorithm = ALGORITHMS.get(job.algorithm)
        self.params = self.algorithm.Params.from_mapping(job.hparams)
        pipeline = choose_pipeline(job.augment, job.dataset or data.name, job.backbone, job.algorithm)
        self.trainer = Trainer(self.device, self.seed, pipeline.augments,
                               Precision.for_device(self.device, job.mixed_precision), job.compile, fit_mode)
        self.tensors = PhaseTensors(data, list(job.classes), self.device, pipeline, job.weights)
        self.recipe = task_recipe(1, self.params, job.first_task, job.epoch_scale, fixed_first_task=False)
        self.meter = ComputeMeter(self.options.backward_factor)
        self.order: list[int] = []  # class ids in order of first appearance: position -> class
        self.outcome = OrderingOutcome(job.ordering, "finished", [], device=describe_device(self.device))
        torch.manual_seed(self.seed)  # the same initial model for every set on this sequence
        self.learner = cast(StreamLearner, self.algorithm(self.params, job.backbone, 0, self.device, job.weights))

    def image(self, image_id: int) -> Tensor:
        """One image as a batch of 1, stored (ids below len(y_train) are training images, the rest test ones)."""
        n_train = len(self.data.y_train)
        source, row = (self.tensors.x_train, image_id) if image_id < n_train else (self.tensors.x_test,
                                                                                     image_id - n_train)
        return cast(Tensor, StoredImages(source[row: row + 1].to(self.device), self.tensors.pipeline))

    def step(self, t: int) -> None:
        """Predict sample t, record it, reveal its label, let the learner update if it is due."""
        x = self.image(self.stream.sample(t))
        position, score = self.learner.predict_sample(x, self.meter)
        self.stream.record(t, UNSEEN if position == UNSEEN else self.order[position], score)
        label = self.stream.reveal(t)
        if label not in self.order:
            self.order.append(label)
        self.learner.reveal(self.order.index(label))
        if self.learner.due(t + 1):
            self.learner.update(self.trainer.fit, self.recipe, self.meter)

    def run(self) -> OrderingOutcome:
        tic = time.perf_counter()
        try:
            for t in range(len(self.stream)):
                self.step(t)
        except DivergedError as err:
            self.outcome.status, self.outcome.message = "diverged", f"stream step {t + 1}: {err}"
        self.outcome.train_seconds = time.perf_counter() - tic
        self.outcome.task_seconds = [self.outcome.train_seconds]
        self.outcome.class_order = list(self.order)
        self.outcome.params_total, self.outcome.params_trainable = self.learner.parameter_counts()
        if not self.outcome.diverged:
            self.outcome.metrics = self.metrics()
            self.outcome.acc_matrix = [list(cast(list[float], self.outcome.metrics["rolling_acc"]))]
            self.outcome.test_counts = [len(self.stream)]
            self.mark_nan_scores()
        return self.outcome

    def mark_nan_scores(self) -> None:
        """A learner whose unseen scores went NaN has diverged, as one whose loss did: recorded so (H* never
        picks it), with its detection metrics NaN (fluid_metrics), never a crash of the study."""
        nan = np.flatnonzero(np.isnan(self.stream.unseen_scores))
        if len(nan):
            self.outcome.status = "diverged"
            self.outcome.message = f"stream step {nan[0] + 1}: the unseen score is NaN ({len(nan)} steps)"

    def metrics(self) -> dict[str, Any]:
        labels = self.spec.label
        pretrain = np.unique(labels[self.spec.pretrain]).tolist()
        positives = fluid_metrics.unseen_positives(labels, ~self.spec.pretrain, self.options.unseen_positives)
        return with_aliases(fluid_metrics.summarize(
            labels, self.stream.predictions, self.stream.unseen_scores, positives, pretrain,
            self.options.head_cut, self.options.window, self.meter.gmacs))


class StreamFlow(Flow):
    """FLUID's predict-then-reveal stream: its units are samples; the calibration times the stream's first
    `calibration_steps` samples, and an update's `fit` grows with the square of the samples seen."""

    unit = "stream sample"
    fit_power = 2
    # a stream longer than this is timed on its first this-many samples and scaled to its length
    calibration_steps: ClassVar[int] = 1000

    def start(self, job: OrderingJob, data: ImageSet, fit_mode: FitMode | None = None) -> StreamRun:
        return StreamRun(job, data, fit_mode)

    def run(self, job: OrderingJob, data: ImageSet, on_task_end: TaskHook | None = None,
            checkpoint: Path | None = None, first_tasks: FirstTaskStore | None = None,
            fit_mode: FitMode | None = None) -> OrderingOutcome:
        """Run one FLUID sequence; never raises for a diverged run (module docstring)."""
        outcome = self.start(job, data, fit_mode).run()
        if on_task_end is not None and not outcome.diverged:
            on_task_end(0, outcome)
        return outcome

    def units(self, run: StreamRun) -> int:
        return len(run.stream)

    def time_part(self, run: StreamRun, stop: StopCheck | None = None) -> TimedPart:
        steps = min(len(run.stream), self.calibration_steps)
        tic = time.perf_counter()
        for t in range(steps):
            run.step(t)
            # asked after an update only: a part that stopped before one would count no `fit` at all
            if stop is not None and t + 1 < steps and run.learner.due(t + 1) and stop(t + 1, time.perf_counter() - tic):
                return TimedPart(t + 1, time.perf_counter() - tic)
        return TimedPart(steps, time.perf_counter() - tic)


FLOWS.register(STREAM)(StreamFlow())
