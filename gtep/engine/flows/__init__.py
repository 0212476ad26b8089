"""Data flows: one module a flow, each registering the function that runs one ordering of it in FLOWS.

    class_incremental   tasks of classes, an accuracy matrix (class_incremental, fscil)
    multi_label         IIRC's incomplete multi-label tasks
    stream              FLUID's predict-then-reveal stream
    continual_few_shot  CFSL's support sets seen once, then a target set

A family names its flow (ScenarioFamily.data_flow); `run_ordering` runs a job on its family's flow.
"""
from __future__ import annotations

from pathlib import Path

from gtep.data import ImageSet
from gtep.engine.first_task import FirstTaskStore

# the flows of gtep register on import (each imports only base)
from gtep.engine.flows import class_incremental, continual_few_shot, multi_label, stream  # noqa: E402,F401
from gtep.engine.flows.base import FLOWS, Flow, TaskHook
from gtep.engine.runner import OrderingJob, OrderingOutcome


def run_ordering(job: OrderingJob, data: ImageSet, on_task_end: TaskHook | None = None,
                 checkpoint: Path | None = None, first_tasks: FirstTaskStore | None = None) -> OrderingOutcome:
    """One ordering of `job` on its family's data flow; never raises for a diverged run."""
    flow = job.scenario_family.data_flow
    if flow not in FLOWS:
        raise ValueError(f"no engine flow runs the {flow} data flow; known: {FLOWS.names()}")
    return FLOWS.get(flow)(job, data, on_task_end, checkpoint, first_tasks)


__all__ = ["FLOWS", "Flow", "TaskHook", "run_ordering"]
