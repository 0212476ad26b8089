"""PNG plots of one scenario and pairing, after the paper's figures (matplotlib, no display needed).

Figures are built with `matplotlib.figure.Figure` and saved through the Agg canvas, so nothing touches pyplot's
global state or needs a display. Every function returns the file it wrote, or None when there is nothing to draw.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from gtep.report.importance import CONVERGENCE_MARK


def _figure(width: float = 6.0, height: float = 4.0):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height), dpi=110, layout="constrained")
    FigureCanvasAgg(figure)  # Agg renders to PNG without a display
    return figure


def _save(figure, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, format="png")
    return path


def task_curves(curves: pd.DataFrame, path: Path, title: str) -> Path | None:
    """Acc_t after each task t in the evaluation phase, mean over orderings with a ±std band (Figures 6a, 9a)."""
    part = curves[curves["phase"] == "evaluate"]
    if part.empty:
        return None
    figure = _figure()
    ax = figure.add_subplot()
    for label, rows in part.groupby("label", sort=True):
        rows = rows.sort_values("t")
        t, mean, std = rows["t"].to_numpy(), 100 * rows["mean"].to_numpy(), 100 * rows["std"].to_numpy()
        line, = ax.plot(t, mean, marker="o", label=label)
        ax.fill_between(t, mean - std, mean + std, color=line.get_color(), alpha=0.2, linewidth=0)
    ax.set(xlabel="task t", ylabel="Acc_t (%)", title=title)
    ax.set_xticks(sorted(part["t"].unique()))
    ax.legend(fontsize="small")
    return _save(figure, path)


def accuracy_against(summary: pd.DataFrame, columns: tuple[tuple[str, str], ...], path: Path,
                     title: str) -> Path | None:
    """Final Acc of the evaluation phase against a cost after the last task, one panel per cost: parameters
    (Figures 6b total, 9b trainable) or training time (Figures 6c, 9c)."""
    part = summary[(summary["phase"] == "evaluate") & summary["acc"].notna()]
    panels = [(c, name) for c, name in columns if part[c].notna().any()]
    if part.empty or not panels:
        return None
    figure = _figure(5.0 * len(panels), 4.0)
    for i, (column, name) in enumerate(panels):
        ax = figure.add_subplot(1, len(panels), i + 1)
        for _, row in part.iterrows():
            if math.isnan(row[column]):
                continue
            ax.errorbar(row[column], 100 * row["acc"], yerr=100 * row["acc_std"], fmt="o", capsize=3)
            ax.annotate(row["label"], (row[column], 100 * row["acc"]), textcoords="offset points", xytext=(4, 4),
                        fontsize="small")
        ax.set(xlabel=name, ylabel="Acc (%)")
    figure.suptitle(title)
    return _save(figure, path)


def original_vs_hstar(summary: pd.DataFrame, path: Path, title: str) -> Path | None:
    """AvgAcc on D^E with the authors' original hyperparameters beside H*, mean ± std (Figure 4a)."""
    original = summary[summary["phase"] == "original"].set_index("label")
    tuned = summary[summary["phase"] == "evaluate"].set_index("label")
    labels = sorted(set(original.index) | set(tuned.index))
    if original.empty or not labels:
        return None
    figure = _figure(max(5.0, 1.2 * len(labels) + 2), 4.0)
    ax = figure.add_subplot()
    x, width = np.arange(len(labels)), 0.38
    for offset, (name, part) in zip((-width / 2, width / 2), (("Original", original), ("H*", tuned))):
        mean = [100 * part.at[k, "avg_acc"] if k in part.index else np.nan for k in labels]
        std = [100 * part.at[k, "avg_acc_std"] if k in part.index else np.nan for k in labels]
        ax.bar(x + offset, np.nan_to_num(mean), width, yerr=np.nan_to_num(std), capsize=3, label=name)
        for xi, value in zip(x + offset, mean):
            if math.isnan(value):  # diverged: the paper leaves the bar out and says NaN
                ax.annotate("NaN", (xi, 0), ha="center", va="bottom", fontsize="small")
    ax.set_xticks(x, labels, rotation=30, ha="right")
    ax.set(ylabel="AvgAcc (%)", title=title)
    ax.legend(fontsize="small")
    return _save(figure, path)


def convergence(curves: pd.DataFrame, path: Path, title: str) -> Path | None:
    """Best-so-far selection score against the number of tuning trials, with the paper's 20-trial mark."""
    if curves.empty or curves["best_so_far"].isna().all():
        return None
    figure = _figure()
    ax = figure.add_subplot()
    for label, rows in curves.groupby("label", sort=True):
        ax.step(rows["trial"], 100 * rows["best_so_far"], where="post", marker=".", label=label)
    if curves["trial"].max() >= CONVERGENCE_MARK:
        ax.axvline(CONVERGENCE_MARK, color="grey", linestyle="--", linewidth=1)
    ax.set(xlabel="trials", ylabel="best harmonic mean so far (%)", title=title)
    ax.xaxis.get_major_locator().set_params(integer=True)  # trials are counted, not measured
    ax.legend(fontsize="small")
    return _save(figure, path)


def importance(frame: pd.DataFrame, path: Path, title: str) -> Path | None:
    """fANOVA importance of each tuned hyperparameter, one panel per algorithm."""
    if frame.empty:
        return None
    labels = sorted(frame["label"].unique())
    figure = _figure(4.0 * len(labels), 0.35 * frame.groupby("label").size().max() + 1.5)
    for i, label in enumerate(labels):
        rows = frame[frame["label"] == label].sort_values("importance")
        ax = figure.add_subplot(1, len(labels), i + 1)
        ax.barh(rows["hyperparameter"], rows["importance"])
        ax.set(xlabel="importance", title=label, xlim=(0, 1))
    figure.suptitle(title)
    return _save(figure, path)
