"""The pre-flight pass: what a study needs of its config, data, files and paths, checked before any compute.

Every command that trains (gtep tune | evaluate | run, each cell of gtep matrix) runs `preflight` before Ray or
MLflow start, and `gtep check` runs it alone and prints the plan. It adds to `resolve` (names, classes, the
protocol's constraints: gtep/config/) what needs the data and the files:

- each phase's data as its loader will hand it over (gtep/data/datasets.py: dtype and range, NaN, shapes,
  labels), with any conversion said in the plan, the log and the runs' params (`gtep.data_conversion`);
- what the scenario family needs of each phase's classes (ScenarioFamily.check: images to train and test
  every class, FSCIL's K shots and its shot index file, CFSL's samples per class, ...);
- the backbone weights: a readable file whose tensors fit the backbone;
- the study's folder: a name the filesystem takes, a path short enough for what gtep writes inside it, and a
  parent it can create.

Every failure is one ConfigError naming the field and the fix; nothing is written.
"""
from __future__ import annotations

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


def data_conversions(plan: StudyPlan) -> dict[str, str]:
    """Phase -> what its loader converted to reach uint8 pixels (only phases whose data needed it)."""
    return {p.spec.phase: p.facts.conversion for p in (plan.tuning, plan.evaluation) if p.facts.conversion}


def preflight(cfg: ExperimentConfig) -> StudyPlan:
    """resolve(cfg), then everything that needs the data, the files and the paths; before any compute."""
    resolved = resolve(cfg)
    check_study_path(cfg)
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


def seconds_per_image(plan: StudyPlan, batch: int = 32, steps: int = 3) -> float:
    """A short calibration: forward and backward passes of the backbone (and a linear head) on random images
    of the size the phase trains at, on the run's device; the seconds one training image takes."""
    import time

    import torch

    from gtep.engine.device import resolve_device
    from gtep.models import create_backbone

    cfg = plan.resolved.config
    device = resolve_device(cfg.training.device)
    pipeline = plan.resolved.pipeline("tune")
    side = pipeline.size or plan.tuning.facts.image_shape[0]
    torch.manual_seed(cfg.seed)
    net = create_backbone(cfg.backbone).to(device)
    head = torch.nn.LazyLinear(10).to(device)
    x = torch.rand(batch, 3, side, side, device=device)
    y = torch.randint(0, 10, (batch,), device=device)

    def step() -> None:
        loss = torch.nn.functional.cross_entropy(head(net(x)["features"]), y)
        loss.backward()
        net.zero_grad(set_to_none=True)

    step()  # warm-up: lazy layers, allocator, kernels
    tic = time.perf_counter()
    for _ in range(steps):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - tic) / (steps * batch)


def compute_estimate(plan: StudyPlan) -> dict[str, Any]:
    """Seconds of training each phase should take on this machine's device (one trial at a time), from the
    calibration (for families whose work is tasks of classes)."""
    per_image = seconds_per_image(plan)
    cfg = plan.resolved.config
    tuning = image_epochs(plan, plan.tuning) * cfg.search.trials * cfg.search.orderings * per_image
    evaluation = image_epochs(plan, plan.evaluation) * cfg.search.orderings * per_image
    from gtep.engine.device import describe_device, resolve_device

    return {"seconds_per_image": per_image, "tuning_seconds": tuning, "evaluation_seconds": evaluation,
            "device": describe_device(resolve_device(cfg.training.device))}
