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
- the device: `training.device: cuda` where torch finds no CUDA (a local study);
- the size each phase trains at (`training_inputs`): the pipeline and the network's input side, and a warning
  (`input_size_warnings`, printed by `gtep check`) where it upsamples the stored images for a backbone that
  is not a ViT, e.g. `imagefolder:...?size=32` trained with PyCIL's ImageNet pipeline at 224 px.

Every failure is one ConfigError naming the field and the fix; nothing is written. `gtep check --calibrate` also
estimates the training time (gtep/preflight/calibration.py: a few real training steps of the learner, timed as a
trial runs).
"""
from __future__ import annotations

import dataclasses
import itertools
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gtep.algorithms import ALGORITHMS
from gtep.config import ConfigError, ExperimentConfig, PhaseSpec, ResolvedExperiment, resolve
from gtep.data import DataFacts, DatasetError, resolve_dataset
from gtep.data.pipelines import PipelineSpec
from gtep.engine.device import DeviceUnavailableError, choose_device
from gtep.engine.fusion import FusionRefused, check_fusable
from gtep.models import create_backbone
from gtep.models.vit import is_vit, vit_depth
from gtep.protocol.families import PhaseData
from gtep.protocol.holdout import held_out_count
from gtep.spaces import load_space

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
    driver lacks); `auto` falls back on the CPU, and gpus_per_trial is Ray's business (choose_device outside a
    trial: only a device named is refused)."""
    device = cfg.training.device
    if cfg.compute.ray_address is not None:
        return
    try:
        choose_device(device, torch.cuda.is_available())
    except DeviceUnavailableError:
        raise ConfigError("training.device", f"{device!r} asks for CUDA, but this machine has no CUDA device "
                          "torch can use; set training.device to 'auto' (a trial's GPUs when it has some, else "
                          "the CPU) or 'cpu'") from None


CPU_WHEELS = "https://download.pytorch.org/whl/cpu"


def cuda_build_note(cfg: ExperimentConfig) -> str | None:
    """A CUDA build of torch on a machine without a CUDA device, where the trials run here: pip's default torch
    is the CUDA build, several GB of CUDA libraries a CPU-only machine never uses; PyTorch's CPU wheels are the
    alternative (docs/getting-started.md). A cluster's driver may lack the GPUs its workers have: not said then."""
    if cfg.compute.ray_address is not None or not torch.version.cuda or torch.cuda.is_available():
        return None
    return (f"torch {torch.__version__} is a CUDA {torch.version.cuda} build (several GB installed) and this machine "
            f"has no CUDA device: on a CPU-only machine install the CPU wheels instead, pip install torch "
            f"torchvision --index-url {CPU_WHEELS} (docs/getting-started.md)")


PIPELINE_WORDS = {"pycil-cifar": "PyCIL's CIFAR-100 pipeline", "pycil-imagenet": "PyCIL's ImageNet pipeline",
                  "pilot": "LAMDA-PILOT's ViT pipeline", "pilot-coda": "LAMDA-PILOT's CODA-Prompt pipeline"}


@dataclass(frozen=True)
class TrainingInput:
    """What a phase's network is fed (gtep/data/pipelines.py): the pipeline, the side its images are stored at and
    the side the network sees."""

    phase: str
    dataset_field: str
    dataset: str
    pipeline: PipelineSpec
    stored_side: int  # an ImageFolder tree's ?size= (or the side its pipeline stores at), an array file's own
    input_side: int  # the pipeline's size, or the stored side where it has none (pycil-cifar trains as stored)

    @property
    def words(self) -> str:
        base = self.pipeline.name.rpartition("/")[2]
        named = PIPELINE_WORDS.get(base, base)
        return f"no augmentation, {named}'s test view" if self.pipeline.name.startswith("none/") else named

    def describe(self) -> str:
        how = (f"upsampled from images stored at {self.stored_side} px" if self.upsampled
               else f"from images stored at {self.stored_side} px")
        return f"{self.pipeline.describe()} ({self.words}) at {self.input_side} px, {how}"

    @property
    def upsampled(self) -> bool:
        return self.input_side > self.stored_side


def training_inputs(plan: StudyPlan) -> tuple[TrainingInput, TrainingInput]:
    """Each phase's pipeline and sides, as the study will train them."""
    resolved = plan.resolved
    out = []
    for phase in (plan.tuning, plan.evaluation):
        spec = resolved.pipeline(phase.spec.phase)
        stored = int(phase.facts.image_shape[0])
        out.append(TrainingInput(phase.spec.phase, dataset_field(resolved.config, phase.spec.phase),
                                 phase.spec.dataset, spec, stored, spec.size or stored))
    return out[0], out[1]


def training_input_line(plan: StudyPlan) -> str:
    """One line: the pipeline and input size of each phase (one phrase when both phases train alike)."""
    tuning, evaluation = training_inputs(plan)
    if tuning.describe() == evaluation.describe():
        return f"training input: both phases {tuning.describe()}"
    return f"training input: {tuning.phase} {tuning.describe()}; {evaluation.phase} {evaluation.describe()}"


def input_size_warnings(plan: StudyPlan) -> list[str]:
    """One line per dataset whose stored size and pipeline's input size disagree: a backbone other than a ViT fed
    images upsampled by the pipeline (imagefolder:...?size=32 with the ImageNet pipeline that ImageFolder data gets
    by default: 224 px, 49 times the pixels, no more detail). A warning, not a refusal: upsampling can be meant
    (an ImageNet-style network compared at 224 px), so gtep cannot tell it from a mistake; it only must not happen
    unsaid. A ViT is not warned about: it needs its input side, and LAMDA-PILOT upsamples CIFAR-100's 32 px to
    224 px the same way."""
    cfg = plan.resolved.config
    if is_vit(cfg.backbone):
        return []
    lines: dict[str, str] = {}
    for t in training_inputs(plan):
        if not t.upsampled or t.dataset_field in lines:
            continue
        chosen = ("training.augment: true picks for ImageFolder data" if cfg.training.augment in (True, "default")
                  else f"training.augment: {cfg.training.augment} names")
        given = f" (?size={t.stored_side})" if t.dataset.startswith("imagefolder:") else ""
        fixes = [f"to train at {t.stored_side} px set training.augment: pycil-cifar"
                 + (" and remove training.image_size" if cfg.training.image_size is not None else "")]
        if t.pipeline.crop == "resized":
            fixes.append(f"training.image_size: {t.stored_side} to keep {t.pipeline.name} at {t.stored_side} px")
        if given:
            fixes.append(f"to train at {t.input_side} px remove ?size={t.stored_side} from {t.dataset_field} "
                         f"(stored at {t.pipeline.storage_side()} px then)")
        lines[t.dataset_field] = (
            f"the images of {t.dataset_field} are stored at {t.stored_side} px{given} but {cfg.backbone} trains at "
            f"{t.input_side} px with {t.pipeline.describe()}, the pipeline {chosen}: each image is upsampled "
            f"{t.input_side / t.stored_side:g}x, at {(t.input_side / t.stored_side) ** 2:.0f}x the pixels and no "
            f"more detail; {', or '.join(fixes)}")
    return list(lines.values())


def data_conversions(plan: StudyPlan) -> dict[str, str]:
    """Phase -> what its loader converted to reach uint8 pixels (only phases whose data needed it)."""
    return {p.spec.phase: p.facts.conversion for p in (plan.tuning, plan.evaluation) if p.facts.conversion}


def check_space_values(resolved: ResolvedExperiment) -> None:
    """Every value of the search space and of its presets within the ranges the learner's Params declare, and every
    combination the space can draw within their rules across hyperparameters (top_k at most pool_size). A value
    the learner refuses would fail inside a Ray trial, after the study folder is written; one it takes but cannot
    use (an empty A-GEM memory batch) would train another method under its name."""
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
