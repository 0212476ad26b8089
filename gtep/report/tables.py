"""Terminal tables (rich) for phases, search spaces and registries."""
from __future__ import annotations

import math
from typing import Any

from rich.table import Table


def pm(mean: float, std: float) -> str:
    """'61.2 ± 1.3' in percent, or 'NaN' for a diverged phase (as the paper's tables show BEEF)."""
    if mean is None or math.isnan(mean):
        return "NaN"
    return f"{100 * mean:.2f} ± {100 * std:.2f}"


def pct(value: float) -> str:
    return "NaN" if value is None or math.isnan(value) else f"{100 * value:.2f}"


def phase_comparison(tuning: dict[str, Any], evaluation: dict[str, Any], tuning_label: str, evaluation_label: str,
                     title: str) -> Table:
    """Both phases side by side: Acc and AvgAcc (mean ± std over orderings), their harmonic mean, the gap."""
    table = Table(title=title, caption=f"D^HT = {tuning_label}   D^E = {evaluation_label}")
    for column in ("phase", "Acc (%)", "AvgAcc (%)", "HM (%)", "diverged"):
        table.add_column(column, justify="left" if column == "phase" else "right", no_wrap=True)
    for name, s in (("tuning", tuning), ("evaluation", evaluation)):
        table.add_row(name, pm(s["acc"], s["acc_std"]), pm(s["avg_acc"], s["avg_acc_std"]), pct(s["hmean"]),
                      f"{int(s['diverged'])}/{int(s['orderings'])}")
    gap = tuning["hmean"] - evaluation["hmean"]
    table.add_row("gap", pct(tuning["acc"] - evaluation["acc"]),
                  pct(tuning["avg_acc"] - evaluation["avg_acc"]), pct(gap), "", style="bold")
    return table


def phase_summary(summary: dict[str, Any], label: str, title: str) -> Table:
    table = Table(title=title, caption=label)
    for column in ("Acc (%)", "AvgAcc (%)", "HM (%)", "diverged"):
        table.add_column(column, justify="right", no_wrap=True)
    table.add_row(pm(summary["acc"], summary["acc_std"]), pm(summary["avg_acc"], summary["avg_acc_std"]),
                  pct(summary["hmean"]), f"{int(summary['diverged'])}/{int(summary['orderings'])}")
    return table


def hparams_table(hparams: dict[str, Any], title: str) -> Table:
    table = Table(title=title)
    table.add_column("hyperparameter")
    table.add_column("value", justify="right")
    for key, value in hparams.items():
        table.add_row(key, str(value))
    return table
