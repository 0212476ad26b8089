"""gtep: the Generalizable Two-phase Evaluation Protocol for continual learning (Cha & Cho).

`import gtep` gives the Python API of gtep/api.py (experiment, check, resolve, tune, evaluate, run, report, replay,
load); it is imported on first use, so that `import gtep` (and `gtep --help`) stays fast. (`gtep.experiment` builds
a config: `gtep.config` is the package of the config schema.)"""
from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

API = ("experiment", "study_config", "check", "resolve", "tune", "evaluate", "run", "report", "replay", "load",
       "PhaseResult", "TuneResult", "StudyResult", "phases_table")
__all__ = [*API, "__version__"]


def __getattr__(name: str) -> Any:
    if name in API:
        from gtep import api

        return getattr(api, name)
    raise AttributeError(f"module 'gtep' has no attribute {name!r}")
