"""Checks across sections: the family against the criterion and the algorithm, each family's needs of the phases
(iirc, fluid, cfsl), and first_task's sets against the search space."""
from __future__ import annotations

from gtep.config.base import ConfigError
from gtep.config.phases import PhaseSpec, PretrainPlan, _check_classes, _source
from gtep.config.schema import ExperimentConfig


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


def _check_iirc(cfg: ExperimentConfig, tuning: PhaseSpec, evaluation: PhaseSpec) -> tuple[int, ...]:
    """IIRC before any compute: each phase's hierarchy (its classes are the subclasses), no superclass with
    subclasses in both phases of one dataset, and a task sequence for each phase. Returns the tuning phase's
    labels per task (ResolvedExperiment.increments: the same in every ordering; the evaluation phase's may
    differ, and its jobs compute their own)."""
    from gtep.protocol.families.iirc import IircOptions, ordering_tasks, phase_hierarchy, split_problem, task_sizes

    spec = options = IircOptions.of(cfg.scenario.family_options)
    if spec.memory_per_class is not None and cfg.training.memory_size:
        raise ConfigError("scenario.iirc.memory_per_class", f"is {spec.memory_per_class} per label but "
                          f"training.memory_size gives a fixed total ({cfg.training.memory_size}) too; give one "
                          "budget: remove training.memory_size, or memory_per_class for the fixed total")
    sizes: list[tuple[int, ...]] = []
    metadata = []
    for phase in (tuning, evaluation):
        source = _source("datasets.split.dataset" if cfg.datasets.split else
                         f"datasets.{'tuning' if phase.phase == 'tune' else 'evaluation'}.dataset", phase.dataset)
        names, groups = source.class_names, source.class_groups
        metadata.append((source.identity, names, groups))
        try:
            hierarchy = phase_hierarchy(phase.classes, options.source, names, groups)
        except ValueError as err:
            raise ConfigError("scenario.iirc.hierarchy", f"{err} ({phase.phase} phase, {phase.dataset})") from None
        n_super = len(hierarchy.superclasses)
        if spec.first_task_superclasses > n_super:
            raise ConfigError("scenario.iirc.first_task_superclasses",
                              f"is {spec.first_task_superclasses} but the {phase.phase} phase has {n_super} "
                              f"superclasses; lower it to at most {n_super}")
        try:
            ordering_tasks(hierarchy, options, cfg.seed, 0)
        except ValueError as err:
            raise ConfigError("scenario.iirc", f"{err} ({phase.phase} phase: {n_super} superclasses, "
                              f"{len(hierarchy.subclasses)} subclasses); change first_task_superclasses or "
                              "classes_per_task") from None
        sizes.append(tuple(task_sizes(hierarchy, options)))
    (t_id, names, groups), (e_id, _, _) = metadata
    if t_id == e_id:
        problem = split_problem(tuning.classes, evaluation.classes, options.source, names, groups)
        if problem:
            raise ConfigError("scenario.iirc.hierarchy", f"{problem}: GTEP's phases must split the superclasses; "
                              "split by group (datasets.split.by: group) or give disjoint whole superclasses")
    return sizes[0]


def _check_fluid(cfg: ExperimentConfig, tuning: PhaseSpec, evaluation: PhaseSpec,
                 pretraining: PretrainPlan | None) -> None:
    """FLUID before any compute: the pretrain classes exist, are kept out of both phases and (with a pretrain
    section) are classes the backbone is pretrained on, and every phase has the classes a sequence draws."""
    from gtep.protocol.families.fluid import FluidOptions

    spec = FluidOptions.of(cfg.scenario.family_options)
    if pretraining is not None:
        foreign = sorted(set(spec.pretrain_classes) - set(pretraining.classes))
        if foreign:
            raise ConfigError("scenario.fluid.pretrain_classes", f"{foreign[:5]} are not among the pretrain "
                              "section's classes; the stream's pretrain classes are those the backbone was "
                              "pretrained on: list them in pretrain.classes too")
    if spec.pretrain_holdout > 0 and pretraining is None:
        raise ConfigError("scenario.fluid.pretrain_holdout", f"is {spec.pretrain_holdout:g}, but only the pretrain "
                          "section leaves those training images out of pretraining (a weights file may have trained "
                          "on them): pretrain with the pretrain section, or set it to 0")
    if len(set(spec.pretrain_classes)) != len(spec.pretrain_classes):
        raise ConfigError("scenario.fluid.pretrain_classes", "lists a class twice; give each class id once")
    if spec.n_pretrain_classes > len(spec.pretrain_classes):
        raise ConfigError("scenario.fluid.n_pretrain_classes", f"is {spec.n_pretrain_classes} but pretrain_classes "
                          f"lists {len(spec.pretrain_classes)}; lower it or list more classes")
    for phase in (tuning, evaluation):
        available = len(_source("scenario.fluid.pretrain_classes", phase.dataset).class_names)
        _check_classes("scenario.fluid.pretrain_classes", list(spec.pretrain_classes), available)
        shared = sorted(set(spec.pretrain_classes) & set(phase.classes))
        if shared:
            raise ConfigError("scenario.fluid.pretrain_classes", f"{len(shared)} of them are {phase.phase} classes "
                              f"(e.g. {shared[:5]}); keep the pretrain classes out of both phases (restrict "
                              "datasets.split.classes to the others)")
        if spec.n_novel_classes > len(phase.classes):
            raise ConfigError("scenario.fluid.n_novel_classes", f"is {spec.n_novel_classes} but the {phase.phase} "
                              f"phase has {len(phase.classes)} classes; lower it or give the phase more classes")


def _check_cfsl(cfg: ExperimentConfig, tuning: PhaseSpec, evaluation: PhaseSpec) -> None:
    """A CFSL task takes NC * NSS / CCI classes of its phase: each phase must have them. (That each class has
    CCI x (K_S + K_T) images is checked when a task is drawn: counting needs the images.)"""
    from gtep.protocol.families.cfsl.generator import CfslOptions

    options = CfslOptions.of(cfg.scenario.family_options)
    for phase in (tuning, evaluation):
        if len(phase.classes) < options.classes_per_task:
            raise ConfigError("scenario.cfsl", f"a task takes {options.classes_per_task} classes (ways {options.ways} "
                              f"x support_sets {options.support_sets} / class_change_interval "
                              f"{options.class_change_interval}) but the {phase.phase} phase has {len(phase.classes)} "
                              f"({phase.dataset}); lower ways or support_sets, raise class_change_interval, or give "
                              "the phase more classes")


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
