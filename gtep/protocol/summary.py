"""Means and stds over a set's orderings: the one rule tracking (when a phase ends) and `gtep report` (from the
store) both apply. Pure: numpy only."""
from __future__ import annotations

import math
from typing import Any, Iterable, Mapping, Sequence

import numpy as np


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def ordering_statistics(records: Sequence[Mapping[str, Any]], names: Iterable[str]) -> dict[str, float]:
    """`name` and `name_std` of each metric over the orderings' records: the mean over the finished orderings, NaN
    once any diverged (the paper's NaN for BEEF) or when none has the metric; the population std over the finished
    ones whatever diverged (what spread they had). Non-finite values are left out of both."""
    finished = [r for r in records if r.get("status") != "diverged"]
    complete = len(finished) == len(records)
    out: dict[str, float] = {}
    for name in names:
        values = [float(r[name]) for r in finished if _finite(r.get(name))]
        out[name] = float(np.mean(values)) if values and complete else math.nan
        out[f"{name}_std"] = float(np.std(values)) if values else math.nan
    return out
