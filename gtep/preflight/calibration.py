"""The calibration of `gtep check --calibrate`: how long a study's training should take on this machine, from a
few real training steps of its learner timed as a trial runs them (the trial's threads and device).

- trial slots: a trial's threads and device (as gtep/orchestration/trial_job.py gives them) and the trials this
  machine runs at once;
- a flow whose work is tasks of classes (Flow.by_image_epochs: the class-incremental flow): two tasks of synthetic
  images through the learner's every stage, scaled by each task's images x epochs (`compute_estimate`);
- any other flow: the part of ordering 0 the flow says to time (Flow.time_part) on the phase's own images, `fit`
  sampled, scaled to the units of work the flow counts in an ordering (Flow.units: `compute_flow_estimate`);
- the pretrain section: a few of its steps, scaled to its epochs x images (`pretrain_estimate`).

Nothing here branches on a flow's name: a flow states its unit, its units and the part to time (gtep/engine/flows).
"""
from __future__ import annotations

import inspect
import os
import time
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, Callable

import numpy as np
import torch
from torch import nn

from gtep.algorithms import ALGORITHMS
from gtep.algorithms._episodic import train_prototypical
from gtep.config import ExperimentConfig
from gtep.data import ImageSet, resolve_dataset
from gtep.engine.device import choose_device, describe_device, resolve_device
from gtep.engine.flows import FLOWS, Flow, flow_of
from gtep.engine.fusion import fusion_wanted
from gtep.engine.loop import FIT_MODES, FitCall, FitMode, PlainFit
from gtep.engine.orderings import run_orderings
from gtep.engine.pretrain import pretraining_pipeline, train_supervised, training_subset
from gtep.engine.runner import FirstTaskSpec, OrderingJob, PhaseTensors, task_recipe
from gtep.models import create_backbone
from gtep.preflight.checks import PhasePlan, StudyPlan
from gtep.protocol.sampling import sample_sets
from gtep.spaces import load_space


def image_epochs(plan: StudyPlan, phase: PhasePlan) -> float:
    """Training images x epochs of one ordering, averaged over the R sets the study will draw (the same seed
    draws the same sets): each task's images, plus the exemplar memory a later task replays, times the epochs
    its recipe gives (Table 3's first task, the set's epochs after it)."""
    cfg = plan.resolved.config
    algorithm = ALGORITHMS.get(cfg.algorithm)
    space = load_space(cfg.algorithm, plan.resolved.space_path).space
    first = FirstTaskSpec(**{**cfg.first_task.model_dump(), "milestones": tuple(cfg.first_task.milestones)})
    totals = []
    for hparams in sample_sets(space, cfg.search.trials, cfg.seed):
        params = algorithm.Params.from_mapping(hparams)
        total, seen = 0.0, 0
        for index, (_, images) in enumerate(phase.tasks):
            recipe = task_recipe(index, params, first, cfg.training.epoch_scale, algorithm.fixed_first_task)
            total += (images + min(cfg.training.memory_size, seen)) * recipe.epochs
            seen += images
        totals.append(total)
    return float(np.mean(totals)) if totals else 0.0


# Each timed `fit` sees this many batches of synthetic images (a warm-up task is trained and discarded first, so
# kernels and the allocator are ready), and each class this many test images for the scoring pass.
CALIBRATION_BATCHES = 2
CALIBRATION_TEST_PER_CLASS = 2
# The timed tasks run this often; each task's quickest run counts.
CALIBRATION_REPEATS = 2
# Every epoch count of the calibration's run scaled to 1 (the learner's own stages' too): the cost per epoch
# is what it times, the study's epochs multiply it.
ONE_EPOCH_SCALE = 1e-9
# An index file's positions are the real dataset's; the synthetic images draw their shots instead.
SHOT_FILE_OPTIONS = ("shot_index", "shots_given")
# The calibration's own cost: at most this share of the tuning phase it estimates, and never over BUDGET_CAP_S (one
# took 779 s on a loaded machine to estimate a tuning phase of 1 min 42 s).
BUDGET_SHARE = 0.1
BUDGET_CAP_S = 60.0


@dataclass
class CalibrationBudget:
    """What one `gtep check --calibrate` may spend. The estimate is not known before calibrating, so the first
    sample's estimate sets the budget (min(BUDGET_CAP_S, BUDGET_SHARE x the estimate)); after it, sampling stops
    once the budget is spent and the estimate extrapolates from the samples taken. `clock`: a test's own."""

    clock: Callable[[], float] = time.perf_counter
    seconds: float | None = None  # None until the first sample
    left_out: list[str] = field(default_factory=list)  # the samples the spent budget left out
    started: float = field(init=False)
    ended: float | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        self.started = self.clock()

    def first_estimate(self, tuning_seconds: float) -> None:
        if self.seconds is None:
            self.seconds = min(BUDGET_CAP_S, BUDGET_SHARE * max(0.0, tuning_seconds))

    def elapsed(self) -> float:
        return (self.ended if self.ended is not None else self.clock()) - self.started

    def spent(self, sample: str) -> bool:
        """Whether the budget is spent, so `sample` (as the output names it) is left out."""
        if self.seconds is None or self.elapsed() < self.seconds:
            return False
        self.left_out.append(sample)
        return True

    def end(self) -> None:
        self.ended = self.clock()

    def describe(self) -> str:
        """'calibrated in 12 s (budget 60 s)', and what the spent budget left out."""
        budget = "not set" if self.seconds is None else seconds_text(self.seconds)
        left = f"; spent, so left out: {', '.join(self.left_out)}" if self.left_out else ""
        return f"calibrated in {seconds_text(self.elapsed())} (budget {budget}{left})"


def seconds_text(seconds: float) -> str:
    return f"{seconds:.1f} s" if seconds < 10 else f"{seconds:.0f} s"


@dataclass(frozen=True)
class TrialSlots:
    """How a trial trains (its threads and device, as gtep/orchestration/trial_job.py gives them) and how many
    trials this machine runs at once."""

    threads: int
    device: str  # 'cpu', 'cuda' or 'cuda:N'
    slots: int
    counted: str  # how the slots were counted, as the output says it


def trial_slots(cfg: ExperimentConfig) -> TrialSlots:
    compute = cfg.compute
    parallel = compute.parallel_orderings(cfg.search.orderings)
    cpus = compute.cpus_per_ordering if parallel > 1 and compute.cpus_per_ordering else compute.cpus_per_trial
    # the device's name as the driver gives it to the trial (trial_job.phase_scenario): its workers check CUDA
    device = choose_device(cfg.training.device, None, trial_gpus=compute.gpus_per_trial)
    machine_cpus = os.cpu_count() or 1
    slots = int(machine_cpus // compute.cpus_per_trial)
    counted = f"{machine_cpus} CPUs / compute.cpus_per_trial {compute.cpus_per_trial:g}"
    if compute.gpus_per_trial > 0:
        gpus = torch.cuda.device_count()
        slots = min(slots, int(gpus // compute.gpus_per_trial))
        counted += f", {gpus} GPUs / compute.gpus_per_trial {compute.gpus_per_trial:g}"
    if compute.max_concurrent is not None and compute.max_concurrent < slots:
        slots = compute.max_concurrent
        counted += f", compute.max_concurrent {compute.max_concurrent}"
    return TrialSlots(max(1, int(cpus)), device, max(1, slots), counted)


@dataclass(frozen=True)
class Calibration:
    """Seconds a trial's ordering spends, per unit of work, timed on real training steps of the study's learner."""

    first_task: float  # per training image-epoch of task 1, through every `fit` of the learner
    later_tasks: float  # per image-epoch of task 2 (an old network to distil from, another backbone, ...)
    growth: float  # the parameters task 2 added over task 2's total: > 0 where each task adds a backbone
    outside_fit: float  # per training image of a task, outside `fit` (exemplar selection, class means, ...)
    test: float  # per test image of the scoring pass after each task
    batch_size: int  # the set's batch size it ran with (the median of the sampled sets')
    threads: int
    device: str  # as a person reads it: 'cpu' or 'cuda:0 (NVIDIA ...)'
    # a fused trial's seconds over its orderings' one after another (compute.fuse_orderings, timed on the same two
    # tasks of S orderings both ways); 1 where the study's orderings are not fused
    fusion: float = 1.0

    def image_epoch_seconds(self, task_index: int) -> float:
        if task_index == 0:
            return self.first_task
        return self.later_tasks * (1 + self.growth * (task_index - 1))


class _Stopwatch:
    """Wraps a callable, summing the seconds its calls take."""

    def __init__(self, fn: Any, device: Any) -> None:
        self.fn, self.device, self.seconds = fn, device, 0.0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        tic = time.perf_counter()
        out = self.fn(*args, **kwargs)
        if self.device.type == "cuda":  # kernels run asynchronously: wait for them
            torch.cuda.synchronize(self.device)
        self.seconds += time.perf_counter() - tic
        return out


def sampled_params(plan: StudyPlan) -> list[tuple[Any, dict[str, Any]]]:
    """The Params of the R sets the study will draw (the same seed draws the same sets)."""
    cfg = plan.resolved.config
    algorithm = ALGORITHMS.get(cfg.algorithm)
    space = load_space(cfg.algorithm, plan.resolved.space_path).space
    return [(algorithm.Params.from_mapping(h), h) for h in sample_sets(space, cfg.search.trials, cfg.seed)]


def phase_job(plan: StudyPlan, phase: PhasePlan, hparams: dict[str, Any], device: str,
              epoch_scale: float) -> OrderingJob:
    """The engine's job of one ordering of the phase, as gtep/orchestration/trial_job.py builds a trial's."""
    resolved = plan.resolved
    cfg = resolved.config
    options = {k: v for k, v in cfg.scenario.family_options.items()
               if k != "increments" and k not in SHOT_FILE_OPTIONS}
    first = FirstTaskSpec(**{**cfg.first_task.model_dump(), "milestones": tuple(cfg.first_task.milestones)})
    protocol_tasks = cfg.search.protocol_tasks if phase is plan.tuning and cfg.search.protocol == "first_task" else None
    return OrderingJob(
        algorithm=cfg.algorithm, hparams=dict(hparams), backbone=cfg.backbone, increments=tuple(resolved.increments),
        classes=tuple(phase.spec.classes), seed=cfg.seed, ordering=0, memory_size=cfg.training.memory_size,
        first_task=first, epoch_scale=epoch_scale, augment=resolved.pipeline(phase.spec.phase).describe(),
        device=device, weights=str(resolved.weights) if resolved.weights else None, dataset=phase.spec.dataset,
        mixed_precision=cfg.training.mixed_precision, compile=cfg.training.compile, family=cfg.scenario.family,
        family_options=tuple(sorted(options.items())), max_tasks=protocol_tasks)


def synthetic_images(job: OrderingJob, phase: PhasePlan, batch_sizes: tuple[int, int]) -> ImageSet:
    """Random images of the phase's stored size: for each class of the first two tasks enough that its task fills
    CALIBRATION_BATCHES batches of its batch size (and its shots); one for every other class."""
    per_class = dict.fromkeys(job.classes, 1)
    for task, batch in zip(job.tasks()[:2], batch_sizes):
        wanted = max(-(-CALIBRATION_BATCHES * batch // max(1, len(task.new_classes))), task.shots or 0)
        per_class.update(dict.fromkeys(task.new_classes, wanted))
    classes = np.asarray(job.classes, dtype=np.int64)
    y_train = np.repeat(classes, [per_class[c] for c in job.classes])
    y_test = np.repeat(classes, CALIBRATION_TEST_PER_CLASS)
    rng = np.random.default_rng(0)
    shape = tuple(phase.facts.image_shape)
    names = [str(c) for c in range(int(classes.max()) + 1)]
    return ImageSet(phase.spec.dataset, rng.integers(0, 256, (len(y_train), *shape), dtype=np.uint8), y_train,
                    rng.integers(0, 256, (len(y_test), *shape), dtype=np.uint8), y_test, names)


def calibration_device(slots: TrialSlots) -> str:
    """The trial's device; the CPU where a trial would get simulated GPUs on a machine without CUDA."""
    return choose_device(slots.device, torch.cuda.is_available(), simulate=True)


def calibrate(plan: StudyPlan, phase: PhasePlan | None = None, budget: CalibrationBudget | None = None) -> Calibration:
    """Time the study's learner as a trial trains it: the trial's threads (torch's count restored after) and
    device, the phase's pipeline, the sampled sets' median batch size and the learner's every stage, on the
    first two tasks of the phase's (the tuning phase's) ordering 0 with synthetic images and one epoch each;
    the repeats after the first and the fusion timing only while `budget` lasts."""
    slots = trial_slots(plan.resolved.config)
    before = torch.get_num_threads()
    torch.set_num_threads(slots.threads)
    try:
        return _timed_tasks(plan, phase or plan.tuning, slots, budget or CalibrationBudget())
    finally:
        torch.set_num_threads(before)


@dataclass(frozen=True)
class TaskTiming:
    """One calibration task: seconds in `fit`, outside it and scoring; what image_epochs counts of it at one
    epoch (its images plus the replayed memory); the test images scored; the model's parameters after it."""

    fit: float
    outside_fit: float
    test: float
    trained: int
    tested: int
    parameters: int


def _timed_tasks(plan: StudyPlan, phase: PhasePlan, slots: TrialSlots, budget: CalibrationBudget) -> Calibration:
    sets = sorted(sampled_params(plan), key=lambda pair: pair[0].batch_size)
    params, hparams = sets[len(sets) // 2]
    job = phase_job(plan, phase, hparams, calibration_device(slots), ONE_EPOCH_SCALE)
    data = synthetic_images(job, phase, (job.first_task.batch_size, params.batch_size))
    start = study_flow(plan).start  # the class-incremental flow's OrderingRun
    warm_up = start(job, data)
    warm_up.train_task(warm_up.tasks[0])
    device = describe_device(warm_up.device)
    repeats: list[list[TaskTiming]] = []
    for repeat in range(CALIBRATION_REPEATS):
        left = f" {repeat + 1}" if repeat + 1 == CALIBRATION_REPEATS else f"s {repeat + 1}-{CALIBRATION_REPEATS}"
        if repeats and budget.spent(f"repeat{left} of {CALIBRATION_REPEATS}"):
            break
        fit = TimedFit()
        repeats.append(_two_tasks(start(job, data, fit), fit, job.memory_size))
        budget.first_estimate(tuning_seconds(plan, from_repeats(repeats, params.batch_size, slots, device)))
    fused = fused_study(plan.resolved.config, slots)
    # a fused study whose budget is spent is counted as its orderings one after another (fusion 1): longer, if
    # anything, than fused
    fusion = fusion_ratio(job, data, plan) if fused and not budget.spent("the fused orderings' timing") else 1.0
    return from_repeats(repeats, params.batch_size, slots, device, fusion)


def from_repeats(repeats: list[list[TaskTiming]], batch_size: int, slots: TrialSlots, device: str,
                 fusion: float = 1.0) -> Calibration:
    """The calibration of the timed repeats: each task's quickest repeat counts (a burst of other work on a shared
    machine slows one repeat, not every one)."""
    first, later = (min((r[i] for r in repeats), key=lambda t: t.fit + t.outside_fit + t.test)
                    for i in (0, len(repeats[0]) - 1))
    timings = [first, later] if later is not first else [first]
    return Calibration(
        first_task=first.fit / first.trained, later_tasks=later.fit / later.trained,
        growth=max(0.0, (later.parameters - first.parameters) / later.parameters),
        outside_fit=sum(t.outside_fit for t in timings) / sum(t.trained for t in timings),
        test=sum(t.test for t in timings) / max(1, sum(t.tested for t in timings)),
        batch_size=batch_size, threads=slots.threads, device=device, fusion=fusion)


def fused_study(cfg: ExperimentConfig, slots: TrialSlots) -> bool:
    """Whether the study's trials train their orderings fused (as gtep/orchestration/trial_job.py decides)."""
    compute = cfg.compute
    return fusion_wanted(compute.fuse_orderings, ALGORITHMS.get(cfg.algorithm), slots.device,
                         compute.parallel_orderings(cfg.search.orderings)) and cfg.search.orderings > 1


def fusion_ratio(job: Any, data: Any, plan: StudyPlan) -> float:
    """A fused trial's seconds over its S orderings' one after another: the calibration's first two tasks of S
    orderings (search.orderings), trained both ways after the warm-up."""
    jobs = [replace(job, ordering=s) for s in range(plan.resolved.config.search.orderings)]

    def two_tasks(spec: Any, fit_mode: FitMode | None = None) -> None:
        run = study_flow(plan).start(spec, data, fit_mode)
        for task in run.tasks[:2]:
            run.train_task(task)

    def timed(fn: Any) -> float:
        tic = time.perf_counter()
        fn()
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()
        return time.perf_counter() - tic

    def one_after_another() -> None:
        for spec in jobs:
            two_tasks(spec)

    alone = timed(one_after_another)
    fused = timed(lambda: run_orderings([partial(two_tasks, spec) for spec in jobs], "fused", job.algorithm))
    return fused / alone if alone > 0 else 1.0


def _two_tasks(run: Any, fit: "TimedFit", memory_size: int) -> list[TaskTiming]:
    """Train the run's first two tasks, timing each: in `fit` (the run's fit mode, a TimedFit), in the scoring
    pass, and the rest."""
    test = _Stopwatch(run.test_row, run.device)
    run.test_row = test
    timings: list[TaskTiming] = []
    seen = 0
    for task in run.tasks[:2]:
        fit.seconds = test.seconds = 0.0
        total = _Stopwatch(run.train_task, run.device)
        total(task)
        images = len(task.new_classes) * (task.shots or int(np.sum(run.data.y_train == task.new_classes[0])))
        trained = images + min(memory_size, seen)  # what image_epochs counts of the task, at one epoch
        seen += images
        timings.append(TaskTiming(fit.seconds, total.seconds - fit.seconds - test.seconds, test.seconds, trained,
                                  int(np.isin(run.data.y_test, task.seen_classes).sum()),
                                  run.learner.parameter_counts()[0]))
    return timings


def ordering_seconds(plan: StudyPlan, phase: PhasePlan, params: Any, calibration: Calibration) -> tuple[float, float]:
    """Seconds one ordering of the phase trains with one set: (task 1, the tasks after it). Each task's images
    plus the replayed memory, times its recipe's epochs, at the calibrated cost of that task; its images once
    more outside `fit`; and the scoring pass over the test images of every class seen so far."""
    cfg = plan.resolved.config
    fixed_first_task = ALGORITHMS.get(cfg.algorithm).fixed_first_task
    job = phase_job(plan, phase, {}, "cpu", cfg.training.epoch_scale)
    costs, seen = [], 0
    for index, ((_, images), spec) in enumerate(zip(phase.tasks, job.tasks())):
        recipe = task_recipe(index, params, job.first_task, cfg.training.epoch_scale, fixed_first_task)
        trained = images + min(cfg.training.memory_size, seen)
        seen += images
        tests = int(phase.facts.test_counts[list(spec.seen_classes)].sum())
        costs.append(trained * recipe.epochs * calibration.image_epoch_seconds(index)
                     + trained * calibration.outside_fit + tests * calibration.test)
    return (costs[0], sum(costs[1:])) if costs else (0.0, 0.0)


# ---------------------------------------------------------------- the other data flows: a part of the run, scaled

# A sampled `fit` (and the pretraining) is timed on one epoch of 1 batch and of this many: the difference is the
# cost per image, the rest the call's own (its optimizer, the epoch's sync), paid once and not per image.
FLOW_FIT_BATCHES = 4


def linear_cost(train: Any, device: Any, batch: int, images: int) -> tuple[float, float]:
    """(seconds per call, seconds per image) of `train(n)`, one epoch on n images: timed on one batch and on
    FLOW_FIT_BATCHES (fewer where `images` holds fewer); where one batch is all there is, all per image."""
    small, large = min(images, batch), min(images, FLOW_FIT_BATCHES * batch)
    one = _Stopwatch(train, device)
    one(small)
    if large <= small:
        return 0.0, one.seconds / max(1, small)
    more = _Stopwatch(train, device)
    more(large)
    per_image = max(0.0, more.seconds - one.seconds) / (large - small) or more.seconds / large
    return max(0.0, one.seconds - per_image * small), per_image


@FIT_MODES.register("timed")
class TimedFit(PlainFit):
    """A calibration run's fit mode: each fit trains as a plain one, and the seconds spent in fits are summed (on
    CUDA, once its kernels have run)."""

    name = "timed"

    def __init__(self) -> None:
        self.seconds = 0.0

    def fit(self, call: FitCall) -> None:
        tic = time.perf_counter()
        try:
            self.run_plain(call)
        finally:
            if call.trainer.device.type == "cuda":  # kernels run asynchronously: wait for them
                torch.cuda.synchronize(call.trainer.device)
            self.seconds += time.perf_counter() - tic


@FIT_MODES.register("sampled")
class SampledFit(FitMode):
    """A calibration run's fit mode for the flows timed in part: each fit trains one epoch on its first batches
    (linear_cost), timed, and counts what the call would have cost at its full images x epochs (the first call
    runs once more before, as the warm-up)."""

    name = "sampled"

    def __init__(self) -> None:
        self.seconds = 0.0  # spent here, in the sampled epochs
        self.full_seconds = 0.0  # what the calls would have taken in full
        self.calls = 0

    def fit(self, call: FitCall) -> None:
        recipe, x = call.recipe, call.x
        if len(x) == 0 or recipe.epochs < 1:
            return
        one_epoch = replace(call, recipe=replace(recipe, epochs=1, milestones=()))

        def train(n: int) -> None:
            self.run_plain(replace(one_epoch, x=x[:n], y=call.y[:n]))

        tic = time.perf_counter()
        if self.calls == 0:
            train(min(len(x), recipe.batch_size))
        per_call, per_image = linear_cost(train, call.trainer.device, recipe.batch_size, len(x))
        self.calls += 1
        self.seconds += time.perf_counter() - tic
        self.full_seconds += per_call + per_image * len(x) * recipe.epochs


@dataclass(frozen=True)
class FlowCalibration:
    """One ordering of a flow that is not timed by images x epochs (Flow.by_image_epochs: multi_label, stream,
    continual_few_shot, a plugin's), run in part as a trial runs it: seconds per unit of work outside `fit`, and
    `fit`'s seconds at full images x epochs per unit ** fit_power (Flow.fit_power: a FLUID update trains on every
    sample seen so far, so n samples cost n ** 2)."""

    outside_fit: float  # seconds per unit: predictions, scoring, memory, support sets
    fit: float  # seconds per unit ** fit_power
    fit_power: int
    unit: str
    timed_units: int
    timed_seconds: float  # what the calibration run itself took
    batch_size: int
    threads: int
    device: str

    def seconds(self, units: int) -> float:
        return self.outside_fit * units + self.fit * units ** self.fit_power


def study_flow(plan: StudyPlan) -> Flow:
    """The engine flow that runs the study's family (its data_flow)."""
    return flow_of(plan.resolved.family.data_flow)


def phase_images(plan: StudyPlan, phase: PhasePlan) -> ImageSet:
    """The phase's own images (their labels make the IIRC hierarchy, the FLUID stream and the CFSL tasks), and
    the extra classes its family shows besides (FLUID's pretrain classes)."""
    extra = plan.resolved.family.data_classes(plan.resolved.config.scenario.family_options)
    return resolve_dataset(phase.spec.dataset).load().subset(sorted({*phase.spec.classes, *extra}))


def flow_run(plan: StudyPlan, phase: PhasePlan, hparams: dict[str, Any], device: str, data: ImageSet,
             fit_mode: FitMode | None = None) -> Any:
    """The flow's run object of ordering 0 of the phase, as the flow builds it for a trial (Flow.start)."""
    job = phase_job(plan, phase, hparams, device, plan.resolved.config.training.epoch_scale)
    return study_flow(plan).start(job, data, fit_mode)


def flow_units(plan: StudyPlan, phase: PhasePlan, data: ImageSet | None = None) -> int:
    """Units of work of one ordering of the phase, as the flow counts them on its own run object (Flow.units)."""
    run = flow_run(plan, phase, sampled_params(plan)[0][1], "cpu", data or phase_images(plan, phase))
    return study_flow(plan).units(run)


def calibrate_flow(plan: StudyPlan, data: ImageSet | None = None, budget: CalibrationBudget | None = None,
                   ordering_units: int | None = None) -> FlowCalibration:
    """Run the part of ordering 0 of the tuning phase its flow says to time (Flow.time_part: every IIRC task; a
    FLUID stream's first samples; CFSL's task 2, task 1 the warm-up) as a trial runs it (the trial's threads and
    device, the median set's hyperparameters, the real learner and data), `fit` sampled (SampledFit), the part cut
    short once `budget` is spent (`ordering_units`: a tuning ordering's units, for its first estimate; counted on
    the run where not given)."""
    slots = trial_slots(plan.resolved.config)
    before = torch.get_num_threads()
    torch.set_num_threads(slots.threads)
    try:
        return _timed_flow(plan, data or phase_images(plan, plan.tuning), slots, budget or CalibrationBudget(),
                           ordering_units)
    finally:
        torch.set_num_threads(before)


def takes_stop(flow: Flow) -> bool:
    """Whether the flow's time_part takes the budget's `stop` (a plugin's flow written before it runs its part
    whole)."""
    try:
        return "stop" in inspect.signature(flow.time_part).parameters
    except (TypeError, ValueError):
        return False


def _timed_flow(plan: StudyPlan, data: ImageSet, slots: TrialSlots, budget: CalibrationBudget,
                ordering_units: int | None) -> FlowCalibration:
    flow = study_flow(plan)
    cfg = plan.resolved.config
    sets = sorted(sampled_params(plan), key=lambda pair: pair[0].batch_size)
    params, hparams = sets[len(sets) // 2]
    fit_mode = SampledFit()
    run = flow_run(plan, plan.tuning, hparams, calibration_device(slots), data, fit_mode)
    fit = fit_mode if hasattr(run, "trainer") else None  # CFSL's learners train without the engine's Trainer
    device = describe_device(run.device)

    def calibration(units: int, seconds: float, total: float) -> FlowCalibration:
        sampled, full = (fit.seconds, fit.full_seconds) if fit is not None else (0.0, 0.0)
        return FlowCalibration(
            outside_fit=max(0.0, seconds - sampled) / units, fit=full / units ** flow.fit_power,
            fit_power=flow.fit_power, unit=flow.unit, timed_units=units, timed_seconds=total,
            batch_size=params.batch_size, threads=slots.threads, device=device)

    def stop(units: int, seconds: float) -> bool:
        nonlocal ordering_units
        if ordering_units is None:
            ordering_units = flow.units(run)
        tuning = calibration(units, seconds, seconds).seconds(ordering_units) * cfg.search.trials * cfg.search.orderings
        budget.first_estimate(tuning)
        return budget.spent(f"the {flow.unit}s of the part after the first {units}")

    tic = time.perf_counter()
    part = flow.time_part(run, stop) if takes_stop(flow) else flow.time_part(run)
    return calibration(part.units, part.seconds, time.perf_counter() - tic)


def compute_flow_estimate(plan: StudyPlan, calibration: FlowCalibration | None = None) -> dict[str, Any]:
    """Seconds of training each phase of a study whose flow is timed in part (not by_image_epochs) should take here:
    the calibration's seconds per unit, scaled to the units the flow counts in each phase's ordering
    (FlowCalibration.seconds)."""
    budget = CalibrationBudget()
    tuning_data = phase_images(plan, plan.tuning)
    units = {"tune": flow_units(plan, plan.tuning, tuning_data), "evaluate": flow_units(plan, plan.evaluation)}
    calibration = calibration or calibrate_flow(plan, tuning_data, budget, units["tune"])
    budget.end()
    cfg = plan.resolved.config
    trials, orderings = cfg.search.trials, cfg.search.orderings
    unit = calibration.seconds(units["tune"])
    tuning = unit * trials * orderings
    slots = trial_slots(cfg)
    at_once = min(slots.slots, trials)
    return {"calibration": calibration, "slots": slots, "units": units, "unit_seconds": unit,
            "tuning_seconds": tuning, "evaluation_seconds": calibration.seconds(units["evaluate"]) * orderings,
            "tuning_wall_seconds": tuning * -(-trials // at_once) / trials, "trials_at_once": at_once,
            "device": calibration.device, "budget": budget}


# ---------------------------------------------------------------- the pretrain section's cost

@dataclass(frozen=True)
class PretrainEstimate:
    """The pretrain section's seconds: a few of its steps timed, scaled to its epochs x images (episodes for
    protonet)."""

    seconds: float
    images: int
    epochs: int
    per_step: float  # seconds per image-epoch (supervised) or per episode (protonet)
    step: str  # 'image-epoch' or 'episode'
    steps: int


def pretrain_estimate(plan: StudyPlan, spec: Any) -> PretrainEstimate:
    """Time the pretrain section's recipe (`spec`: gtep.engine.pretrain.PretrainSpec, as
    gtep/orchestration/pretraining.py builds it) on its own images with a trial's threads, as the study's
    pretraining runs: a warm-up and then one epoch of CALIBRATION_BATCHES batches (supervised), or a warm-up
    episode and two timed ones (protonet)."""
    assert plan.resolved.pretraining is not None
    before = torch.get_num_threads()
    torch.set_num_threads(max(1, int(plan.resolved.config.compute.cpus_per_trial)))
    try:
        return _timed_pretraining(spec, plan.resolved.pretraining.dataset)
    finally:
        torch.set_num_threads(before)


def _timed_pretraining(spec: Any, dataset: str) -> PretrainEstimate:
    source = resolve_dataset(dataset)
    subset = training_subset(source.load().subset(list(spec.classes)), spec)
    device = resolve_device(spec.device)
    relabel = {c: i for i, c in enumerate(spec.classes)}
    tensors = PhaseTensors(subset, list(spec.classes), device, pretraining_pipeline(spec.backbone, source.name))
    x = tensors.images("train", np.ones(len(subset.y_train), dtype=bool))
    y = torch.as_tensor([relabel[int(c)] for c in subset.y_train], device=device)
    backbone = create_backbone(spec.backbone).to(device)
    images = len(y)
    if spec.method == "protonet":
        def embed(xb: Any) -> Any:
            return backbone(xb)["features"]

        def episodes(n: int) -> Any:
            return train_prototypical(backbone, embed, x, y, ways=spec.ways, shots=spec.shots, queries=spec.queries,
                                      episodes=n, lr=spec.lr, generator=torch.Generator().manual_seed(spec.seed))
        episodes(1)
        timed = _Stopwatch(episodes, device)
        timed(2)
        total = spec.epochs * max(1, images // (spec.ways * (spec.shots + spec.queries)))
        return PretrainEstimate(timed.seconds / 2 * total, images, spec.epochs, timed.seconds / 2, "episode", total)
    head = nn.Linear(backbone.out_dim, len(spec.classes)).to(device)
    one_epoch = replace(spec, epochs=1)

    def train(n: int) -> None:
        train_supervised(backbone, head, x[:n], y[:n], one_epoch, None)

    train(min(images, spec.batch_size))  # the warm-up
    per_call, per_image = linear_cost(train, device, spec.batch_size, images)
    return PretrainEstimate(per_call + per_image * images * spec.epochs, images, spec.epochs, per_image,
                            "image-epoch", images * spec.epochs)


def no_estimate_reason(plan: StudyPlan) -> str | None:
    """Why neither `compute_estimate` nor `compute_flow_estimate` covers the study's family, or None."""
    name = plan.resolved.family.data_flow
    if name not in FLOWS:
        return f"no engine flow runs its {name} data flow (gtep/engine/flows)"
    if FLOWS.get(name).by_image_epochs and not (plan.tuning.tasks and plan.evaluation.tasks):
        return f"its {name} data flow is timed by tasks of images, and the family describes no tasks"
    return None


def estimate(plan: StudyPlan) -> dict[str, Any]:
    """The study's estimate as its flow is calibrated: `compute_estimate` for a flow timed by images x epochs,
    else `compute_flow_estimate`."""
    return compute_estimate(plan) if study_flow(plan).by_image_epochs else compute_flow_estimate(plan)


def same_work(plan: StudyPlan) -> bool:
    """Whether both phases train on images of one size through one pipeline (one calibration serves both)."""
    return (plan.tuning.facts.image_shape == plan.evaluation.facts.image_shape
            and plan.resolved.pipeline("tune").describe() == plan.resolved.pipeline("evaluate").describe())


def compute_estimate(plan: StudyPlan, calibration: Calibration | None = None) -> dict[str, Any]:
    """Seconds of training each phase should take on this machine (for families whose work is tasks of classes):
    every sampled set's ordering at the calibrated costs; task 1 counted once per ordering where the study
    shares it between the sets (training.reuse_first_task); and the wall time with the trials that run at once."""
    budget = CalibrationBudget()
    calibration = calibration or calibrate(plan, budget=budget)
    # the evaluation phase timed on its own where its images or pipeline differ (a cross-dataset study)
    evaluation_calibration = calibration if same_work(plan) else calibrate(plan, plan.evaluation, budget)
    budget.end()
    cfg = plan.resolved.config
    trials, orderings = cfg.search.trials, cfg.search.orderings
    evaluation = 0.0
    sets = sampled_params(plan)
    for params, _ in sets:
        evaluation += sum(ordering_seconds(plan, plan.evaluation, params, evaluation_calibration)) / len(sets)
    slots = trial_slots(cfg)
    at_once = min(slots.slots, trials)
    tuning = tuning_seconds(plan, calibration)
    evaluation *= evaluation_calibration.fusion
    return {"seconds_per_image": calibration.later_tasks, "calibration": calibration, "slots": slots,
            "tuning_seconds": tuning, "evaluation_seconds": evaluation * orderings,
            "tuning_wall_seconds": tuning * -(-trials // at_once) / trials, "trials_at_once": at_once,
            "unit_seconds": tuning / (trials * orderings), "device": calibration.device, "budget": budget}


def tuning_seconds(plan: StudyPlan, calibration: Calibration) -> float:
    """Seconds of training the tuning phase should take at the calibrated costs: every sampled set's ordering,
    task 1 counted once per ordering where the study shares it (training.reuse_first_task), a fused trial as what
    it costs."""
    cfg = plan.resolved.config
    shared_first = cfg.training.reuse_first_task and ALGORITHMS.get(cfg.algorithm).fixed_first_task
    sets = sampled_params(plan)
    tuning = 0.0
    for params, _ in sets:
        first, later = ordering_seconds(plan, plan.tuning, params, calibration)
        tuning += later + (first / len(sets) if shared_first else first)
    return tuning * cfg.search.orderings * cfg.search.trials / len(sets) * calibration.fusion
