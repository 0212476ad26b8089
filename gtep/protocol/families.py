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
from typing import Any, ClassVar, Mapping, Sequence

import numpy as np

from gtep.protocol import fluid_metrics, fscil_metrics, metrics
from gtep.protocol.scenarios import TaskSpec, build_scenario, class_ordering, ordering_seed, split_tasks
from gtep.registry import Registry

# Per-ordering metrics that are ratios, not accuracies: logged as they are, never as percent (FLUID's AUROC, F1,
# GMACs and head/tail cut included).
RATIO_METRICS = frozenset({"rpd", "kr"}) | fluid_metrics.RAW_METRICS

CLASS_INCREMENTAL = "class_incremental"

# How tables and notes name the metrics (the papers' names).
METRIC_LABELS = {"acc": "Acc", "avg_acc": "AvgAcc", "hmean": "HM", "gacc_auc": "gAcc AUC", "aacc": "aAcc",
                 "lacc": "lAcc", "tacc": "tAcc", "hacc": "hAcc", "novel_acc": "novel", "aacc_sample": "aAcc (samples)",
                 "gacc_auc_exact": "gAcc AUC (exact)", "pd": "PD", "rpd": "RPD", "kr": "KR", "forgetting": "forgetting",
                 "old_acc": "old", "new_acc": "new"}


class ScenarioFamily:
    """One setting: its generator, metrics and default criterion. Subclasses set the class variables and
    override what differs; `options` are the family's section of the experiment file, as a mapping."""

    name: ClassVar[str]
    description: ClassVar[str]
    data_flow: ClassVar[str] = "class_incremental"  # what a learner must support (IncrementalLearner.data_flows)
    metric_names: ClassVar[tuple[str, ...]]  # scalar per-ordering metrics, in the order tables show them
    curve_metrics: ClassVar[tuple[str, ...]] = ("acc_t",)  # per-ordering lists (one value per task, or a curve)
    default_criterion: ClassVar[str] = "hmean_acc_avgacc"
    headline: ClassVar[tuple[str, ...]] = ()  # metrics the terminal tables add beside Acc, AvgAcc and HM
    # scalar metrics that are not fractions (cross-entropies, memory ratios, operation counts): MLflow logs them
    # as they are, not as percent (as RATIO_METRICS)
    plain_metrics: ClassVar[frozenset[str]] = frozenset()

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


FAMILIES: Registry[ScenarioFamily] = Registry("scenario family")


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
    metric_names = ("acc", "avg_acc", "hmean", "forgetting", "old_acc", "new_acc")

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
    metric_names = ("gacc_auc", "aacc", "lacc", "tacc", "hacc", "novel_acc", "acc", "avg_acc", "hmean",
                    "aacc_sample", "gacc_auc_exact", "pd", "rpd", "kr", "forgetting")
    curve_metrics = ("acc_t", "aacc_t", "gacc_alpha")
    default_criterion = "gacc_auc"
    headline = ("gacc_auc", "aacc", "novel_acc")

    def increments(self, options: Mapping[str, Any]) -> list[int]:
        return FewShotOptions.of(options).increments

    def tasks(self, classes: Sequence[int], options: Mapping[str, Any], seed: int, ordering: int) -> list[TaskSpec]:
        spec = FewShotOptions.of(options)
        ordered = sorted(classes) if spec.fixed_order else class_ordering(classes, seed, ordering)
        return [TaskSpec(t.index, t.new_classes, t.seen_classes, None if t.index == 0 else spec.shots)
                for t in split_tasks(ordered, spec.increments)]

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


def check_shot_index(given: Mapping[int, Sequence[int]], train_labels: np.ndarray, classes: Sequence[int],
                     shots: int) -> str | None:
    """What is wrong with an index file for a phase's classes (None: nothing): every listed image must be of
    its class, and every class of the phase needs `shots` of them (base classes use all images; listing them
    is harmless)."""
    for c, indices in given.items():
        bad = [i for i in indices if not 0 <= i < len(train_labels) or train_labels[i] != c]
        if bad:
            return f"class {c}: training images {bad[:5]} are not of that class"
    short = [c for c in classes if c in given and len(given[c]) < shots]
    if short:
        return f"classes {short[:5]} list fewer than {shots} images"
    return None


def family_of(name: str) -> ScenarioFamily:
    return FAMILIES.get(name)
