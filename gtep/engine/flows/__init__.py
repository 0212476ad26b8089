"""Data flows: one module a flow, each registering its Flow (gtep/engine/flows/base.py) in FLOWS.

    class_incremental   tasks of classes, an accuracy matrix (class_incremental, fscil)
    multi_label         IIRC's incomplete multi-label tasks
    stream              FLUID's predict-then-reveal stream
    continual_few_shot  CFSL's support sets seen once, then a target set

A family names its flow (ScenarioFamily.data_flow); `run_ordering` runs a job on its family's flow, and the
calibration of `gtep check --calibrate` asks the flow for its units and the part to time.
"""
from __future__ import annotations

from pathlib import Path

from gtep.data import ImageSet
from gtep.engine.first_task import FirstTaskStore

# the flows of gtep register on import (each imports only base)
from gtep.engine.flows import class_incremental, continual_few_shot, multi_label, stream  # noqa: E402,F401
from gtep.engine.flows.base import FLOWS, Flow, StopCheck, TaskHook, TimedPart
from gtep.engine.loop import FitMode
from gtep.engine.runner import OrderingJob, OrderingOutcome


def flow_of(name: str) -> Flow:
    """The registered flow that runs the `name` data flow (a family's data_flow), or a ValueError listing them."""
    if name not in FLOWS:
        raise ValueError(f"no engine flow runs the {name} data flow; known: {FLOWS.names()}")
    return FLOWS.get(name)


def run_ordering(job: OrderingJob, data: ImageSet, on_task_end: TaskHook | None = None,
                 checkpoint: Path | None = None, first_tasks: FirstTaskStore | None = None,
                 fit_mode: FitMode | None = None) -> OrderingOutcome:
    """One ordering of `job` on its family's data flow, its fits run by `fit_mode` (plain by default); never raises
    for a diverged run."""
    return flow_of(job.scenario_family.data_flow).run(job, data, on_task_end, checkpoint, first_tasks, fit_mode)


__all__ = ["FLOWS", "Flow", "StopCheck", "TaskHook", "TimedPart", "flow_of", "run_ordering"]
