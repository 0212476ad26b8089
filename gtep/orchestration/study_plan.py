"""A study's plan run phase by phase: the phases `study_phases` chose (gtep/protocol/phases.py), in their order, each
by its runner from the one mapping RUNNERS (gtep/orchestration/phase_run.py), H* handed from the tuning phase to
the phases that run it. `gtep run`, `gtep evaluate` and a matrix's cells run their phases here, so they run them
in the same order; a resume runs the same plan again (finished phases are reused, running ones continued)."""
from __future__ import annotations

from typing import Any

from rich.console import Console

# the built-in phases' runners register themselves in RUNNERS when their modules are imported
import gtep.orchestration.phases  # noqa: F401
import gtep.orchestration.set_evaluation  # noqa: F401
from gtep.config import ResolvedExperiment
from gtep.orchestration.phase_run import PhaseOutcome, run_phase, runner_for
from gtep.orchestration.study import read_best
from gtep.protocol.phases import PhaseSequence


def run_plan(plan: PhaseSequence, resolved: ResolvedExperiment, console: Console, resume: bool = False,
             tags: dict[str, str] | None = None, best: dict[str, Any] | None = None) -> dict[str, PhaseOutcome]:
    """Every phase of `plan` in its order (run_phase; `tags` on each phase run, a matrix cell's). `best`: the set
    the phases after tuning run when the plan has no tuning phase (gtep evaluate's); a tuning phase's H* (its
    best.yaml) replaces it. Returns each phase's outcome by its name, in the plan's order."""
    outcomes: dict[str, PhaseOutcome] = {}
    for phase in plan:
        outcome = run_phase(runner_for(phase, resolved, best), resolved, console, resume, tags)
        outcomes[phase.name] = outcome
        if phase.selects_best:
            best = read_best(outcome.paths.best)
    return outcomes
