"""The GTEP paper's own family: class-incremental scenarios such as "C50xT1+C10xT5", every image of a task's
classes, Acc / AvgAcc / HM and H* by their harmonic mean (paper sections 3-4)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from gtep.protocol import metrics as matrix_metrics
from gtep.protocol.families.base import (
    ACC,
    ACC_T,
    AVG_ACC,
    CLASS_INCREMENTAL,
    Metric,
    TaskFamily,
    increments_text,
    register_family,
)
from gtep.protocol.scenarios import TaskSpec, build_scenario, parse_increments

CLASS_INCREMENTAL_METRICS = (ACC, AVG_ACC, Metric("hmean", "HM"), Metric("forgetting", "forgetting"),
                             Metric("old_acc", "old"), Metric("new_acc", "new"), ACC_T)


@dataclass(frozen=True)
class ClassIncrementalOptions:
    """scenario.increments: classes per task, as '10x10', 'C50xT1+C10xT5' or a list."""

    increments: str | list[int] = field(metadata={
        "description": "classes per task: '10x10', 'C50xT1+C10xT5' or a list (class_incremental)"})

    @classmethod
    def of(cls, options: Mapping[str, Any]) -> "ClassIncrementalOptions":
        return cls(options["increments"])


@register_family
class ClassIncremental(TaskFamily):
    name = CLASS_INCREMENTAL
    description = "the GTEP paper's class-incremental scenarios (scenario.increments)"
    Options = ClassIncrementalOptions
    metrics = CLASS_INCREMENTAL_METRICS
    default_criterion = "hmean_acc_avgacc"
    reports_per_task = True

    def increments(self, options: Mapping[str, Any]) -> list[int]:
        return parse_increments(ClassIncrementalOptions.of(options).increments)

    def tasks(self, classes: Sequence[int], options: Mapping[str, Any], seed: int, ordering: int) -> list[TaskSpec]:
        return build_scenario(classes, self.increments(options), seed, ordering)

    def summarize(self, matrix: np.ndarray, test_counts: Sequence[int],
                  tasks: Sequence[TaskSpec]) -> dict[str, float | list[float]]:
        return matrix_metrics.summarize(matrix, test_counts)

    def example_options(self) -> dict[str, Any]:
        return {"increments": "2x3"}

    def summary(self, options: Mapping[str, Any]) -> str:
        return increments_text(ClassIncrementalOptions.of(options).increments)
