"""The IIRC scenario family (Incremental Implicitly-Refined Classification; papers/iirc.txt, notes 001.1-001.5).

A phase's classes (the dataset's classes) are the SUBCLASSES; the superclasses come from a hierarchy:

    hierarchy: groups   every class group of the dataset (Omniglot's alphabets) is a superclass of its classes
    hierarchy: FILE     a JSON {"<superclass name>": ["<subclass class name or id>", ...]}; classes it does not
                        list are standalone subclasses (no superclass)

Superclass k (in sorted group-name order, or the file's key order) gets the label id `num_classes + k`, so
label ids never collide with dataset class ids. GTEP's phases must split the superclasses: no subclass of a
tuning superclass may appear in evaluation (`split_problem`, checked by config.resolve before any compute).

Tasks (`tasks`): task 0 holds `first_task_superclasses` superclasses, every later task `classes_per_task`
labels (generator.py `iirc_tasks`, seeded by (study seed, ordering)); training images are assigned
once per phase with the study seed (`assign_samples`: the same in every ordering and set).

Options beyond the scenario (gtep/engine/flows/multi_label.py applies them): memory_per_class (the paper's budget of
samples per seen label, in place of training.memory_size's fixed total) and in_task_validation with
plateau_patience (the paper's in-task validation split and its learning-rate decay on a plateau).

Metrics (gtep/protocol/families/iirc/metrics.py): pw_js (final R_k), mean_pw_js (mean of R_k over tasks: the default
H* criterion), js, mean_js, exact_match, precision, and the paper's diagnostics superclass_pw_js,
subclass_precision_with_super, subclass_precision_standalone (App. D.2-D.3); curves pw_js_t, js_t,
exact_match_t, precision_t, pw_js_current_t and the diagnostics' <name>_t. Aliases for the parts of gtep that
read the class-incremental names (tables' Acc and AvgAcc columns, the trainable's running score defaults,
MLflow's per-task `acc_t` steps):

    acc      = pw_js       the final precision-weighted Jaccard similarity (the paper's headline R_j at the end)
    avg_acc  = mean_pw_js  its mean over the tasks (as AvgAcc is Acc's)
    acc_t    = pw_js_t     the per-task curve

So the generic HM column is the harmonic mean of final and mean pw-JS; H* is chosen by mean_pw_js unless
search.criterion says otherwise. The data flow is "multi_label" (gtep/engine/flows/multi_label.py runs it).
Pure: stdlib and numpy only.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Mapping, Sequence

from gtep.protocol.criteria import Criterion, register_criterion
from gtep.protocol.families.base import (
    ACC,
    ACC_T,
    AVG_ACC,
    FamilyOptions,
    Metric,
    PhaseData,
    PhaseLayout,
    Problem,
    ScenarioFamily,
    StudyLayout,
    add_aliases,
    curve,
    empty_classes,
    register_family,
)
from gtep.protocol.families.iirc import metrics as iirc_metrics
from gtep.protocol.families.iirc.generator import SUB_KEEP, SUPER_SHARE, Hierarchy, iirc_tasks
from gtep.protocol.hierarchy import parse_hierarchy
from gtep.protocol.scenarios import TaskSpec

IIRC = "iirc"
MULTI_LABEL = "multi_label"
GROUPS = "groups"  # hierarchy source: the dataset's class groups

ALIASES = {"acc": "pw_js", "avg_acc": "mean_pw_js", "acc_t": "pw_js_t"}

LABELS = {"pw_js": "pw-JS", "mean_pw_js": "mean pw-JS", "js": "JS", "mean_js": "mean JS", "exact_match": "exact match",
          "precision": "precision", "superclass_pw_js": "superclass pw-JS",
          "subclass_precision_with_super": "precision (subclasses with a superclass)",
          "subclass_precision_standalone": "precision (standalone subclasses)", "pw_js_current": "pw-JS (current task)"}
# every IIRC metric is a fraction (percent in MLflow); the curves are one value per task
METRICS = (*(Metric(name, LABELS[name]) for name in iirc_metrics.METRIC_NAMES), ACC, AVG_ACC,
           *(curve(name, f"{LABELS[name[:-2]]} after task t") for name in iirc_metrics.CURVE_METRICS), ACC_T)

PLATEAU_PATIENCE = 10  # the reference code's ReduceLROnPlateau(patience=10), with its threshold 1e-3 (absolute)
PLATEAU_THRESHOLD = 1e-3


@dataclass(frozen=True)
class IircOptions(FamilyOptions):
    """scenario.iirc: Incremental Implicitly-Refined Classification. The phase's classes are the subclasses;
    `hierarchy` gives their superclasses (the config validates the section against these fields' metadata)."""

    first_task_superclasses: int = field(metadata={"ge": 1, "description": "superclasses of task 0 (superclasses "
                                                                           "only)"})
    classes_per_task: int = field(metadata={"ge": 1, "description": "labels (superclasses and subclasses) of every "
                                                                    "later task"})
    # "groups": each class group of the dataset (Omniglot's alphabets) is a superclass; else a JSON file
    # {"<superclass name>": ["<subclass class name or id>", ...]} (classes it does not list are standalone), recorded
    # as its resolved path (the config checks and reads it: gtep/data/option_files.py)
    hierarchy: str = field(default=GROUPS, metadata={"file": "class_hierarchy", "unless": GROUPS})
    sub_keep: float = field(default=SUB_KEEP, metadata={"gt": 0, "le": 1, "description": "share of a subclass's "
                                                        "training images it keeps"})
    super_share: float = field(default=SUPER_SHARE, metadata={"gt": 0, "le": 1, "description": "share of each "
                                                              "subclass's images its superclass gets"})
    # the file's content (config reads it; workers need not)
    tree: Mapping[str, Sequence[str | int]] | None = field(default=None, metadata={"filled_from": "hierarchy"})
    # replay budget: samples kept per seen label (the paper's 20: the memory grows with the labels); None: the
    # run's fixed total (training.memory_size) spread over the seen labels
    memory_per_class: int | None = field(default=None, metadata={"ge": 1, "description": "replay samples kept per "
                                                                 "seen label"})
    # share of each subclass's training images held out as the in-task validation set (the paper's 0.1 on
    # CIFAR): it is never trained on, and the lr of every training stage is decayed (by the recipe's lr_decay)
    # when its pw-JS has not improved for plateau_patience epochs (scaled by epoch_scale), in place of the
    # recipe's schedule. 0: no validation split, the recipe's schedule.
    in_task_validation: float = field(default=0.0, metadata={
        "ge": 0, "lt": 1, "description": "share of each subclass's training images held out to validate in-task; "
        "its pw-JS plateau decays the lr (0: off)"})
    plateau_patience: int = field(default=PLATEAU_PATIENCE, metadata={
        "ge": 1, "description": "epochs without a validation gain before the lr decays (scaled by epoch_scale)"})

    @property
    def source(self) -> "str | Mapping[str, Sequence[str | int]]":
        """What `phase_hierarchy` takes: "groups", or the file's {superclass name: [class names or ids]}."""
        if self.hierarchy == GROUPS:
            return GROUPS
        if self.tree is None:
            raise ValueError(f"the hierarchy {self.hierarchy} was not read; give its content as options['tree']")
        return self.tree


def dataset_superclasses(source: str | Mapping[str, Sequence[str | int]], class_names: Sequence[str],
                         class_groups: Sequence[str] | None) -> dict[str, list[int]]:
    """Superclass name -> its subclass ids (dataset class ids) over the whole dataset, in label-id order."""
    if source == GROUPS:
        if class_groups is None:
            raise ValueError("the dataset has no class groups; give a hierarchy JSON file instead of 'groups'")
        out: dict[str, list[int]] = {g: [] for g in sorted(set(class_groups))}
        for c, g in enumerate(class_groups):
            out[g].append(c)
        return out
    ids = {name: i for i, name in enumerate(class_names)}
    out = {}
    seen: dict[int, str] = {}
    if isinstance(source, str):
        raise ValueError(f"hierarchy {source!r}: give 'groups' or the parsed file (IircOptions.source)")
    for sup, subs in parse_hierarchy(source).items():
        resolved = []
        for s in subs:
            if isinstance(s, int) or (isinstance(s, str) and s not in ids and s.isdigit()):
                c = int(s)
                if not 0 <= c < len(class_names):
                    raise ValueError(f"superclass {sup!r}: class id {c} is outside 0..{len(class_names) - 1}")
            elif s in ids:
                c = ids[s]
            else:
                raise ValueError(f"superclass {sup!r}: {s!r} is not a class name of the dataset")
            if c in seen:
                raise ValueError(f"class {class_names[c]!r} is under both {seen[c]!r} and {sup!r}")
            seen[c] = sup
            resolved.append(c)
        out[sup] = resolved
    return out


def superclass_ids(superclasses: Mapping[str, Sequence[int]], num_classes: int) -> dict[str, int]:
    """Superclass name -> its label id: num_classes + its position."""
    return {name: num_classes + k for k, name in enumerate(superclasses)}


def phase_hierarchy(classes: Sequence[int], source: str | Mapping[str, Sequence[str | int]], class_names: Sequence[str],
                    class_groups: Sequence[str] | None) -> Hierarchy:
    """The hierarchy of one phase: the superclasses with subclasses among `classes` (restricted to them), and
    the phase's other classes as standalone subclasses."""
    supers = dataset_superclasses(source, class_names, class_groups)
    ids = superclass_ids(supers, len(class_names))
    phase = set(int(c) for c in classes)
    tree = {ids[name]: [c for c in subs if c in phase] for name, subs in supers.items()}
    tree = {s: subs for s, subs in tree.items() if subs}
    under = {c for subs in tree.values() for c in subs}
    return Hierarchy.of(tree, [c for c in sorted(phase) if c not in under])


def split_problem(tuning: Sequence[int], evaluation: Sequence[int], source: str | Mapping[str, Sequence[str | int]],
                  class_names: Sequence[str],
                  class_groups: Sequence[str] | None) -> str | None:
    """What is wrong with a split of one dataset's classes for IIRC (None: nothing): a superclass with
    subclasses in both phases would leak between them."""
    t, e = set(tuning), set(evaluation)
    for name, subs in dataset_superclasses(source, class_names, class_groups).items():
        if t & set(subs) and e & set(subs):
            first_t, first_e = class_names[sorted(t & set(subs))[0]], class_names[sorted(e & set(subs))[0]]
            return (f"superclass {name!r} has subclasses in both phases (e.g. {first_t!r} in tuning, {first_e!r} "
                    "in evaluation)")
    return None


def task_sizes(hierarchy: Hierarchy, options: IircOptions) -> list[int]:
    """Labels per task (the same in every ordering): the first task's superclasses, then classes_per_task."""
    rest = len(hierarchy.classes) - options.first_task_superclasses
    full, extra = divmod(rest, options.classes_per_task)
    return [options.first_task_superclasses] + [options.classes_per_task] * full + ([extra] if extra else [])


def ordering_tasks(hierarchy: Hierarchy, options: IircOptions, seed: int, ordering: int) -> list[TaskSpec]:
    return iirc_tasks(hierarchy, options.first_task_superclasses, options.classes_per_task, seed, ordering)


# the criteria of this family's metrics (search.criterion)
register_criterion(Criterion("mean_pw_js", ("mean_pw_js",),
                             "IIRC: mean over tasks of the pw-JS on all labels seen so far"))


@register_family
class IncrementalImplicitlyRefined(ScenarioFamily):
    name = IIRC
    section = IIRC
    description = ("IIRC: superclasses first, their subclasses in later tasks, multi-label with incomplete training "
                   "labels (scenario.iirc)")
    data_flow = MULTI_LABEL
    Options = IircOptions
    memory_budget_option = "memory_per_class"
    metrics = METRICS
    default_criterion = iirc_metrics.DEFAULT_CRITERION_METRIC
    headline: ClassVar[tuple[str, ...]] = ("pw_js", "mean_pw_js", "js", "exact_match")
    table_note = ("IIRC: the table's Acc and AvgAcc are the final and the mean precision-weighted Jaccard similarity "
                  "(pw-JS, %); criterion: H* was selected by")

    def increments(self, options: Mapping[str, Any]) -> list[int]:
        """Labels per task of a phase; needs the phase's hierarchy in options["superclasses"] ({superclass id:
        [subclass ids]}) and options["classes"], as `tasks` does (config.resolve computes them per phase)."""
        return task_sizes(self._hierarchy(options.get("classes", ()), options), IircOptions.of(options))

    def tasks(self, classes: Sequence[int], options: Mapping[str, Any], seed: int, ordering: int) -> list[TaskSpec]:
        return ordering_tasks(self._hierarchy(classes, options), IircOptions.of(options), seed, ordering)

    @staticmethod
    def _hierarchy(classes: Sequence[int], options: Mapping[str, Any]) -> Hierarchy:
        tree = options.get("superclasses")
        if tree is None:
            raise ValueError("the iirc family needs the phase's hierarchy: options['superclasses'] = {superclass "
                             "id: [subclass ids]} (see phase_hierarchy)")
        tree = {int(s): [int(c) for c in subs] for s, subs in tree.items()}
        under = {c for subs in tree.values() for c in subs}
        return Hierarchy.of(tree, [int(c) for c in sorted(classes) if int(c) not in under])

    def data_classes(self, options: Mapping[str, Any]) -> tuple[int, ...]:
        return ()

    def check_layout(self, phases: Sequence[PhaseLayout], study: StudyLayout,
                     options: Mapping[str, Any]) -> list[Problem]:
        """One replay budget; each phase's hierarchy (its classes are the subclasses) and a task sequence for it; no
        superclass with subclasses in both phases of one dataset."""
        spec = IircOptions.of(options)
        if spec.memory_per_class is not None and study.memory_size:
            return [Problem("scenario.iirc.memory_per_class", f"is {spec.memory_per_class} per label but "
                            f"training.memory_size gives a fixed total ({study.memory_size}) too; give one budget: "
                            "remove training.memory_size, or memory_per_class for the fixed total")]
        for phase in phases:
            try:
                hierarchy = phase_hierarchy(phase.classes, spec.source, phase.class_names, phase.class_groups)
            except ValueError as err:
                return [Problem("scenario.iirc.hierarchy", f"{err} ({phase.phase} phase, {phase.dataset})")]
            n_super = len(hierarchy.superclasses)
            if spec.first_task_superclasses > n_super:
                return [Problem("scenario.iirc.first_task_superclasses", f"is {spec.first_task_superclasses} but "
                                f"the {phase.phase} phase has {n_super} superclasses; lower it to at most {n_super}")]
            try:
                ordering_tasks(hierarchy, spec, study.seed, 0)
            except ValueError as err:
                return [Problem("scenario.iirc", f"{err} ({phase.phase} phase: {n_super} superclasses, "
                                f"{len(hierarchy.subclasses)} subclasses); change first_task_superclasses or "
                                "classes_per_task")]
        tuning, evaluation = phases
        if tuning.identity == evaluation.identity:
            problem = split_problem(tuning.classes, evaluation.classes, spec.source, tuning.class_names,
                                    tuning.class_groups)
            if problem:
                return [Problem("scenario.iirc.hierarchy", f"{problem}: GTEP's phases must split the superclasses; "
                                "split by group (datasets.split.by: group) or give disjoint whole superclasses")]
        return []

    def phase_increments(self, phases: Sequence[PhaseLayout], study: StudyLayout,
                         options: Mapping[str, Any]) -> list[int]:
        """The tuning phase's labels per task (the same in every ordering; the evaluation phase's may differ, and
        its jobs compute their own)."""
        spec = IircOptions.of(options)
        tuning = phases[0]
        return task_sizes(phase_hierarchy(tuning.classes, spec.source, tuning.class_names, tuning.class_groups), spec)

    def check(self, phases: Sequence[PhaseData], options: Mapping[str, Any]) -> list[Problem]:
        """Every class (a superclass, a subclass) needs training and test images; the phases' split of the
        superclasses is checked with the config, which reads the hierarchy."""
        return [problem for phase in phases for problem in empty_classes(phase)]

    def describe(self, phase: PhaseData, options: Mapping[str, Any], seed: int) -> list[tuple[str, int]]:
        """The labels of ordering 0's tasks, where the options hold the phase's hierarchy (the resolved config
        adds it per phase), with the training images of their classes before the superclass assignment."""
        if options.get("superclasses") is None:
            return []
        return [(f"{len(t.new_classes)} labels", sum(phase.train_counts.get(c, 0) for c in t.new_classes))
                for t in self.tasks(phase.classes, options, seed, 0)]

    def example_options(self) -> dict[str, Any]:
        # superclass ids come after the dataset's class ids (superclass_ids)
        return {"first_task_superclasses": 1, "classes_per_task": 2, "superclasses": {6: [0, 1], 7: [2, 3]},
                "classes": [0, 1, 2, 3, 4, 5]}

    def summary(self, options: Mapping[str, Any]) -> str:
        i = IircOptions.of(options)
        source = GROUPS if i.hierarchy == GROUPS else i.hierarchy.replace("\\", "/").rsplit("/", 1)[-1]
        extras = ([f"{i.memory_per_class}/label memory"] if i.memory_per_class is not None else []) + (
            [f"{i.in_task_validation:.0%} in-task validation"] if i.in_task_validation else [])
        return (f"iirc {i.first_task_superclasses} superclasses+{i.classes_per_task}/task ({source})"
                + "".join(f", {e}" for e in extras))


def with_aliases(metrics: Mapping[str, Any]) -> dict[str, Any]:
    """IIRC's metrics plus the class-incremental names gtep's tables and score read (see the module docstring)."""
    return add_aliases(metrics, ALIASES)
