"""Tables and plots from tracked results: `run_report` reads the MLflow store (through
gtep.orchestration.report_store) and writes the paper's tables and figures."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gtep.reporting.build import Report, run_report

__all__ = ["Report", "run_report"]


def __getattr__(name: str) -> Any:
    """Import lazily: `gtep.reporting.tables` is used by every phase command and must not pull in MLflow."""
    if name in __all__:
        from gtep.reporting import build

        return getattr(build, name)
    raise AttributeError(f"module 'gtep.reporting' has no attribute {name!r}")
