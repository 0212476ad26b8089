"""Checks across sections: the family against the criterion and the algorithm, the phases' layout as a family
reads it (its checks are the family's own: ScenarioFamily.check_layout), and first_task's sets against the space."""
from __future__ import annotations

from pathlib import Path

from gtep.config.base import ConfigError
from gtep.config.phases import PhaseSpec, _source
from gtep.config.schema import ExperimentConfig
from gtep.protocol.families import PhaseLayout


def _check_family(cfg: ExperimentConfig) -> None:
    """The criterion is built from metrics the family reports, and the algorithm can run the family's data."""
    from gtep.algorithms import ALGORITHMS
    from gtep.protocol.criteria import CRITERIA
    from gtep.protocol.families import FAMILIES

    family = FAMILIES.get(cfg.scenario.family)
    name = cfg.search.criterion
    if name is not None:
        if name not in CRITERIA:
            raise ConfigError("search.criterion", f"unknown criterion {name!r}; choose from {CRITERIA.names()}")
        missing = [m for m in CRITERIA.get(name).components if m not in family.metric_names]
        if missing:
            usable = [c for c in CRITERIA.names() if set(CRITERIA.get(c).components) <= set(family.metric_names)]
            raise ConfigError("search.criterion", f"{name!r} needs {missing}, which the {family.name} family does "
                              f"not report; choose from {usable}")
    if family.data_flow not in ALGORITHMS.get(cfg.algorithm).data_flows:
        able = [a for a in ALGORITHMS.names() if family.data_flow in ALGORITHMS.get(a).data_flows]
        raise ConfigError("algorithm", f"{cfg.algorithm} cannot run the {family.name} family's data "
                          f"({family.data_flow}); algorithms that can: {', '.join(able) or 'none'}")
    _check_pretrain_method(cfg)


def _check_pretrain_method(cfg: ExperimentConfig) -> None:
    """A learner whose backbone must come from one pretraining method (fluid_protonet: ProtoNet meta-training)
    gets it from the pretrain: section, or without one from weights whose metadata names it; anything else would
    run another method under its name, so it is refused here, before any compute."""
    from gtep.algorithms import ALGORITHMS
    from gtep.models.vit import weights_metadata

    required = getattr(ALGORITHMS.get(cfg.algorithm), "required_pretrain_method", None)
    if required is None:
        return
    given: str | None
    if cfg.pretrain is not None:
        given, now = cfg.pretrain.method, f"the pretrain: section's is {cfg.pretrain.method}"
    else:
        weights = Path(cfg.weights) if cfg.weights else None
        readable = weights is not None and weights.suffix == ".safetensors" and weights.is_file()
        # weights that do not name their method came from supervised pretraining (gtep pretrain writes no method)
        given = weights_metadata(weights).get("gtep.method", "supervised") if weights and readable else None
        now = f"{weights} was pretrained with {given}" if given else "there is no pretrain: section"
    if given != required:
        raise ConfigError("pretrain.method", f"{cfg.algorithm} needs a backbone pretrained with method: {required} "
                          f"({now}); set pretrain.method: {required} (a pretrain: section with the classes and "
                          f"method: {required}), or choose another algorithm")


def phase_layout(cfg: ExperimentConfig, phase: PhaseSpec) -> PhaseLayout:
    """What a family's layout checks read of a phase: its dataset's class names and groups (metadata only)."""
    field = ("datasets.split.dataset" if cfg.datasets.split else
             f"datasets.{'tuning' if phase.phase == 'tune' else 'evaluation'}.dataset")
    source = _source(field, phase.dataset)
    groups = source.class_groups
    return PhaseLayout(phase.phase, phase.dataset, field, source.identity, tuple(phase.classes),
                       tuple(source.class_names), tuple(groups) if groups is not None else None)


def _check_first_task_sets_differ(cfg: ExperimentConfig, space: dict[str, tuple]) -> None:
    """first_task at k = 1 compares sets on task 1 only; where the first task is trained with the fixed
    first_task recipe and no hyperparameter of the space that reaches it varies, every set scores the same
    and H* would be a tie broken by set order: refused, with the fix."""
    from gtep.algorithms import ALGORITHMS
    from gtep.algorithms.base import names_reaching_first_task

    if cfg.search.protocol != "first_task" or cfg.search.protocol_tasks != 1:
        return
    names = names_reaching_first_task(ALGORITHMS.get(cfg.algorithm), cfg.first_task.scheduler)
    if names is None or any(len(set(map(repr, space.get(n, ())))) > 1 for n in names):
        return
    raise ConfigError("search.protocol_tasks", f"1 compares sets on task 1 only, which {cfg.algorithm} trains with "
                      f"the fixed first_task recipe: none of the space's values reaches it (only "
                      f"{', '.join(sorted(names))} would), so every set would score the same; set protocol_tasks "
                      "to 2 or more (or first_task.scheduler: sampled with a sampled scheduler)")
