"""Ctrl-C and SIGTERM on the driver: stop the phase's trials, never report the phase as complete.

Ray Tune's own SIGINT handler ends `Tuner.fit()` as if the experiment had finished and prints Ray's
"Resume with Tuner.restore(...)", so a caller cannot tell an interrupted phase from a finished one. While a
phase runs, gtep installs its own handlers instead (and tells Tune not to install its one):

- the first SIGINT or SIGTERM asks Tune to stop every trial (a Stopper whose `stop_all` turns true); the
  loop returns within a step, stopping trials are given a few seconds, and the caller sees `requested`;
- a second one raises KeyboardInterrupt at once, out of Tune's loop.

Either way the caller marks the phase `interrupted`, flushes the MLflow journal and raises `StudyInterrupted`,
whose message names the resume command; the exit status is 128 + the signal (130 for SIGINT, 143 for SIGTERM).
"""
from __future__ import annotations

import os
import signal
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from ray import tune

from gtep.errors import StudyStopped

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StudyInterrupted(StudyStopped):
    """The driver was asked to stop: the phase is marked interrupted and the study can be resumed."""

    def __init__(self, study_dir: Path, phase: str, signum: int, done: int, total: int) -> None:
        self.study_dir, self.phase, self.signum = study_dir, phase, signum
        name = signal.Signals(signum).name
        super().__init__(f"{name} received: the {phase} phase was interrupted after {done} of {total} units and is "
                         "marked interrupted (no result is reported as complete)", exit_code=128 + signum)

    def describe(self, command: str) -> str:
        return f"{self}. Resume it with: gtep {command} --resume {self.study_dir}"


class Interruption:
    """What the signal handlers saw: the first stop signal, and whether a second one cut the phase short."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.abrupt = False

    @property
    def requested(self) -> bool:
        return self.signum is not None


class StopOnSignal(tune.Stopper):
    """Ends the whole Tune experiment once a stop signal arrived; never stops a single trial."""

    def __init__(self, interruption: Interruption) -> None:
        self.interruption = interruption

    def __getstate__(self) -> dict[str, Any]:
        return {"interruption": Interruption()}  # Ray pickles its run config; the live flag stays on the driver

    def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
        return False

    def stop_all(self) -> bool:
        return self.interruption.requested


@contextmanager
def interruptible(announce=print) -> Iterator[Interruption]:
    """Handlers for SIGINT and SIGTERM around a phase (main thread only; elsewhere signals keep their handlers).
    A second signal's KeyboardInterrupt is caught here: the caller reads `interruption.abrupt`."""
    interruption = Interruption()
    if threading.current_thread() is not threading.main_thread():
        yield interruption
        return

    def handler(signum: int, frame: Any) -> None:
        if interruption.signum is None:
            interruption.signum = signum
            announce(f"{signal.Signals(signum).name}: stopping the trials (once more to stop at once)")
            return
        interruption.abrupt = True
        raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, handler) for sig in STOP_SIGNALS}
    tune_handler = os.environ.get("TUNE_DISABLE_SIGINT_HANDLER")
    os.environ["TUNE_DISABLE_SIGINT_HANDLER"] = "1"
    try:
        yield interruption
    except KeyboardInterrupt:
        if interruption.signum is None:  # a KeyboardInterrupt from elsewhere still counts as Ctrl-C
            interruption.signum = signal.SIGINT
        interruption.abrupt = True
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
        if tune_handler is None:
            os.environ.pop("TUNE_DISABLE_SIGINT_HANDLER", None)
        else:
            os.environ["TUNE_DISABLE_SIGINT_HANDLER"] = tune_handler
