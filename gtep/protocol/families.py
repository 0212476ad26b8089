"""Scenario families: the generator F of the GTEP paper made pluggable, with each family's metrics and criterion.

The paper (section 5) says its protocol carries over to other continual-learning settings by changing the
scenario generator F. A family is one such setting: it turns (a phase's classes, the family's options, the
study seed, ordering s) into that phase's tasks, says what a learner must be able to do with them (its data
flow), which metrics one ordering reports, and which criterion selects H* unless `search.criterion` says
otherwise. Both phases run the same family with the same options, each on its own classes.

    class_incremental  the paper's own: increments such as "C50xT1+C10xT5", every image of a task's classes
    fscil              few-shot class-incremental (Tang et al., papers/fscil-gacc.txt): a base session with all
                       images of its classes, then N-way K-shot sessions; metrics aAcc, gAcc AUC, ...

A family is pure (numpy only), so it is tested without Ray, MLflow or torch.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, ClassVar, Literal, Mapping, Sequence

import numpy as np

from gtep.protocol import fscil_metrics, metrics
from gtep.protocol.scenarios import TaskSpec, build_scenario, class_ordering, ordering_seed, split_tasks
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
    selectable  may be a component of the criterion that selects H* (search.criterion)"""

    name: str
    label: str
    unit: Unit = "percent"
    curve: bool = False
    selectable: bool = True
    first_step: int = 1

    @property
    def percent(self) -> bool:
        return self.unit == "percent"


def curve(name: str, label: str, first_step: int = 1, unit: Unit = "percent") -> Metric:
    return Metric(name, label, unit, curve=True, selectable=False, first_step=first_step)


# Every family logs these under the class-incremental names gtep's tables and scores read (its own metrics copied
# into them where its paper has other names: add_aliases).
ACC, AVG_ACC = Metric("acc", "Acc"), Metric("avg_acc", "AvgAcc")
ACC_T = curve("acc_t", "Acc after task t")
CLASS_INCREMENTAL_METRICS = (ACC, AVG_ACC, Metric("hmean", "HM"), Metric("forgetting", "forgetting"),
                             Metric("old_acc", "old"), Metric("new_acc", "new"), ACC_T)


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
    """What the data cannot satisfy: the config field at fault and the message with the fix."""

    field: str
    message: str


class ScenarioFamily:
    """One setting: its generator, metrics and default criterion. Subclasses set the class variables and
    override what differs; `options` are the family's section of the experiment file, as a mapping."""

    name: ClassVar[str]
    description: ClassVar[str]
    data_flow: ClassVar[str] = "class_incremental"  # what a learner must support (IncrementalLearner.data_flows)
    metrics: ClassVar[tuple[Metric, ...]]  # the family's metric table, scalars in the order tables show them
    default_criterion: ClassVar[str] = "hmean_acc_avgacc"
    headline: ClassVar[tuple[str, ...]] = ()  # metrics the terminal tables add beside Acc, AvgAcc and HM

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

    def increments(self, options: Mapping[str, Any]) -> list[int]:
        """Classes per task; a phase needs exactly their sum of classes."""
        raise NotImplementedError

    def data_classes(self, options: Mapping[str, Any]) -> tuple[int, ...]:
        """Classes a phase's data must hold besides the phase's own (FLUID's pretrain classes); default none."""
        return ()

    def tasks(self, classes: Sequence[int], options: Mapping[str, Any], seed: int, ordering: int) -> list[TaskSpec]:
        return build_scenario(classes, self.increments(options), seed, ordering)

    def summarize(self, matrix: np.ndarray, test_counts: Sequence[int],
                  tasks: Sequence[TaskSpec]) -> dict[str, float | list[float]]:
        return metrics.summarize(matrix, test_counts)

    def describe_tasks(self, phase: PhaseData, options: Mapping[str, Any], seed: int) -> list[tuple[str, int]]:
        """(what a task holds, its training images) in ordering 0, for `gtep check`; [] where the family's work
        is not tasks of classes."""
        out = []
        for t in self.tasks(phase.classes, options, seed, 0):
            counts = [phase.train_counts.get(c, 0) for c in t.new_classes]
            images = sum(min(n, t.shots) if t.shots else n for n in counts)
            out.append((f"{len(t.new_classes)} classes" + (f", {t.shots} shots each" if t.shots else ""), images))
        return out

    def check_data(self, phase: PhaseData, options: Mapping[str, Any]) -> list[Problem]:
        """What a phase's data cannot give this family, before any compute. By default every class needs
        training images (to learn it) and test images (else its accuracy is 0/0)."""
        return [Problem(field, message) for field, message in empty_classes(phase)]


def empty_classes(phase: PhaseData) -> list[tuple[str, str]]:
    """A phase's classes with no training or no test images, as (field, message) with the fix."""
    out = []
    for split, counts in (("training", phase.train_counts), ("test", phase.test_counts)):
        empty = [c for c in phase.classes if counts.get(c, 0) == 0]
        if empty:
            out.append(("datasets", f"the {phase.phase} phase's classes {empty[:5]} have no {split} images in "
                        f"{phase.dataset}; leave them out (datasets.*.classes) or add their images"))
    return out


FAMILIES: Registry[ScenarioFamily] = Registry("scenario family")


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


@register_family
class ClassIncremental(ScenarioFamily):
    name = CLASS_INCREMENTAL
    description = "the GTEP paper's class-incremental scenarios (scenario.increments)"
    metrics = CLASS_INCREMENTAL_METRICS

    def increments(self, options: Mapping[str, Any]) -> list[int]:
        from gtep.protocol.scenarios import parse_increments

        return parse_increments(options["increments"])


# ---------------------------------------------------------------- FSCIL

@dataclass(frozen=True)
class FewShotOptions:
    """scenario.fscil: a base session of `base_classes` with all their images, then `sessions` sessions of
    `ways` classes with `shots` training images each (drawn per ordering, or given by `shot_index`)."""

    base_classes: int
    ways: int
    shots: int
    sessions: int
    # The benchmarks' fixed split: classes in index order (the first base_classes form the base session), the
    # same in every ordering; only the shots are drawn per ordering. Off: classes shuffled per ordering.
    fixed_order: bool = False
    shot_index: str | None = None  # JSON {class id: [training image indices]}: a benchmark's own shots
    draw_missing_shots: bool = False  # classes the index file omits draw their shots (else refused)
    # the index file's content, read by the config ({"<class id>": [positions in the dataset's training arrays]}),
    # so workers and checks need no file
    shots_given: Mapping[str, Sequence[int]] | None = None

    @property
    def given(self) -> dict[int, list[int]] | None:
        """The benchmark's own shots: class id -> positions in the dataset's training arrays."""
        if self.shots_given is None:
            return None
        return {int(c): [int(i) for i in v] for c, v in self.shots_given.items()}

    @classmethod
    def of(cls, options: Mapping[str, Any]) -> "FewShotOptions":
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in options.items() if k in known})

    @property
    def increments(self) -> list[int]:
        return [self.base_classes] + [self.ways] * self.sessions


@register_family
class FewShotClassIncremental(ScenarioFamily):
    name = "fscil"
    description = "few-shot class-incremental: a base session, then N-way K-shot sessions (scenario.fscil)"
    metrics = (Metric("gacc_auc", "gAcc AUC"), Metric("aacc", "aAcc"), Metric("lacc", "lAcc"), Metric("tacc", "tAcc"),
               Metric("hacc", "hAcc"), Metric("novel_acc", "novel"), ACC, AVG_ACC, Metric("hmean", "HM"),
               Metric("aacc_sample", "aAcc (samples)"), Metric("gacc_auc_exact", "gAcc AUC (exact)"),
               Metric("pd", "PD"), Metric("rpd", "RPD", "ratio"), Metric("kr", "KR", "ratio"),
               Metric("forgetting", "forgetting"),
               ACC_T, curve("aacc_t", "aAcc after session t"), curve("gacc_alpha", "gAcc(alpha), alpha = k/12", 0))
    default_criterion = "gacc_auc"
    headline = ("gacc_auc", "aacc", "novel_acc")

    def increments(self, options: Mapping[str, Any]) -> list[int]:
        return FewShotOptions.of(options).increments

    def tasks(self, classes: Sequence[int], options: Mapping[str, Any], seed: int, ordering: int) -> list[TaskSpec]:
        spec = FewShotOptions.of(options)
        ordered = sorted(classes) if spec.fixed_order else class_ordering(classes, seed, ordering)
        return [TaskSpec(t.index, t.new_classes, t.seen_classes, None if t.index == 0 else spec.shots)
                for t in split_tasks(ordered, spec.increments)]

    def check_data(self, phase: PhaseData, options: Mapping[str, Any]) -> list[Problem]:
        """Every class that can come in a few-shot session has K training images (a class with fewer would
        make an N-way "K-shot" session silently hold fewer shots), and a shot index file fits the data."""
        spec = FewShotOptions.of(options)
        problems = super().check_data(phase, options)
        # with fixed_order the base classes are the first ones; otherwise any class can land in a session
        few_shot = sorted(phase.classes)[spec.base_classes:] if spec.fixed_order else list(phase.classes)
        short = [(c, phase.train_counts.get(c, 0)) for c in few_shot if phase.train_counts.get(c, 0) < spec.shots]
        if short:
            listed = ", ".join(f"class {c} has {n}" for c, n in short[:5])
            problems.append(Problem("scenario.fscil.shots", f"{spec.shots} shots per class, but in the {phase.phase} "
                                    f"phase {listed} training images ({len(short)} classes short); lower shots "
                                    "or leave those classes out"))
        given = spec.given
        if given is not None and phase.train_labels is not None:
            problem = check_shot_index(given, phase.train_labels, few_shot, spec.shots, spec.draw_missing_shots)
            if problem:
                problems.append(Problem("scenario.fscil.shot_index", f"{problem} ({phase.phase} phase, "
                                        f"{phase.dataset}; indices are positions in the dataset's training arrays)"))
        return problems

    def summarize(self, matrix: np.ndarray, test_counts: Sequence[int],
                  tasks: Sequence[TaskSpec]) -> dict[str, float | list[float]]:
        base, ways = len(tasks[0].new_classes), len(tasks[1].new_classes) if len(tasks) > 1 else 1
        out = metrics.summarize(matrix, test_counts)
        out.update(fscil_metrics.summarize_fscil(np.asarray(matrix, dtype=float), list(test_counts), base, ways))
        return out


def few_shot_indices(train_labels: np.ndarray, task: TaskSpec, seed: int, ordering: int,
                     given: Mapping[int, Sequence[int]] | None = None) -> np.ndarray:
    """The training images of a task (indices into the phase's training arrays, ascending): every image of its
    classes, or `task.shots` per class: those `given` lists first (a benchmark's index file), else drawn
    without replacement for (seed, ordering, class), so every set of the study sees the same shots."""
    picked = []
    for c in task.new_classes:
        of_class = np.flatnonzero(train_labels == c)
        if task.shots is None:
            picked.append(of_class)
        elif given is not None and c in given:
            picked.append(np.asarray(given[c][: task.shots], dtype=np.int64))
        else:
            rng = np.random.default_rng([ordering_seed(seed, ordering), int(c)])
            picked.append(rng.choice(of_class, size=min(task.shots, len(of_class)), replace=False))
    return np.sort(np.concatenate(picked)) if picked else np.zeros(0, dtype=np.int64)


def shots_at_phase_positions(given: Mapping[int, Sequence[int]], train_index: np.ndarray) -> dict[int, list[int]]:
    """An index file's dataset positions as positions in a phase's training arrays (`train_index`: each phase
    image's dataset position, ascending). The pre-flight check has made sure every listed image is there."""
    out = {}
    for c, indices in given.items():
        wanted = np.asarray(indices, dtype=np.int64)
        at = np.searchsorted(train_index, wanted)
        kept = at < len(train_index)
        kept[kept] = train_index[at[kept]] == wanted[kept]
        out[c] = [int(i) for i in at[kept]]
    return out


def check_shot_index(given: Mapping[int, Sequence[int]], train_labels: np.ndarray, classes: Sequence[int],
                     shots: int, draw_missing: bool = False) -> str | None:
    """What is wrong with an index file for the classes that can be in a few-shot session (None: nothing): every
    listed image must be a training image of its class (indices into the dataset's training arrays), listed once;
    each of those classes needs `shots` of them, and a class the file omits is an error unless `draw_missing`."""
    for c, indices in given.items():
        bad = [i for i in indices if not 0 <= i < len(train_labels) or train_labels[i] != c]
        if bad:
            return f"class {c}: training images {bad[:5]} are not of that class (or outside the training arrays)"
        if len(set(indices)) != len(indices):
            return f"class {c}: lists an image twice; list {shots} distinct training images"
    short = [c for c in classes if c in given and len(given[c]) < shots]
    if short:
        return f"classes {short[:5]} list fewer than {shots} images"
    missing = [c for c in classes if c not in given]
    if missing and not draw_missing:
        return (f"classes {missing[:5]} ({len(missing)} in all) are not in the file; list them, or set "
                "scenario.fscil.draw_missing_shots: true to draw their shots")
    return None


def family_of(name: str) -> ScenarioFamily:
    return FAMILIES.get(name)
