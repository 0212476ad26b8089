"""The pre-flight pass: what a study needs of its config, data, files and paths, checked before any compute.

Every command that trains (gtep tune | evaluate | run, each cell of gtep matrix) runs `preflight` before Ray or
MLflow start, and `gtep check` runs it alone and prints the plan. It adds to `resolve` (names, classes, the
protocol's constraints: gtep/config/) what needs the data and the files:

- each phase's data as its loader will hand it over (gtep/data/datasets.py: dtype and range, NaN, shapes,
  labels), with any conversion said in the plan, the log and the runs' params (`gtep.data_conversion`);
- what the scenario family needs of each phase's classes (ScenarioFamily.check: images to train and test
  every class, FSCIL's K shots and its shot index file, CFSL's samples per class, ...);
- every value of the search space within the ranges the learner's parameters declare (gtep/algorithms/base.py);
- the backbone weights: a readable file whose tensors fit the backbone;
- the study's folder: a name the filesystem takes, a path short enough for what gtep writes inside it, and a
  parent it can create;
- the device: `training.device: cuda` where torch finds no CUDA (a local study).

Every failure is one ConfigError naming the field and the fix; nothing is written. `gtep check --calibrate` also
estimates the training time (compute_estimate: a few real training steps of the learner, timed as a trial runs).
"""
from __future__ import annotations

import dataclasses
import itertools
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from gtep.config import ConfigError, ExperimentConfig, PhaseSpec, ResolvedExperiment, resolve
from gtep.data import DataFacts, DatasetError, resolve_dataset
from gtep.protocol.families import PhaseData

# What gtep and Ray write below a study folder, at most (Ray's trial folders carry the trial's parameters,
# truncated, and a timestamp): the study's path must leave this much room under the system's path limit.
NESTED_PATH_ROOM = 400
# MLflow names the study's experiment "gtep/<study>" in a column of 256 characters.
MLFLOW_NAME_ROOM = 250


@dataclass(frozen=True)
class PhasePlan:
    """One phase as the pre-flight pass found it."""

    spec: PhaseSpec
    facts: DataFacts
    tasks: tuple[tuple[str, int], ...]  # (what a task holds, training images) for ordering 0

    @property
    def train_images(self) -> int:
        return int(sum(self.facts.train_counts[list(self.spec.classes)]))

    @property
    def test_images(self) -> int:
        return int(sum(self.facts.test_counts[list(self.spec.classes)]))


@dataclass(frozen=True)
class StudyPlan:
    """A study checked against its data: the resolved experiment and each phase's plan."""

    resolved: ResolvedExperiment
    tuning: PhasePlan
    evaluation: PhasePlan


def dataset_field(cfg: ExperimentConfig, phase: str) -> str:
    if cfg.datasets.split is not None:
        return "datasets.split.dataset"
    return f"datasets.{'tuning' if phase == 'tune' else 'evaluation'}.dataset"


def phase_facts(cfg: ExperimentConfig, spec: PhaseSpec) -> DataFacts:
    try:
        return resolve_dataset(spec.dataset).facts
    except DatasetError as err:
        raise ConfigError(dataset_field(cfg, spec.phase), str(err)) from None


def phase_data(spec: PhaseSpec, facts: DataFacts, extra: tuple[int, ...] = ()) -> PhaseData:
    """The phase's classes and their image counts, and the counts of the `extra` classes its family shows besides
    them (FLUID's pretrain classes: ScenarioFamily.data_classes)."""
    counts = {c: (int(facts.train_counts[c]), int(facts.test_counts[c])) for c in (*spec.classes, *extra)}
    return PhaseData(spec.phase, spec.dataset, spec.classes, {c: n[0] for c, n in counts.items()},
                     {c: n[1] for c, n in counts.items()}, facts.train_labels)


def check_phases(resolved: ResolvedExperiment) -> tuple[PhasePlan, PhasePlan]:
    """Both phases' data as their family needs it (ScenarioFamily.check: the first problem is the error), and
    what ordering 0 of each will do."""
    cfg = resolved.config
    options = cfg.scenario.family_options
    extra = resolved.family.data_classes(options)
    specs = (resolved.tuning, resolved.evaluation)
    facts = [phase_facts(cfg, spec) for spec in specs]
    data = [phase_data(spec, fact, extra) for spec, fact in zip(specs, facts)]
    problems = resolved.family.check(data, options)
    if problems:
        problem = problems[0]
        field = dataset_field(cfg, problem.phase) if problem.field == "datasets" else problem.field
        raise ConfigError(field, problem.message)
    tuning, evaluation = (PhasePlan(spec, fact, tuple(resolved.family.describe(phase, options, cfg.seed)))
                          for spec, fact, phase in zip(specs, facts, data))
    return tuning, evaluation


def check_pretrain_data(resolved: ResolvedExperiment) -> None:
    """The pretrain section's classes have training images to learn from."""
    plan = resolved.pretraining
    if plan is None:
        return
    try:
        facts = resolve_dataset(plan.dataset).facts
    except DatasetError as err:
        raise ConfigError("pretrain.dataset", str(err)) from None
    empty = [c for c in plan.classes if facts.train_counts[c] == 0]
    if empty:
        raise ConfigError("pretrain.classes", f"classes {empty[:5]} have no training images in {plan.dataset}; "
                          "pretrain on classes that have some")
    check_pretrain_episodes(resolved, facts.train_counts)


def check_pretrain_episodes(resolved: ResolvedExperiment, train_counts: np.ndarray) -> None:
    """protonet pretraining draws `ways` classes an episode, each with shots + queries training images (those the
    family's holdout leaves to pretraining): too few such classes is refused here, not as a traceback inside the
    pretraining step (gtep.algorithms._episodic.class_indices)."""
    section, plan = resolved.config.pretrain, resolved.pretraining
    if section is None or plan is None or section.method != "protonet":
        return
    from gtep.protocol.holdout import held_out_count

    share, held_classes = resolved.family.pretrain_holdout(resolved.config.scenario.family_options)
    need = section.shots + section.queries
    usable = {c: int(train_counts[c]) - (held_out_count(int(train_counts[c]), share) if c in held_classes else 0)
              for c in plan.classes}
    enough = [c for c, n in usable.items() if n >= need]
    if len(enough) < section.ways:
        fewest = min(usable.values())
        left = " (after the scenario's pretrain_holdout)" if share else ""
        raise ConfigError("pretrain.ways", f"is {section.ways}, but only {len(enough)} of the {len(plan.classes)} "
                          f"pretrain classes have shots + queries = {need} training images{left} (the fewest has "
                          f"{fewest}); lower pretrain.ways, shots or queries, or pretrain on more classes")


def check_weights_fit(weights: Path, backbone: str) -> None:
    """The weights file loads into the backbone: every tensor has its place and shape (a file of another network,
    a damaged file or a pickle that is not a state dict is refused here, not inside a trial)."""
    from gtep.models import create_backbone

    try:
        create_backbone(backbone, str(weights))
    except Exception as err:  # noqa: BLE001 - safetensors, torch.load and load_state_dict each raise their own
        reason = str(err).splitlines()[0][:200] if str(err) else err.__class__.__name__
        raise ConfigError("weights", f"{weights} is not a readable weights file for {backbone} ({reason}); give "
                          f"a safetensors file or a state dict of {backbone} (gtep pretrain writes one)") from None


def _existing_ancestor(path: Path) -> Path:
    for candidate in (path, *path.parents):
        try:
            if candidate.exists():
                return candidate
        except OSError:  # a name too long for the filesystem: check_study_path says so
            continue
    return Path("/")


def check_study_path(cfg: ExperimentConfig) -> None:
    """The study's folder can be made and holds what gtep writes: a name the filesystem and MLflow take, a path
    with room for Ray's trial folders, and a writable existing parent."""
    study_dir = Path(os.path.abspath(os.path.expanduser(cfg.study_dir)))
    anchor = _existing_ancestor(study_dir)
    try:
        name_max = os.pathconf(anchor, "PC_NAME_MAX")
        path_max = os.pathconf(anchor, "PC_PATH_MAX")
    except (OSError, ValueError):
        name_max, path_max = 255, 4096
    limit = min(name_max, MLFLOW_NAME_ROOM)
    if len(cfg.study.encode()) > limit:
        raise ConfigError("study", f"is {len(cfg.study.encode())} bytes long; the filesystem and MLflow take "
                          f"names of at most {limit}: shorten it")
    too_long = [p.name for p in (study_dir, *study_dir.parents) if len(p.name.encode()) > name_max]
    if too_long:
        raise ConfigError("tracking.output", f"holds the folder name {too_long[0][:40]}..., longer than the "
                          f"filesystem's {name_max} bytes; give a shorter path")
    if len(str(study_dir).encode()) + NESTED_PATH_ROOM > path_max:
        raise ConfigError("tracking.output", f"the study folder {str(study_dir)[:60]}... is {len(str(study_dir))} "
                          f"characters long; with what gtep writes inside it, paths would pass the system's limit "
                          f"of {path_max}: give a shorter --output or study name")
    if anchor.is_dir() and not os.access(anchor, os.W_OK):
        raise ConfigError("tracking.output", f"{anchor} is not writable, so {study_dir} cannot be made there; "
                          "give a folder you can write")


def check_device(cfg: ExperimentConfig) -> None:
    """`training.device: cuda` on a machine without CUDA: every trial would fail once Ray has started. Only the
    device asked for by name, and only where trials run on this machine (a cluster's workers may have GPUs the
    driver lacks); `auto` falls back on the CPU, and gpus_per_trial is Ray's business."""
    import torch

    device = cfg.training.device
    if device.startswith("cuda") and cfg.compute.ray_address is None and not torch.cuda.is_available():
        raise ConfigError("training.device", f"{device!r} asks for CUDA, but this machine has no CUDA device "
                          "torch can use; set training.device to 'auto' (a trial's GPUs when it has some, else "
                          "the CPU) or 'cpu'")


def data_conversions(plan: StudyPlan) -> dict[str, str]:
    """Phase -> what its loader converted to reach uint8 pixels (only phases whose data needed it)."""
    return {p.spec.phase: p.facts.conversion for p in (plan.tuning, plan.evaluation) if p.facts.conversion}


def check_space_values(resolved: ResolvedExperiment) -> None:
    """Every value of the search space and of its presets within the ranges the learner's Params declare, and every
    combination the space can draw within their rules across hyperparameters (top_k at most pool_size). A value
    the learner refuses would fail inside a Ray trial, after the study folder is written; one it takes but cannot
    use (an empty A-GEM memory batch) would train another method under its name."""
    from gtep.algorithms import ALGORITHMS
    from gtep.spaces import load_space

    algorithm = resolved.config.algorithm
    params = ALGORITHMS.get(algorithm).Params
    space = load_space(algorithm, resolved.space_path)
    fix = f"give values {algorithm} accepts (the ranges of {params.__name__}, gtep/algorithms)"
    for name, values in space.space.sets.items():
        for value in values:
            problem = params.range_problem(name, value)
            if problem:
                raise ConfigError("search.space", f"{space.path}: in space.{name}, {problem}; {fix}")
    defaults = dataclasses.asdict(params())
    for preset, chosen in space.presets.items():
        problem = next((p for p in (params.range_problem(k, v) for k, v in chosen.items()) if p), None)
        problem = problem or next((p for p in (c.problem({**defaults, **chosen}) for c in params.all_constraints())
                                   if p), None)
        if problem:
            raise ConfigError("search.space", f"{space.path}: in presets.{preset}, {problem}; {fix}")
    for rule in params.all_constraints():
        choices = [space.space.sets.get(name, (defaults[name],)) for name in rule.names]
        for combination in itertools.product(*choices):
            problem = rule.problem({**defaults, **dict(zip(rule.names, combination))})
            if problem:
                raise ConfigError("search.space", f"{space.path}: the space can draw {problem}")


def check_learner_limits(resolved: ResolvedExperiment) -> None:
    """A learner's limits that depend on the scenario (nc_fscil's ETF against the classes the sessions reach,
    feature_rectification's FR layers against the ViT's depth, cec's episodes against the base session), for
    every value the search space can give the parameters they concern: one error here, before any compute, not a
    traceback from a Ray trial. A learner states them as `scenario_limits` (its parameters) and `scenario_problem`."""
    from gtep.algorithms import ALGORITHMS
    from gtep.models.vit import vit_depth
    from gtep.spaces import load_space

    cfg = resolved.config
    algorithm = ALGORITHMS.get(cfg.algorithm)
    problem_of = getattr(algorithm, "scenario_problem", None)
    names = tuple(getattr(algorithm, "scenario_limits", ()))
    if problem_of is None:
        return
    space = load_space(cfg.algorithm, resolved.space_path)
    defaults = dataclasses.asdict(algorithm.Params())
    facts = {"classes": sum(resolved.increments), "base_classes": resolved.increments[0], "backbone": cfg.backbone,
             "vit_depth": vit_depth(cfg.backbone)}
    choices = [space.space.sets.get(name, (defaults[name],)) for name in names]
    drawn = [name for name in names if name in space.space.sets]
    candidates = [({**defaults, **dict(zip(names, c))},
                   f"{space.path} can draw it" if drawn else f"{algorithm.Params.__name__}'s default")
                  for c in itertools.product(*choices)]
    candidates += [({**defaults, **chosen}, f"presets.{preset} of {space.path}")
                   for preset, chosen in space.presets.items() if set(chosen) & set(names)]
    for values, where in candidates:
        problem = problem_of(values, facts)
        if problem:
            field = "algorithm" if where.endswith("default") else "search.space"
            raise ConfigError(field, f"{cfg.algorithm}: {problem} ({where}; a search.space file of your own sets "
                              "it)")


def check_fusion(cfg: ExperimentConfig) -> None:
    """compute.fuse_orderings: on asks for a learner that opts in (gtep/engine/fusion.py) and orderings that run one
    after another in the trial's process."""
    if cfg.compute.fuse_orderings != "on":
        return
    from gtep.algorithms import ALGORITHMS
    from gtep.engine.fusion import FusionRefused, check_fusable

    try:
        check_fusable(ALGORITHMS.get(cfg.algorithm), cfg.algorithm)
    except FusionRefused as err:
        raise ConfigError("compute.fuse_orderings", f"is on, but {err}") from None
    if cfg.compute.parallel_orderings(cfg.search.orderings) > 1:
        raise ConfigError("compute.fuse_orderings", "is on, which trains a trial's orderings together in its one "
                          "process, but cpus_per_ordering/gpus_per_ordering run them as parallel tasks; leave those "
                          "out, or set fuse_orderings: off")


def preflight(cfg: ExperimentConfig) -> StudyPlan:
    """resolve(cfg), then everything that needs the data, the files and the paths; before any compute."""
    resolved = resolve(cfg)
    check_space_values(resolved)
    check_fusion(cfg)
    check_learner_limits(resolved)
    check_study_path(cfg)
    check_device(cfg)
    if cfg.weights is not None:
        check_weights_fit(cfg.weights, cfg.backbone)
    check_pretrain_data(resolved)
    tuning, evaluation = check_phases(resolved)
    plan = StudyPlan(resolved, tuning, evaluation)
    resolved = replace(resolved, data_conversions=data_conversions(plan))
    return replace(plan, resolved=resolved)


def training_images(plan: PhasePlan) -> int:
    return sum(images for _, images in plan.tasks)


def plan_summary(plan: StudyPlan) -> dict[str, Any]:
    """The numbers `gtep check` prints (and tests read): units, orderings, images."""
    cfg = plan.resolved.config
    trials, orderings = cfg.search.trials, cfg.search.orderings
    return {"tuning_units": trials * orderings, "evaluation_units": orderings,
            "tuning_images_per_ordering": training_images(plan.tuning),
            "evaluation_images_per_ordering": training_images(plan.evaluation),
            "classes": {p.spec.phase: len(p.spec.classes) for p in (plan.tuning, plan.evaluation)},
            "tasks": {p.spec.phase: len(p.tasks) for p in (plan.tuning, plan.evaluation)},
            "conversions": data_conversions(plan), "data_flow": plan.resolved.family.data_flow,
            "mean_image_shape": np.asarray(plan.tuning.facts.image_shape).tolist()}


# ---------------------------------------------------------------- an estimate of the training compute

def image_epochs(plan: StudyPlan, phase: PhasePlan) -> float:
    """Training images x epochs of one ordering, averaged over the R sets the study will draw (the same seed
    draws the same sets): each task's images, plus the exemplar memory a later task replays, times the epochs
    its recipe gives (Table 3's first task, the set's epochs after it)."""
    from gtep.algorithms import ALGORITHMS
    from gtep.engine.runner import FirstTaskSpec, task_recipe
    from gtep.protocol.sampling import sample_sets
    from gtep.spaces import load_space

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


@dataclass(frozen=True)
class TrialSlots:
    """How a trial trains (its threads and device, as gtep/orchestration/trial_job.py gives them) and how many
    trials this machine runs at once."""

    threads: int
    device: str  # 'cpu', 'cuda' or 'cuda:N'
    slots: int
    counted: str  # how the slots were counted, as the output says it


def trial_slots(cfg: ExperimentConfig) -> TrialSlots:
    import torch

    compute = cfg.compute
    parallel = compute.parallel_orderings(cfg.search.orderings)
    cpus = compute.cpus_per_ordering if parallel > 1 and compute.cpus_per_ordering else compute.cpus_per_trial
    device = cfg.training.device
    if device == "auto":  # a trial without GPUs trains on the CPU, whatever the machine has
        device = "cuda" if compute.gpus_per_trial > 0 else "cpu"
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
        import time

        import torch

        tic = time.perf_counter()
        out = self.fn(*args, **kwargs)
        if self.device.type == "cuda":  # kernels run asynchronously: wait for them
            torch.cuda.synchronize(self.device)
        self.seconds += time.perf_counter() - tic
        return out


def sampled_params(plan: StudyPlan) -> list[tuple[Any, dict[str, Any]]]:
    """The Params of the R sets the study will draw (the same seed draws the same sets)."""
    from gtep.algorithms import ALGORITHMS
    from gtep.protocol.sampling import sample_sets
    from gtep.spaces import load_space

    cfg = plan.resolved.config
    algorithm = ALGORITHMS.get(cfg.algorithm)
    space = load_space(cfg.algorithm, plan.resolved.space_path).space
    return [(algorithm.Params.from_mapping(h), h) for h in sample_sets(space, cfg.search.trials, cfg.seed)]


def phase_job(plan: StudyPlan, phase: PhasePlan, hparams: dict[str, Any], device: str, epoch_scale: float) -> Any:
    """The engine's job of one ordering of the phase, as gtep/orchestration/trial_job.py builds a trial's."""
    from gtep.engine.runner import FirstTaskSpec, OrderingJob

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


def synthetic_images(job: Any, phase: PhasePlan, batch_sizes: tuple[int, int]) -> Any:
    """Random images of the phase's stored size: for each class of the first two tasks enough that its task fills
    CALIBRATION_BATCHES batches of its batch size (and its shots); one for every other class."""
    from gtep.data import ImageSet

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
    import torch

    return slots.device if not slots.device.startswith("cuda") or torch.cuda.is_available() else "cpu"


def calibrate(plan: StudyPlan, phase: PhasePlan | None = None) -> Calibration:
    """Time the study's learner as a trial trains it: the trial's threads (torch's count restored after) and
    device, the phase's pipeline, the sampled sets' median batch size and the learner's every stage, on the
    first two tasks of the phase's (the tuning phase's) ordering 0 with synthetic images and one epoch each."""
    import torch

    slots = trial_slots(plan.resolved.config)
    before = torch.get_num_threads()
    torch.set_num_threads(slots.threads)
    try:
        return _timed_tasks(plan, phase or plan.tuning, slots)
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


def _timed_tasks(plan: StudyPlan, phase: PhasePlan, slots: TrialSlots) -> Calibration:
    from gtep.engine.device import describe_device
    from gtep.engine.runner import OrderingRun

    sets = sorted(sampled_params(plan), key=lambda pair: pair[0].batch_size)
    params, hparams = sets[len(sets) // 2]
    job = phase_job(plan, phase, hparams, calibration_device(slots), ONE_EPOCH_SCALE)
    data = synthetic_images(job, phase, (job.first_task.batch_size, params.batch_size))
    warm_up = OrderingRun(job, data)
    warm_up.train_task(warm_up.tasks[0])
    repeats = [_two_tasks(OrderingRun(job, data), job.memory_size) for _ in range(CALIBRATION_REPEATS)]
    # each task's quickest repeat: a burst of other work on a shared machine slows one repeat, not every one
    first, later = (min((r[i] for r in repeats), key=lambda t: t.fit + t.outside_fit + t.test)
                    for i in (0, len(repeats[0]) - 1))
    timings = [first, later] if later is not first else [first]
    fusion = fusion_ratio(job, data, plan) if fused_study(plan.resolved.config, slots) else 1.0
    return Calibration(
        first_task=first.fit / first.trained, later_tasks=later.fit / later.trained,
        growth=max(0.0, (later.parameters - first.parameters) / later.parameters),
        outside_fit=sum(t.outside_fit for t in timings) / sum(t.trained for t in timings),
        test=sum(t.test for t in timings) / max(1, sum(t.tested for t in timings)),
        batch_size=params.batch_size, threads=slots.threads, device=describe_device(warm_up.device), fusion=fusion)


def fused_study(cfg: ExperimentConfig, slots: TrialSlots) -> bool:
    """Whether the study's trials train their orderings fused (as gtep/orchestration/trial_job.py decides)."""
    from gtep.algorithms import ALGORITHMS
    from gtep.engine.fusion import fusion_wanted

    compute = cfg.compute
    return fusion_wanted(compute.fuse_orderings, ALGORITHMS.get(cfg.algorithm), slots.device,
                         compute.parallel_orderings(cfg.search.orderings)) and cfg.search.orderings > 1


def fusion_ratio(job: Any, data: Any, plan: StudyPlan) -> float:
    """A fused trial's seconds over its S orderings' one after another: the calibration's first two tasks of S
    orderings (search.orderings), trained both ways after the warm-up."""
    import time
    from functools import partial

    import torch

    from gtep.engine.fusion import run_in_lockstep
    from gtep.engine.runner import OrderingRun

    jobs = [replace(job, ordering=s) for s in range(plan.resolved.config.search.orderings)]

    def two_tasks(spec: Any) -> None:
        run = OrderingRun(spec, data)
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
    fused = timed(lambda: run_in_lockstep([partial(two_tasks, spec) for spec in jobs]))
    return fused / alone if alone > 0 else 1.0


def _two_tasks(run: Any, memory_size: int) -> list[TaskTiming]:
    """Train the run's first two tasks, timing each: in `fit`, in the scoring pass, and the rest."""
    fit, test = _Stopwatch(run.trainer.fit, run.device), _Stopwatch(run.test_row, run.device)
    run.trainer.fit, run.test_row = fit, test
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
    from gtep.algorithms import ALGORITHMS
    from gtep.engine.runner import task_recipe

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

# The flows whose work is not tasks of images x epochs, and what their calibration counts as a unit of work.
FLOW_UNITS = {"multi_label": "task", "stream": "stream sample", "continual_few_shot": "support set"}
# A FLUID stream longer than this is timed on its first this-many samples and scaled to its length.
CALIBRATION_STREAM_STEPS = 1000
# CFSL: the first task is a warm-up and discarded; the next this-many tasks are timed.
CALIBRATION_TIMED_TASKS = 1


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


class _SampledFit:
    """Stands in for the trainer's `fit` in a calibration run: each call trains one epoch on its first batches
    (linear_cost), timed, and counts what the call would have cost at its full images x epochs (the first call
    runs once more before, as the warm-up)."""

    def __init__(self, fit: Any, device: Any) -> None:
        self.fit, self.device = fit, device
        self.seconds = 0.0  # spent here, in the sampled epochs
        self.full_seconds = 0.0  # what the calls would have taken in full
        self.calls = 0

    def __call__(self, parameters: Any, loss_fn: Any, x: Any, y: Any, recipe: Any, **kwargs: Any) -> None:
        import time

        if len(x) == 0 or recipe.epochs < 1:
            return
        parameters = list(parameters)  # a generator would be spent by the first of the timed epochs
        one_epoch = replace(recipe, epochs=1, milestones=())

        def train(n: int) -> None:
            self.fit(parameters, loss_fn, x[:n], y[:n], one_epoch, **kwargs)

        tic = time.perf_counter()
        if self.calls == 0:
            train(min(len(x), recipe.batch_size))
        per_call, per_image = linear_cost(train, self.device, recipe.batch_size, len(x))
        self.calls += 1
        self.seconds += time.perf_counter() - tic
        self.full_seconds += per_call + per_image * len(x) * recipe.epochs


@dataclass(frozen=True)
class FlowCalibration:
    """One ordering of a multi_label, stream or continual_few_shot flow, run in part as a trial runs it: seconds
    per unit of work outside `fit`, and `fit`'s seconds at full images x epochs per unit ** fit_power (a FLUID
    update trains on every sample seen so far: n samples cost n ** 2)."""

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


def phase_images(plan: StudyPlan, phase: PhasePlan) -> Any:
    """The phase's own images (their labels make the IIRC hierarchy, the FLUID stream and the CFSL tasks), and
    the extra classes its family shows besides (FLUID's pretrain classes)."""
    from gtep.data import resolve_dataset

    extra = plan.resolved.family.data_classes(plan.resolved.config.scenario.family_options)
    return resolve_dataset(phase.spec.dataset).load().subset(sorted({*phase.spec.classes, *extra}))


def flow_run(plan: StudyPlan, phase: PhasePlan, hparams: dict[str, Any], device: str, data: Any) -> Any:
    """The flow's run object of ordering 0 of the phase, as the flow builds it for a trial."""
    flow = plan.resolved.family.data_flow
    job = phase_job(plan, phase, hparams, device, plan.resolved.config.training.epoch_scale)
    if flow == "multi_label":
        from gtep.engine.flows.multi_label import MultiLabelRun
        return MultiLabelRun(job, data)
    if flow == "stream":
        from gtep.engine.flows.stream import StreamRun
        return StreamRun(job, data)
    from gtep.engine.flows.continual_few_shot import CfslRun
    return CfslRun(job, data)


def flow_units(plan: StudyPlan, phase: PhasePlan, data: Any | None = None) -> int:
    """Units of work of one ordering of the phase (FLOW_UNITS), counted on the flow's own run object."""
    run = flow_run(plan, phase, sampled_params(plan)[0][1], "cpu", data or phase_images(plan, phase))
    return _units(plan.resolved.family.data_flow, run)


def _units(flow: str, run: Any) -> int:
    if flow == "stream":
        return len(run.stream)
    if flow == "continual_few_shot":
        return sum(len(task.support) for task in run.tasks)
    return len(run.tasks)


def calibrate_flow(plan: StudyPlan, data: Any | None = None) -> FlowCalibration:
    """Run part of ordering 0 of the tuning phase on its flow as a trial runs it (the trial's threads and device,
    the median set's hyperparameters, the real learner and data), `fit` sampled (_SampledFit): every IIRC task;
    a FLUID stream's first CALIBRATION_STREAM_STEPS samples; CFSL's task 2 (task 1 the warm-up)."""
    import torch

    slots = trial_slots(plan.resolved.config)
    before = torch.get_num_threads()
    torch.set_num_threads(slots.threads)
    try:
        return _timed_flow(plan, data or phase_images(plan, plan.tuning), slots)
    finally:
        torch.set_num_threads(before)


def _timed_flow(plan: StudyPlan, data: Any, slots: TrialSlots) -> FlowCalibration:
    import time

    from gtep.engine.device import describe_device

    flow = plan.resolved.family.data_flow
    sets = sorted(sampled_params(plan), key=lambda pair: pair[0].batch_size)
    params, hparams = sets[len(sets) // 2]
    run = flow_run(plan, plan.tuning, hparams, calibration_device(slots), data)
    fit = _SampledFit(run.trainer.fit, run.device) if hasattr(run, "trainer") else None
    if fit is not None:
        run.trainer.fit = fit
    tic = time.perf_counter()
    timed_units, seconds, power = _run_part(flow, run)
    total = time.perf_counter() - tic
    sampled, full = (fit.seconds, fit.full_seconds) if fit is not None else (0.0, 0.0)
    return FlowCalibration(
        outside_fit=max(0.0, seconds - sampled) / timed_units, fit=full / timed_units ** power, fit_power=power,
        unit=FLOW_UNITS[flow], timed_units=timed_units, timed_seconds=total,
        batch_size=params.batch_size, threads=slots.threads, device=describe_device(run.device))


def _run_part(flow: str, run: Any) -> tuple[int, float, int]:
    """Run the flow's calibration part: (units timed, their seconds, the power fit's work grows by)."""
    import time

    if flow == "continual_few_shot":
        run.run_task(run.tasks[0])  # the warm-up: kernels, allocator, the learner's first reset
        timed = run.tasks[1: 1 + CALIBRATION_TIMED_TASKS] or run.tasks[:1]
        tic = time.perf_counter()
        for task in timed:
            run.run_task(task)
        return sum(len(task.support) for task in timed), time.perf_counter() - tic, 1
    tic = time.perf_counter()
    if flow == "stream":
        steps = min(len(run.stream), CALIBRATION_STREAM_STEPS)
        for t in range(steps):
            run.step(t)
        return steps, time.perf_counter() - tic, 2
    for task in run.tasks:
        run.train_task(task)
    return len(run.tasks), time.perf_counter() - tic, 1


def compute_flow_estimate(plan: StudyPlan, calibration: FlowCalibration | None = None) -> dict[str, Any]:
    """Seconds of training each phase of a multi_label, stream or continual_few_shot study should take here: the
    calibration's seconds per unit, scaled to the units each phase's ordering holds (FlowCalibration.seconds)."""
    tuning_data = phase_images(plan, plan.tuning)
    calibration = calibration or calibrate_flow(plan, tuning_data)
    cfg = plan.resolved.config
    trials, orderings = cfg.search.trials, cfg.search.orderings
    units = {"tune": flow_units(plan, plan.tuning, tuning_data), "evaluate": flow_units(plan, plan.evaluation)}
    unit = calibration.seconds(units["tune"])
    tuning = unit * trials * orderings
    slots = trial_slots(cfg)
    at_once = min(slots.slots, trials)
    return {"calibration": calibration, "slots": slots, "units": units, "unit_seconds": unit,
            "tuning_seconds": tuning, "evaluation_seconds": calibration.seconds(units["evaluate"]) * orderings,
            "tuning_wall_seconds": tuning * -(-trials // at_once) / trials, "trials_at_once": at_once,
            "device": calibration.device}


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
    import torch

    assert plan.resolved.pretraining is not None
    before = torch.get_num_threads()
    torch.set_num_threads(max(1, int(plan.resolved.config.compute.cpus_per_trial)))
    try:
        return _timed_pretraining(spec, plan.resolved.pretraining.dataset)
    finally:
        torch.set_num_threads(before)


def _timed_pretraining(spec: Any, dataset: str) -> PretrainEstimate:
    import torch
    from torch import nn

    from gtep.algorithms._episodic import train_prototypical
    from gtep.engine.device import resolve_device
    from gtep.engine.pretrain import pretraining_pipeline, train_supervised, training_subset
    from gtep.engine.runner import PhaseTensors
    from gtep.models import create_backbone

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
    flow = plan.resolved.family.data_flow
    if flow in FLOW_UNITS or (flow == "class_incremental" and plan.tuning.tasks and plan.evaluation.tasks):
        return None
    return f"its {flow} data flow has no calibration (gtep/preflight.py: FLOW_UNITS)"


def same_work(plan: StudyPlan) -> bool:
    """Whether both phases train on images of one size through one pipeline (one calibration serves both)."""
    return (plan.tuning.facts.image_shape == plan.evaluation.facts.image_shape
            and plan.resolved.pipeline("tune").describe() == plan.resolved.pipeline("evaluate").describe())


def compute_estimate(plan: StudyPlan, calibration: Calibration | None = None) -> dict[str, Any]:
    """Seconds of training each phase should take on this machine (for families whose work is tasks of classes):
    every sampled set's ordering at the calibrated costs; task 1 counted once per ordering where the study
    shares it between the sets (training.reuse_first_task); and the wall time with the trials that run at once."""
    from gtep.algorithms import ALGORITHMS

    calibration = calibration or calibrate(plan)
    # the evaluation phase timed on its own where its images or pipeline differ (a cross-dataset study)
    evaluation_calibration = calibration if same_work(plan) else calibrate(plan, plan.evaluation)
    cfg = plan.resolved.config
    trials, orderings = cfg.search.trials, cfg.search.orderings
    shared_first = cfg.training.reuse_first_task and ALGORITHMS.get(cfg.algorithm).fixed_first_task
    tuning = evaluation = 0.0
    sets = sampled_params(plan)
    for params, _ in sets:
        first, later = ordering_seconds(plan, plan.tuning, params, calibration)
        tuning += later + (first / len(sets) if shared_first else first)
        evaluation += sum(ordering_seconds(plan, plan.evaluation, params, evaluation_calibration)) / len(sets)
    slots = trial_slots(cfg)
    at_once = min(slots.slots, trials)
    tuning *= orderings * trials / len(sets) * calibration.fusion  # a fused trial counts as what it costs
    evaluation *= evaluation_calibration.fusion
    return {"seconds_per_image": calibration.later_tasks, "calibration": calibration, "slots": slots,
            "tuning_seconds": tuning, "evaluation_seconds": evaluation * orderings,
            "tuning_wall_seconds": tuning * -(-trials // at_once) / trials, "trials_at_once": at_once,
            "unit_seconds": tuning / (trials * orderings), "device": calibration.device}
