"""`resolve`: a config checked against the registries and the data, as the ResolvedExperiment a study runs."""
from __future__ import annotations

from dataclasses import dataclass
from dataclasses import field as dataclass_field
from pathlib import Path
from typing import TYPE_CHECKING

from gtep.config.base import ConfigError
from gtep.config.checks import check_device, check_output, check_tracking_uri
from gtep.config.family_checks import _check_family, _check_first_task_sets_differ, phase_layout
from gtep.config.phases import (
    PhaseSpec,
    PretrainPlan,
    _check_pretrain,
    _check_weights,
    _phase_classes,
    _stored_at_pipeline_size,
    phase_pipeline,
)
from gtep.config.schema import ExperimentConfig
from gtep.protocol.families import FAMILIES, StudyLayout
from gtep.protocol.phases import Phase, as_phase

if TYPE_CHECKING:
    from gtep.data.pipelines import PipelineSpec
    from gtep.protocol.criteria import Criterion
    from gtep.protocol.families import ScenarioFamily


@dataclass(frozen=True)
class ResolvedExperiment:
    config: ExperimentConfig
    increments: tuple[int, ...]
    tuning: PhaseSpec
    evaluation: PhaseSpec
    space_path: Path
    pretraining: PretrainPlan | None = None
    pretrained: Path | None = None  # the file the pretrain step wrote or found (gtep.orchestration.pretraining)
    # phase -> what its loader converted to reach uint8 pixels (gtep.preflight; recorded as gtep.data_conversion)
    data_conversions: dict[str, str] = dataclass_field(default_factory=dict)

    @property
    def weights(self) -> Path | None:
        """The run's backbone weights: those the pretrain section made, else the config's `weights`."""
        return self.pretrained or self.config.weights

    @property
    def family(self) -> "ScenarioFamily":
        from gtep.protocol.families import FAMILIES

        return FAMILIES.get(self.config.scenario.family)

    @property
    def criterion(self) -> "Criterion":
        """H*'s criterion: search.criterion, else the scenario family's."""
        from gtep.protocol.criteria import CRITERIA

        return CRITERIA.get(self.config.search.criterion or self.family.default_criterion)

    def phase(self, phase: Phase | str) -> PhaseSpec:
        """The data of a phase (its record, or its name as a store holds it), as its record says: D^HT for tune
        and conventional (H* re-run where it was tuned, paper section 3.1), D^E for evaluate, original and
        evaluate_sets."""
        return self.tuning if as_phase(phase).on_tuning_data else self.evaluation

    def pipeline(self, phase: Phase | str) -> "PipelineSpec":
        """The data pipeline of a phase (its record or its name): chosen by its dataset, unless training.augment
        names one."""
        return phase_pipeline(self.config, self.phase(phase).dataset)


def check_algorithm(name: str, field: str = "algorithm") -> None:
    """A registered learner (gtep's, or a plugin's): checked where a config is made, not when it runs."""
    from gtep.algorithms import ALGORITHMS

    if name not in ALGORITHMS:
        raise ConfigError(field, f"unknown algorithm {name!r}; choose from {ALGORITHMS.names()} (gtep algorithms)")


def resolve(cfg: ExperimentConfig) -> ResolvedExperiment:
    """Check every name and constraint; touches only metadata, never trains or writes anything."""
    from gtep.algorithms import ALGORITHMS
    from gtep.models import BACKBONES, backbone_exists
    from gtep.spaces import SearchSpaceError, load_space

    check_algorithm(cfg.algorithm)
    if not backbone_exists(cfg.backbone):
        raise ConfigError("backbone", f"unknown backbone {cfg.backbone!r}; choose from {BACKBONES.names()}, "
                          "vit_micro_patch4_32, vit_mini_patch4_32 or any timm ViT name")
    from gtep.models.vit import is_vit

    if ALGORITHMS.get(cfg.algorithm).uses_pretrained and not is_vit(cfg.backbone):
        raise ConfigError("backbone", f"{cfg.algorithm} works on a pretrained ViT, not {cfg.backbone!r}; "
                          "pass --backbone vit_... --weights FILE (gtep pretrain makes one)")
    check_device(cfg.training.device, "training.device")
    check_output(cfg.tracking.output, "tracking.output")
    check_tracking_uri(cfg.tracking_uri, "tracking.tracking_uri")
    _check_family(cfg)
    family = FAMILIES.get(cfg.scenario.family)
    options = cfg.scenario.family_options
    tuning, evaluation = (_stored_at_pipeline_size(cfg, p) for p in _phase_classes(cfg))
    pretraining = _check_pretrain(cfg, (tuning, evaluation))  # first: it refuses weights given beside it
    _check_weights(cfg, (tuning, evaluation))
    _check_meta_training(cfg)
    layouts = [phase_layout(cfg, phase) for phase in (tuning, evaluation)]
    study = StudyLayout(cfg.seed, cfg.training.memory_size, tuple(pretraining.classes) if pretraining else None)
    problems = family.check_layout(layouts, study, options)
    if problems:
        raise ConfigError(problems[0].field, problems[0].message)
    increments = tuple(family.phase_increments(layouts, study, options))
    if cfg.search.fidelity == "tasks" and not family.reports_per_task:
        raise ConfigError("search.fidelity", f"tasks reports a score after each task of a class-incremental "
                          f"ordering; the {cfg.scenario.family} family reports after each ordering: use orderings")
    if cfg.search.protocol == "first_task":
        if not family.reports_per_task:
            raise ConfigError("search.protocol", f"first_task compares sets on the first tasks of a class-incremental "
                              f"scenario; the {cfg.scenario.family} family has its own sessions, use gtep")
        if cfg.search.protocol_tasks >= len(increments):
            raise ConfigError("search.protocol_tasks", f"{cfg.search.protocol_tasks} is not below the scenario's "
                              f"{len(increments)} tasks; first_task compares sets on fewer tasks than the whole")
    try:  # the config's file, else gtep's shipped one, else the one a plugin's learner declares (gtep.spaces)
        space = load_space(cfg.algorithm, cfg.search.space)
    except SearchSpaceError as err:
        raise ConfigError("search.space", str(err)) from None
    _check_first_task_sets_differ(cfg, space.space.sets)
    return ResolvedExperiment(cfg, increments, tuning, evaluation, space.path, pretraining)


def _check_meta_training(cfg: ExperimentConfig) -> None:
    """A learner that meta-trains on its weights' pretrain classes needs weights that name them: refused here,
    before any compute, not in a worker once the phase runs."""
    from gtep.algorithms import ALGORITHMS
    from gtep.models.vit import weights_metadata

    if not ALGORITHMS.get(cfg.algorithm).meta_trains or cfg.pretrain is not None:
        return

    meta = weights_metadata(Path(cfg.weights)) if cfg.weights and str(cfg.weights).endswith(".safetensors") else {}
    if not (meta.get("gtep.dataset") and meta.get("gtep.classes")):
        raise ConfigError("weights", f"{cfg.algorithm} meta-trains on the classes its backbone was pretrained on, "
                          f"and {cfg.weights or 'no weights file'} names none; add a pretrain: section, or give "
                          "weights made by gtep pretrain")
