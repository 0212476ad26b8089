"""Each phase's dataset and classes, the weights and the pretrain section, checked against the data's metadata."""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from gtep.config.base import ConfigError
from gtep.config.schema import ExperimentConfig, PhaseDataset
from gtep.protocol.scenarios import shared_classes, split_classes_in_two, split_groups_in_two

if TYPE_CHECKING:
    from gtep.data.pipelines import PipelineSpec


@dataclass(frozen=True)
class PhaseSpec:
    """The dataset and the class ids (in that dataset) a phase uses."""

    phase: str  # "tune" (D^HT) or "evaluate" (D^E): which data, whatever phase reads it (data_conversions key)
    dataset: str
    classes: tuple[int, ...]
    class_names: tuple[str, ...]


@dataclass(frozen=True)
class PretrainPlan:
    """The config's pretrain section resolved: the dataset (at the phases' storage size) and its class ids."""

    dataset: str
    classes: tuple[int, ...]


def phase_pipeline(cfg: ExperimentConfig, dataset: str) -> "PipelineSpec":
    from gtep.data.pipelines import choose_pipeline

    return choose_pipeline(cfg.training.augment, dataset, cfg.backbone, cfg.algorithm, cfg.training.image_size)


def _stored_at_pipeline_size(cfg: ExperimentConfig, phase: PhaseSpec) -> PhaseSpec:
    """ImageFolder images are decoded once, at the side the phase's pipeline resizes test images to (256 px for
    224), with its interpolation; a size given in the dataset string stays."""
    from gtep.data import with_storage

    spec = phase_pipeline(cfg, phase.dataset)
    dataset = with_storage(phase.dataset, spec.storage_side(), spec.interpolation)
    return replace(phase, dataset=dataset)


def _check_classes(field: str, classes: list[int], available: int) -> None:
    bad = [c for c in classes if not 0 <= c < available]
    if bad:
        raise ConfigError(field, f"class ids {bad[:5]} are outside 0..{available - 1}; use ids of the dataset")
    if len(set(classes)) != len(classes):
        raise ConfigError(field, "lists a class twice; give each class id once")


def _source(field: str, name: str):
    from gtep.data import DatasetError, resolve_dataset

    try:
        source = resolve_dataset(name)
        source.class_names  # reads metadata: proves the file or root is there and readable
        return source
    except DatasetError as err:
        raise ConfigError(field, str(err)) from None


def _class_groups(field: str, source, name: str, wanted: list[str], instead: str) -> list[str]:
    """The dataset's group of each class, when it has groups and every wanted one is among them."""
    groups = source.class_groups
    if groups is None:
        raise ConfigError(field, f"{name} has no class groups; {instead}")
    unknown = sorted(set(wanted) - set(groups))
    if unknown:
        raise ConfigError(field, f"{name} has no groups {unknown[:5]}; it has e.g. {sorted(set(groups))[:5]}")
    return list(groups)


def _phase_classes(cfg: ExperimentConfig) -> tuple[PhaseSpec, PhaseSpec]:
    spec = cfg.datasets
    if spec.split is not None:
        split = spec.split
        source = _source("datasets.split.dataset", split.dataset)
        names = source.class_names
        pool = split.classes if split.classes is not None else list(range(len(names)))
        _check_classes("datasets.split.classes", pool, len(names))
        if split.groups is not None:
            all_groups = _class_groups("datasets.split.groups", source, split.dataset, split.groups, "drop groups")
            pool = [c for c in pool if all_groups[c] in set(split.groups)]
        if split.by == "group":
            groups = source.class_groups
            if groups is None:
                raise ConfigError("datasets.split.by", f"{split.dataset} has no class groups; use by: class")
            try:
                t_idx, e_idx = split_groups_in_two([groups[c] for c in pool], split.seed, split.tuning_groups,
                                                   split.evaluation_groups)
            except ValueError as err:
                # the evaluation list is at fault when it names a group that is unknown or already in tuning
                free = set(groups) - set(split.tuning_groups or ())
                field = "evaluation_groups" if not set(split.evaluation_groups or ()) <= free else "tuning_groups"
                raise ConfigError(f"datasets.split.{field}", str(err)) from None
            tuning, evaluation = [pool[i] for i in t_idx], [pool[i] for i in e_idx]
            if split.classes_per_phase:
                n = split.classes_per_phase
                if min(len(tuning), len(evaluation)) < n:
                    raise ConfigError("datasets.split.classes_per_phase",
                                      f"{n} classes per phase, but the groups give {len(tuning)} and {len(evaluation)}")
                tuning, evaluation = sorted(tuning)[:n], sorted(evaluation)[:n]
        else:
            n = split.classes_per_phase or len(pool) // 2
            if 2 * n > len(pool):
                raise ConfigError("datasets.split.classes_per_phase",
                                  f"2 x {n} classes do not fit in the pool of {len(pool)}; lower it")
            tuning, evaluation = split_classes_in_two(pool, split.seed, n, n)
        t = PhaseSpec("tune", source.name, tuple(sorted(tuning)), tuple(names[c] for c in sorted(tuning)))
        e = PhaseSpec("evaluate", source.name, tuple(sorted(evaluation)), tuple(names[c] for c in sorted(evaluation)))
        return t, e
    phases = []
    sources = []
    for phase, field in (("tune", "tuning"), ("evaluate", "evaluation")):
        ref: PhaseDataset = getattr(spec, field)
        source = _source(f"datasets.{field}.dataset", ref.dataset)
        names = source.class_names
        classes = ref.classes if ref.classes is not None else list(range(len(names)))
        _check_classes(f"datasets.{field}.classes", classes, len(names))
        phases.append(PhaseSpec(phase, source.name, tuple(sorted(classes)), tuple(names[c] for c in sorted(classes))))
        sources.append(source)
    if sources[0].identity == sources[1].identity:
        # one root read through two class lists (imagefolder:ROOT?classes=imagenet100-1 and -2): ids differ in
        # meaning, so the classes are compared by name
        same_ids = sources[0].class_names == sources[1].class_names
        shared = shared_classes(*((p.classes if same_ids else p.class_names) for p in phases))
        if shared:
            raise ConfigError("datasets.evaluation.classes",
                              f"shares {len(shared)} classes with datasets.tuning (e.g. {shared[:5]}); "
                              "GTEP needs disjoint phases: give disjoint class lists or use datasets.split")
    return phases[0], phases[1]


def _check_weights(cfg: ExperimentConfig, phases: tuple[PhaseSpec, PhaseSpec]) -> None:
    if cfg.weights is not None:
        check_weights_file(cfg.weights, cfg.backbone, phases)


def check_weights_file(weights: Path, backbone: str, phases: tuple[PhaseSpec, PhaseSpec]) -> None:
    """Weights must exist, fit the backbone, and not have been pretrained on a class either phase uses."""
    from gtep.data import resolve_dataset
    from gtep.models.vit import weights_metadata

    if not Path(weights).exists():
        raise ConfigError("weights", f"{weights} does not exist; train one with gtep pretrain or fix the path")
    if Path(weights).is_dir():
        raise ConfigError("weights", f"{weights} is a folder; give a .safetensors file (gtep pretrain) "
                          "or a saved state dict")
    try:
        meta = weights_metadata(Path(weights))
    except Exception as err:  # noqa: BLE001 - safetensors raises its own error types for a damaged header
        raise ConfigError("weights", f"{weights} is not a readable safetensors file ({err.__class__.__name__}); "
                          "give the file gtep pretrain wrote") from None
    if meta.get("gtep.backbone") and meta["gtep.backbone"] != backbone:
        raise ConfigError("weights", f"{weights} holds {meta['gtep.backbone']}, not {backbone}; "
                          "match --backbone")
    if "gtep.dataset" in meta and "gtep.classes" in meta:
        pretrained = {int(c) for c in meta["gtep.classes"].split(",") if c}
        identity = resolve_dataset(meta["gtep.dataset"]).identity
        for phase in phases:
            if resolve_dataset(phase.dataset).identity == identity and pretrained & set(phase.classes):
                shared = sorted(pretrained & set(phase.classes))
                raise ConfigError("weights", f"{weights} was pretrained on {len(shared)} classes the {phase.phase} "
                                  f"phase uses (e.g. {shared[:5]}); pretrain on classes kept out of both phases")


def _check_pretrain(cfg: ExperimentConfig, phases: tuple[PhaseSpec, PhaseSpec]) -> PretrainPlan | None:
    """The pretrain section's classes: in the dataset, and in neither phase (same dataset), before any compute."""
    section = cfg.pretrain
    if section is None:
        return None
    if cfg.weights is not None:
        raise ConfigError("pretrain", "the config gives both weights and a pretrain section; drop one (the pretrain "
                          "section makes the weights)")
    default = cfg.datasets.split.dataset if cfg.datasets.split else cfg.datasets.tuning.dataset  # type: ignore[union-attr]
    source = _source("pretrain.dataset", section.dataset or default)
    names = source.class_names
    if section.groups is not None:
        groups = _class_groups("pretrain.groups", source, source.name, section.groups, "give pretrain.classes")
        classes = [c for c, g in enumerate(groups) if g in set(section.groups)]
        field = "pretrain.groups"
    elif section.classes is not None:
        classes = list(section.classes)
        field = "pretrain.classes"
        _check_classes(field, classes, len(names))
    else:  # a dataset of its own (the validator saw to it), every class of it
        classes, field = list(range(len(names))), "pretrain.dataset"
    if not classes:
        raise ConfigError(field, "names no classes; give the classes (or groups) to pretrain on")
    from gtep.data import resolve_dataset

    # every phase's overlap in one message: fixing the one phase named would only bring up the other next
    overlaps = [(phase.phase, sorted(set(classes) & set(phase.classes))) for phase in phases
                if resolve_dataset(phase.dataset).identity == source.identity]
    named = [f"{len(shared)} with the {name} phase (e.g. {shared[:5]})" for name, shared in overlaps if shared]
    if named:
        raise ConfigError(field, f"shares classes: {' and '.join(named)}; pretrain on classes kept out of both "
                          "phases (restrict the phases with datasets.split.classes, or pick other classes)")
    stored = _stored_at_pipeline_size(cfg, PhaseSpec("pretrain", source.name, tuple(classes), ()))
    return PretrainPlan(stored.dataset, tuple(sorted(classes)))
