"""The registry of data flows: how one ordering of a family's data is run (a family's `data_flow` names one)."""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Protocol

from gtep.data import ImageSet
from gtep.engine.first_task import FirstTaskStore
from gtep.engine.runner import OrderingJob, OrderingOutcome
from gtep.registry import Registry

TaskHook = Callable[[int, OrderingOutcome], None]


class Flow(Protocol):
    """One ordering of a job on a phase's data, never raising for a diverged run. `on_task_end(t, outcome)` after
    each unit of work; `checkpoint` and `first_tasks` where the flow can resume a task or share a first task (the
    class-incremental flow; the others take and ignore them, and a retried ordering restarts)."""

    def __call__(self, job: OrderingJob, data: ImageSet, on_task_end: TaskHook | None = None,
                 checkpoint: Path | None = None, first_tasks: FirstTaskStore | None = None) -> OrderingOutcome: ...


FLOWS: Registry[Flow] = Registry("data flow")
