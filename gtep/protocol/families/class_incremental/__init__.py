"""The GTEP paper's own family: class-incremental scenarios such as "C50xT1+C10xT5", every image of a task's
classes, Acc / AvgAcc / HM and H* by their harmonic mean (paper sections 3-4)."""
from __future__ import annotations

from typing import Any, Mapping

from gtep.protocol.families.base import (
    ACC,
    ACC_T,
    AVG_ACC,
    CLASS_INCREMENTAL,
    Metric,
    ScenarioFamily,
    register_family,
)
from gtep.protocol.scenarios import parse_increments

CLASS_INCREMENTAL_METRICS = (ACC, AVG_ACC, Metric("hmean", "HM"), Metric("forgetting", "forgetting"),
                             Metric("old_acc", "old"), Metric("new_acc", "new"), ACC_T)



@register_family
class ClassIncremental(ScenarioFamily):
    name = CLASS_INCREMENTAL
    description = "the GTEP paper's class-incremental scenarios (scenario.increments)"
    metrics = CLASS_INCREMENTAL_METRICS

    def increments(self, options: Mapping[str, Any]) -> list[int]:
        return parse_increments(options["increments"])
