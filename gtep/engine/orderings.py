"""A trial's orderings run in one of the registered fit modes: the one entry through which the trainable
(gtep/orchestration/trainable.py) and the tests run a trial's units, each a callable that takes its FitMode.

    run_orderings([partial(run_ordering, job, data) ...], "fused", "replay")   # the keyword fit_mode is the seam
"""
from __future__ import annotations

from typing import Callable, Sequence, TypeVar

from gtep.algorithms import ALGORITHMS
from gtep.engine import fusion  # noqa: F401 - registers the fused mode
from gtep.engine.loop import FIT_MODES, FitMode

T = TypeVar("T")


def run_orderings(units: Sequence[Callable[[FitMode], T]], mode: str, algorithm: str,
                  names: Sequence[str] = ()) -> list[T]:
    """Each unit called with a fit mode of `mode` (FIT_MODES), as that mode runs a trial's units (one after another;
    in lockstep for 'fused'); their results in order. A learner the mode cannot train is refused in one line before
    any unit starts. `names`: how the units are named in what a mode says (e.g. 'ordering 2')."""
    kind = FIT_MODES.get(mode)
    kind.check(ALGORITHMS.get(algorithm), algorithm)
    return kind.run_units(list(units), names)
