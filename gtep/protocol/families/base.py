"""What every scenario family is: the generator F of the GTEP paper made pluggable (its section 5), with its
options, pre-flight checks, description and metric table. One folder a family (gtep/protocol/families/<name>/),
found through the FAMILIES registry; both phases run the same family with the same options on their own classes.

A family is pure (stdlib and numpy), so it is tested without Ray, MLflow or torch.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, fields
from typing import Any, ClassVar, Literal, Mapping, Self, Sequence, cast

import numpy as np

from gtep.protocol.scenarios import TaskSpec
from gtep.registry import Registry

CLASS_INCREMENTAL = "class_incremental"

Unit = Literal["percent", "ratio", "count"]


@dataclass(frozen=True)
class Metric:
    """One row of a family's metric table: the only list of a family's metrics, read by the config's criterion
    check, MLflow tracking, the terminal tables, `gtep report` and the UI views.

    unit      percent: a fraction, logged to MLflow and shown x100; ratio, count: as they are (AUROC, CE, MACs)
    curve     a per-ordering list (one value per task, or a curve's points), logged as MLflow step metrics
              from step `first_step`; otherwise a scalar, logged with its mean and `_std` over the orderings
    selectable  may be a component of the criterion that selects H* (search.criterion)
    undefined   why a finished ordering may leave it NaN (the report shows it in place of a bare NaN); "": never"""

    name: str
    label: str
    unit: Unit = "percent"
    curve: bool = False
    selectable: bool = True
    first_step: int = 1
    undefined: str = ""

    @property
    def percent(self) -> bool:
        return self.unit == "percent"


def curve(name: str, label: str, first_step: int = 1, unit: Unit = "percent") -> Metric:
    return Metric(name, label, unit, curve=True, selectable=False, first_step=first_step)


# Every family logs these under the class-incremental names gtep's tables and scores read (its own metrics copied
# into them where its paper has other names: add_aliases).
ACC, AVG_ACC = Metric("acc", "Acc"), Metric("avg_acc", "AvgAcc")
ACC_T = curve("acc_t", "Acc after task t")


@dataclass(frozen=True)
class PhaseData:
    """What a family's pre-flight check sees of one phase's data: its classes and their image counts, not
    the pixels. `train_labels` are the dataset's training labels (the index space of a benchmark's index files)."""

    phase: str
    dataset: str
    classes: tuple[int, ...]
    train_counts: Mapping[int, int]
    test_counts: Mapping[int, int]
    train_labels: np.ndarray | None = None


@dataclass(frozen=True)
class Problem:
    """What the data cannot satisfy: the config field at fault, the message with the fix, and the phase whose data
    it is ("datasets" as the field means that phase's dataset section)."""

    field: str
    message: str
    phase: str = ""


@dataclass(frozen=True)
class PhaseLayout:
    """What the config knows of a phase before any image is read: its dataset's class names and groups and the
    phase's classes, for the checks a family makes against the layout of both phases (`check_layout`)."""

    phase: str
    dataset: str
    dataset_field: str  # the config field that names the phase's dataset
    identity: str  # two phases with one identity draw from one class pool
    classes: tuple[int, ...]
    class_names: tuple[str, ...]
    class_groups: tuple[str, ...] | None


@dataclass(frozen=True)
class StudyLayout:
    """The study-wide settings a family's layout checks read."""

    seed: int
    memory_size: int  # training.memory_size
    pretrain_classes: tuple[int, ...] | None  # the pretrain section's classes; None: no pretrain section


class FamilyOptions:
    """Base of a family's Options dataclass: `of` builds it from the family's options section, keeping the keys
    that are its fields and leaving the others (keys the section shares with other families' options)."""

    @classmethod
    def of(cls, options: Mapping[str, Any]) -> Self:
        known = {f.name for f in fields(cast(Any, cls))}
        return cls(**{k: v for k, v in options.items() if k in known})


class ScenarioFamily(ABC):
    """One setting: its options, generator, checks, description, metric table and default criterion. Every family
    implements every method here (the family contract test runs each registered family through them); a family
    whose orderings are tasks of classes scored by an accuracy matrix extends TaskFamily instead.

    `options` are the family's section of the experiment file as a mapping (what `Options.of` reads)."""

    name: ClassVar[str]
    description: ClassVar[str]
    data_flow: ClassVar[str]  # what a learner must support (IncrementalLearner.data_flows); an engine flow runs it
    Options: ClassVar[type]  # the options as a frozen dataclass with `of(mapping)`: the family's schema
    metrics: ClassVar[tuple[Metric, ...]]  # the family's metric table, scalars in the order tables show them
    default_criterion: ClassVar[str]  # H*'s criterion unless search.criterion says otherwise
    headline: ClassVar[tuple[str, ...]] = ()  # metrics the terminal tables add beside Acc, AvgAcc and HM
    # The YAML key of the family's section of scenario (its name), whose schema is Options: each field's
    # constraints and description are in its dataclasses.field metadata (pydantic Field's keys: description, ge,
    # gt, le, lt, min_length), {"file": <reader>} marks a file path the config reads ({"unless": <value>}: the value
    # that names no file), {"filled_from": <field>} the option that holds that file's content (no key of the
    # section). None: no section; the options are scenario.increments (class_incremental).
    section: ClassVar[str | None] = None

    @abstractmethod
    def increments(self, options: Mapping[str, Any]) -> list[int]:
        """Classes (or labels) per task of a phase, as the study records them."""

    @abstractmethod
    def data_classes(self, options: Mapping[str, Any]) -> tuple[int, ...]:
        """Classes a phase's data must hold besides the phase's own (FLUID's pretrain classes)."""

    @abstractmethod
    def check(self, phases: Sequence[PhaseData], options: Mapping[str, Any]) -> list[Problem]:
        """What the phases' data cannot give this family, before any compute ([]: nothing)."""

    @abstractmethod
    def describe(self, phase: PhaseData, options: Mapping[str, Any], seed: int) -> list[tuple[str, int]]:
        """(what a unit of work holds, its training images) in ordering 0, for `gtep check`."""

    @abstractmethod
    def example_options(self) -> dict[str, Any]:
        """A small valid options section (with any keys the resolution adds), for the docs and the contract test."""

    def options(self, options: Mapping[str, Any]) -> Any:
        """The options section as the family's Options."""
        return getattr(self.Options, "of")(options)

    def option_problems(self, options: Mapping[str, Any]) -> list[Problem]:
        """What is wrong across the options' fields (each field's own constraints are in Options' metadata), as
        the config reports it ([]: nothing)."""
        return []

    def summary(self, options: Mapping[str, Any]) -> str:
        """The scenario in one phrase, for terminals and run names: 'fscil 20+4x5-way 5-shot'."""
        return f"{self.name} {increments_text(options.get('increments'))}"

    # the metrics the paper-shaped report table adds after each phase's HM, and the note that says what they mean
    table_metrics: ClassVar[tuple[str, ...]] = ()
    table_note: ClassVar[str] = ""
    # whether the family's orderings report after each task (search.fidelity: tasks, search.protocol: first_task)
    reports_per_task: ClassVar[bool] = False
    # the option that replaces training.memory_size as the whole replay budget when given (IIRC's memory_per_class)
    memory_budget_option: ClassVar[str | None] = None

    def check_layout(self, phases: Sequence[PhaseLayout], study: StudyLayout,
                     options: Mapping[str, Any]) -> list[Problem]:
        """What the phases' classes (not their images: `check` does those) cannot give this family ([]: nothing)."""
        return []

    def phase_increments(self, phases: Sequence[PhaseLayout], study: StudyLayout,
                         options: Mapping[str, Any]) -> list[int]:
        """The study's recorded classes (or labels) per task, once the phases are known (default: `increments`)."""
        return self.increments(options)

    def pretrain_holdout(self, options: Mapping[str, Any]) -> tuple[float, tuple[int, ...]]:
        """(share, classes): training images of those classes the `pretrain:` section must leave out, because the
        scenario shows them as images the backbone never saw (gtep.protocol.holdout); (0, ()) for none."""
        return 0.0, ()

    @property
    def metric_names(self) -> tuple[str, ...]:
        """Scalar per-ordering metrics, in the order tables show them."""
        return tuple(m.name for m in self.metrics if not m.curve)

    @property
    def curve_metrics(self) -> tuple[str, ...]:
        """Per-ordering lists (one value per task, or a curve)."""
        return tuple(m.name for m in self.metrics if m.curve)

    @property
    def plain_metrics(self) -> frozenset[str]:
        """Scalars that are not fractions (ratios, cross-entropies, operation counts): logged as they are."""
        return frozenset(m.name for m in self.metrics if not m.curve and not m.percent)

    def metric(self, name: str) -> Metric | None:
        return next((m for m in self.metrics if m.name == name), None)


class TaskFamily(ScenarioFamily):
    """A family whose ordering is a list of tasks of classes and whose metrics come from the accuracy matrix (the
    class_incremental data flow: gtep/engine/runner.py). Every class needs training and test images."""

    data_flow = "class_incremental"

    @abstractmethod
    def tasks(self, classes: Sequence[int], options: Mapping[str, Any], seed: int, ordering: int) -> list[TaskSpec]:
        """F(D, s): ordering s's tasks of the phase's classes."""

    @abstractmethod
    def summarize(self, matrix: np.ndarray, test_counts: Sequence[int],
                  tasks: Sequence[TaskSpec]) -> dict[str, float | list[float]]:
        """An ordering's metrics (the family's table) from its accuracy matrix."""

    def data_classes(self, options: Mapping[str, Any]) -> tuple[int, ...]:
        return ()

    def check_layout(self, phases: Sequence[PhaseLayout], study: StudyLayout,
                     options: Mapping[str, Any]) -> list[Problem]:
        """The tasks take exactly the phase's classes."""
        increments = self.increments(options)
        return [self.classes_problem(phase, increments) for phase in phases if sum(increments) != len(phase.classes)]

    def classes_problem(self, phase: PhaseLayout, increments: Sequence[int]) -> Problem:
        """A phase whose classes the tasks do not take exactly, with the fix."""
        return Problem("scenario.increments", f"sum to {sum(increments)} classes but the {phase.phase} phase has "
                       f"{len(phase.classes)} ({phase.dataset}); change the increments or restrict the classes in "
                       f"{phase.dataset_field.rsplit('.', 1)[0]}", phase.phase)

    def given_shots(self, options: Mapping[str, Any]) -> dict[int, list[int]] | None:
        """A benchmark's own shots for tasks with `shots` (class id -> positions in the dataset's training arrays),
        or None: every task draws its shots (gtep.protocol.scenarios.few_shot_indices)."""
        return None

    def check(self, phases: Sequence[PhaseData], options: Mapping[str, Any]) -> list[Problem]:
        return [problem for phase in phases for problem in empty_classes(phase)]

    def describe(self, phase: PhaseData, options: Mapping[str, Any], seed: int) -> list[tuple[str, int]]:
        out = []
        for t in self.tasks(phase.classes, options, seed, 0):
            counts = [phase.train_counts.get(c, 0) for c in t.new_classes]
            images = sum(min(n, t.shots) if t.shots else n for n in counts)
            out.append((f"{len(t.new_classes)} classes" + (f", {t.shots} shots each" if t.shots else ""), images))
        return out


def increments_text(increments: str | Sequence[int] | None) -> str:
    """scenario.increments as written: '10x10', or a list as '50+10+10'."""
    return increments if isinstance(increments, str) else "+".join(map(str, increments or []))


def empty_classes(phase: PhaseData, splits: Sequence[str] = ("training", "test")) -> list[Problem]:
    """A phase's classes with no training (or no test) images, with the fix."""
    out = []
    for split in splits:
        counts = phase.train_counts if split == "training" else phase.test_counts
        empty = [c for c in phase.classes if counts.get(c, 0) == 0]
        if empty:
            out.append(Problem("datasets", f"the {phase.phase} phase's classes {empty[:5]} have no {split} images in "
                               f"{phase.dataset}; leave them out (datasets.*.classes) or add their images",
                               phase.phase))
    return out


def _plugin_family(name: str, obj: Any) -> ScenarioFamily:
    """The family of a `module:Class` entry point in gtep.families (an instance, as register_family makes)."""
    family = obj() if isinstance(obj, type) else obj
    if family.name != name:
        raise ValueError(f"the family's name is {family.name!r}; the entry point must have that name")
    return cast(ScenarioFamily, family)


# plugins: the gtep.families entry points (gtep.plugins), loaded at the first lookup (gtep.config's import)
FAMILIES: Registry[ScenarioFamily] = Registry("scenario family", group="gtep.families", entry_of=_plugin_family)


def known_metrics() -> dict[str, Metric]:
    """Every registered family's metrics by name (a name two families share keeps the first one's row; they
    agree on its unit, as the family contract test checks)."""
    out: dict[str, Metric] = {}
    for name in FAMILIES:
        for metric in FAMILIES.get(name).metrics:
            out.setdefault(metric.name, metric)
    return out


def metric_label(name: str) -> str:
    """How tables and notes name a metric (its paper's name); a metric no family lists is shown by its name."""
    metric = known_metrics().get(name)
    return metric.label if metric else name


def add_aliases(metrics: Mapping[str, Any], aliases: Mapping[str, str]) -> dict[str, Any]:
    """A family's metrics plus the class-incremental names gtep's tables and scores read (acc, avg_acc, acc_t),
    each a copy of the family's own metric it stands for (`aliases`: alias -> the family's name)."""
    out = dict(metrics)
    for alias, name in aliases.items():
        if name in out:
            out[alias] = out[name]
    return out


def register_family(family: type[ScenarioFamily]) -> type[ScenarioFamily]:
    FAMILIES.register(family.name)(family())
    return family



def family_of(name: str) -> ScenarioFamily:
    return FAMILIES.get(name)
