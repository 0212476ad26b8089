"""The FLUID scenario family (Flexible Sequential Learning, papers/fluid.txt; notes 004.1-004.5).

A phase is not a task sequence but a stream: each sequence (the family's "ordering") mixes `n_pretrain_classes`
of the backbone's pretrain classes (`pretrain_classes`: kept out of both phases' classes; the stream shows
their TEST images, which the backbone did not train on) with `n_novel_classes` of the phase's own classes
(train and test images alike), with Zipf-distributed images per class (gtep/protocol/fluid.py). Every sample
is predicted (a class seen so far, or "unseen") before its label is revealed; the learner decides when and
how to update. The two phases' novel classes are disjoint, as GTEP's phases always are; the pretrain classes
are shared by both streams, as the paper's validation sequences share theirs. A sequence's seed mixes the
study seed, the ordering and the phase's classes, so the two phases draw different sequences.

Metrics (gtep/protocol/fluid_metrics.py) are over the stream's own predictions (prequential); H* by mean
per-class accuracy unless search.criterion says otherwise; compute (GMACs, inference and updates) is logged
beside every score. Aliases for the parts of gtep that read the class-incremental names (tables' Acc and
AvgAcc, MLflow's per-task `acc_t` steps):

    acc      = overall_acc          avg_acc = mean_per_class_acc          acc_t = rolling_acc

Data flow "stream" (gtep/engine/stream.py runs it). Pure: stdlib and numpy only.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, ClassVar, Mapping, Sequence

import numpy as np

from gtep.protocol import fluid_metrics
from gtep.protocol.families import METRIC_LABELS, ScenarioFamily, add_aliases, register_family
from gtep.protocol.fluid import StreamSpec, fluid_stream
from gtep.protocol.scenarios import TaskSpec

FLUID = "fluid"
STREAM = "stream"
ALIASES = {"acc": "overall_acc", "avg_acc": "mean_per_class_acc", "acc_t": "rolling_acc"}

METRIC_LABELS.update({"mean_per_class_acc": "mean per-class", "overall_acc": "overall",
                      "pretrain_head_acc": "pretrain-head", "pretrain_tail_acc": "pretrain-tail",
                      "novel_head_acc": "novel-head", "novel_tail_acc": "novel-tail", "unseen_auroc": "unseen AUROC",
                      "unseen_f1": "unseen F1", "gmacs_inference": "GMACs inference", "gmacs_update": "GMACs update",
                      "gmacs_total": "GMACs", "head_cut": "head cut"})


@dataclass(frozen=True)
class FluidOptions:
    """scenario.fluid as the family takes it (gtep/config.py FluidSpec validates it)."""

    pretrain_classes: tuple[int, ...]
    n_pretrain_classes: int
    n_novel_classes: int
    total_samples: int
    per_class_cap: int
    zipf_s: float = 1.0
    head_cut: int = 50  # head: more than head_cut samples in the sequence (the paper's text)
    window: int = 100  # rolling accuracy's window, in steps
    backward_factor: float = 1.0  # a backward pass costs this many forward passes (notes 004.2: the paper's ~1)

    @classmethod
    def of(cls, options: Mapping[str, Any]) -> "FluidOptions":
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in options.items() if k in known}
        values["pretrain_classes"] = tuple(int(c) for c in values.get("pretrain_classes", ()))
        return cls(**values)


def class_pools(y_train: np.ndarray, y_test: np.ndarray, classes: Sequence[int],
                with_train: bool) -> dict[int, np.ndarray]:
    """Class -> the ids of the images the stream may show: test image i has id len(y_train) + i, training image
    i has id i (only `with_train`: novel classes; the pretrain classes' training images trained the backbone)."""
    pools = {}
    for c in classes:
        test = np.flatnonzero(y_test == c) + len(y_train)
        pools[int(c)] = np.concatenate([np.flatnonzero(y_train == c), test]) if with_train else test
    return pools


def sequence_seed(seed: int, ordering: int, classes: Sequence[int]) -> list[int]:
    """The seed of one phase's sequence `ordering`: distinct per phase (its classes) and per ordering."""
    return [int(seed), int(ordering), *sorted(int(c) for c in classes)]


def phase_stream(y_train: np.ndarray, y_test: np.ndarray, classes: Sequence[int], options: FluidOptions,
                 seed: int, ordering: int) -> StreamSpec:
    """Sequence `ordering` of a phase whose novel classes are `classes` (labels are dataset class ids)."""
    return fluid_stream(class_pools(y_train, y_test, options.pretrain_classes, with_train=False),
                        class_pools(y_train, y_test, classes, with_train=True), options.n_pretrain_classes,
                        options.n_novel_classes, options.zipf_s, options.total_samples, options.per_class_cap,
                        sequence_seed(seed, ordering, classes))


def with_aliases(metrics: Mapping[str, Any]) -> dict[str, Any]:
    return add_aliases(metrics, ALIASES)


@register_family
class FluidStream(ScenarioFamily):
    name = FLUID
    description = ("FLUID: an open-world, Zipf-tailed stream of pretrain and novel classes, each sample predicted "
                   "before its label is revealed (scenario.fluid)")
    data_flow = STREAM
    metric_names = (*fluid_metrics.METRIC_NAMES, "acc", "avg_acc")
    curve_metrics = (*fluid_metrics.CURVE_METRICS, "acc_t")
    default_criterion = "mean_per_class_acc"
    headline: ClassVar[tuple[str, ...]] = ("mean_per_class_acc", "overall_acc", "unseen_auroc", "gmacs_total")

    def increments(self, options: Mapping[str, Any]) -> list[int]:
        """One 'task': the classes of a sequence (recorded as the study's increments)."""
        spec = FluidOptions.of(options)
        return [spec.n_pretrain_classes + spec.n_novel_classes]

    def data_classes(self, options: Mapping[str, Any]) -> tuple[int, ...]:
        """Classes a phase's data must hold besides its own: the pretrain classes the streams show."""
        return FluidOptions.of(options).pretrain_classes

    def tasks(self, classes: Sequence[int], options: Mapping[str, Any], seed: int, ordering: int) -> list[TaskSpec]:
        raise NotImplementedError("a FLUID phase is a stream, not tasks; gtep.engine.stream runs it (phase_stream)")

    def summarize(self, matrix: np.ndarray, test_counts: Sequence[int],
                  tasks: Sequence[TaskSpec]) -> dict[str, float | list[float]]:
        raise NotImplementedError("FLUID's metrics are over the stream's predictions; gtep.engine.stream computes "
                                  "them with gtep.protocol.fluid_metrics")
