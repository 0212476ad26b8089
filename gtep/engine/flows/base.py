"""The registry of data flows: how one ordering of a family's data is run (a family's `data_flow` names one), and
what a flow tells the calibration of `gtep check --calibrate` about its work (gtep/preflight/calibration.py)."""
from __future__ import annotations

import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, ClassVar

from gtep.data import ImageSet
from gtep.engine.first_task import FirstTaskStore
from gtep.engine.loop import FitMode
from gtep.engine.runner import OrderingJob, OrderingOutcome
from gtep.registry import Registry

TaskHook = Callable[[int, OrderingOutcome], None]
# the calibration's budget (gtep/preflight/calibration.py): told the units run and the seconds they took so far,
# True once sampling should stop (its budget spent); the flow then returns what it timed
StopCheck = Callable[[int, float], bool]


@dataclass(frozen=True)
class TimedPart:
    """The part of an ordering a calibration ran: its units of work and the seconds they took."""

    units: int
    seconds: float


class Flow(ABC):
    """A data flow: one ordering of a job on a phase's data, and what its work is, so that nothing outside the flow
    branches on its name (DESIGN.md: phases, flows and the ordering axis).

    A flow builds a run object for one ordering (`start`: its state between units of work), runs an ordering to its
    outcome (`run`), counts an ordering's units of work on its run object (`units`) and runs the part of an
    ordering the calibration times (`time_part`). A new flow subclasses Flow, implements `start` and `run` (and
    `units`, `time_part` where its units are not tasks), and registers an instance: `FLOWS.register(name)(MyFlow())`;
    a family names it as its `data_flow` (docs/extending.md, tests/engine/test_flow_extension.py)."""

    unit: ClassVar[str] = "task"  # one unit of work, as `gtep check` names it
    # a unit's `fit` work grows with units ** fit_power (a FLUID update trains on every sample seen so far: 2)
    fit_power: ClassVar[int] = 1
    # True where the work is tasks of classes, images x epochs (the class-incremental flow, whose run object is an
    # OrderingRun): the calibration then trains two tasks of synthetic images through the learner's every stage and
    # scales by each task's images and epochs (compute_estimate). False: a part of ordering 0 on the phase's own
    # images (`time_part`), scaled to the units an ordering holds (compute_flow_estimate).
    by_image_epochs: ClassVar[bool] = False

    @abstractmethod
    def start(self, job: OrderingJob, data: ImageSet, fit_mode: FitMode | None = None) -> Any:
        """The run object of one ordering, as `run` builds it (the calibration counts and times its units), its
        trainer's fits run by `fit_mode` (plain by default; a flow whose learner trains without the engine's
        Trainer has no fits to give it)."""

    @abstractmethod
    def run(self, job: OrderingJob, data: ImageSet, on_task_end: TaskHook | None = None,
            checkpoint: Path | None = None, first_tasks: FirstTaskStore | None = None,
            fit_mode: FitMode | None = None) -> OrderingOutcome:
        """One ordering of `job` on a phase's data, never raising for a diverged run. `on_task_end(t, outcome)` after
        each unit of work; `checkpoint` and `first_tasks` where the flow can resume a task or share a first task
        (the class-incremental flow; the others take and ignore them, and a retried ordering restarts). `fit_mode`:
        how the ordering's fits run (Flow.start)."""

    def units(self, run: Any) -> int:
        """Units of work of the ordering `run` holds (by default its tasks)."""
        return len(run.tasks)

    def time_part(self, run: Any, stop: StopCheck | None = None) -> TimedPart:
        """Run the part of the ordering the calibration times, as a trial runs it (by default every task), asking
        `stop` after each unit (or group of units) whether the calibration's budget is spent."""
        tic = time.perf_counter()
        done = 0
        for task in run.tasks:
            run.train_task(task)
            done += 1
            if stop is not None and done < len(run.tasks) and stop(done, time.perf_counter() - tic):
                break
        return TimedPart(done, time.perf_counter() - tic)


FLOWS: Registry[Flow] = Registry("data flow")
