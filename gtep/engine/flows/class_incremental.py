"""The class-incremental data flow: an ordering's tasks of classes one by one, scored into an accuracy matrix (the
families extending TaskFamily: class_incremental, fscil), with per-task checkpoints and the shared first task."""
from __future__ import annotations

from pathlib import Path

from gtep.data import ImageSet
from gtep.engine.checkpoint import CheckpointClock, load_checkpoint, save_checkpoint
from gtep.engine.first_task import RESUMED, REUSED, FirstTaskStore
from gtep.engine.flows.base import FLOWS, Flow, TaskHook
from gtep.engine.loop import FitMode
from gtep.engine.runner import OrderingJob, OrderingOutcome, OrderingRun
from gtep.protocol.families.base import CLASS_INCREMENTAL


class ClassIncrementalFlow(Flow):
    """Tasks of classes: its units are tasks, its cost images x epochs (the calibration's compute_estimate)."""

    unit = "task"
    by_image_epochs = True

    def start(self, job: OrderingJob, data: ImageSet, fit_mode: FitMode | None = None) -> OrderingRun:
        return OrderingRun(job, data, fit_mode)

    def run(self, job: OrderingJob, data: ImageSet, on_task_end: TaskHook | None = None,
            checkpoint: Path | None = None, first_tasks: FirstTaskStore | None = None,
            fit_mode: FitMode | None = None) -> OrderingOutcome:
        """Train one ordering task by task; never raises for a diverged run.

        With `checkpoint`, the learner and RNG states are saved there after a finished task (every task, or once
        `checkpoints_every`'s seconds have passed since the last save), and a run
        that finds a checkpoint of the same job continues after its last task with the same result. With
        `first_tasks`, task 1 of a method with a fixed first-task recipe comes from the study's store when
        another set trained it already (the same result as training it here), and is put there when this run
        trains it."""
        run = self.start(job, data, fit_mode)
        saved = load_checkpoint(checkpoint, run.key, run.device) if checkpoint is not None else None
        if saved is not None:
            run.restore(saved, saved.first_task or RESUMED)
            run.outcome.resumed_tasks = saved.tasks_done
        elif first_tasks is not None and run.algorithm.fixed_first_task:
            # (a method that trains task 1 with the sampled set would store one large model per set, for nothing)
            stored, source = first_tasks.obtain(run.first_task_key(), run.train_first_task, run.device)
            if stored is not None:
                run.restore(stored, REUSED)
            if on_task_end is not None and not run.outcome.diverged:
                on_task_end(0, run.outcome)
        clock = CheckpointClock()
        for task in run.tasks[run.tasks_done:]:
            if run.outcome.diverged:
                break
            run.train_task(task)
            if run.outcome.diverged:
                break
            if checkpoint is not None and task.index + 1 < len(run.tasks) and clock.due():
                save_checkpoint(checkpoint, run.snapshot(run.key))
                clock.saved()
            if on_task_end is not None:
                on_task_end(task.index, run.outcome)
        return run.finish()


FLOWS.register(CLASS_INCREMENTAL)(ClassIncrementalFlow())
