"""PNG plots of one scenario and pairing, after the paper's figures (matplotlib, no display needed).

Figures are built with `matplotlib.figure.Figure` and saved through the Agg canvas, so nothing touches pyplot's
global state or needs a display. Every function returns the file it wrote, or None when there is nothing to draw.
"""
from __future__ import annotations

import contextvars
import math
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd

from gtep.protocol.phases import EVALUATE, ORIGINAL, phases_in_order, reported_phases
from gtep.reporting.importance import CONVERGENCE_MARK, few_trials_warning


def title(what: str, scenario: str, pairing: str, phase: str = "", width: int = 55) -> str:
    """'<what>' over 'scenario 10+5+5, CIFAR-100 → TinyImageNet, evaluation phase (D^E)', wrapped at `width`
    characters: 55 fit the narrowest figure (5.5 in), so a long dataset name is not cut off at the edges."""
    where = f"scenario {scenario}, {pairing}" + (f", {phase}" if phase else "")
    return what + "\n" + textwrap.fill(where, width)


def _figure(width: float = 6.0, height: float = 4.0):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height), dpi=110, layout="constrained")
    FigureCanvasAgg(figure)  # Agg renders to PNG without a display
    return figure


# Whether a figure is also saved as PDF (vector, for a paper: `gtep report --format latex`). Writing the PDF cost
# as much as the PNG again; a report read in the terminal, the browser or the MLflow UI shows only the PNG.
VECTOR: contextvars.ContextVar[bool] = contextvars.ContextVar("gtep_report_vector", default=True)


def _save(figure, path: Path) -> Path:
    """The figure as PNG (for the Markdown and HTML reports) and, when VECTOR is set, beside it as PDF."""
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, format="png")
    if VECTOR.get():
        figure.savefig(path.with_suffix(".pdf"), format="pdf")
    return path


def _colours(labels) -> dict[str, str]:
    """One colour per algorithm, the same in every panel."""
    cycle = [f"C{i}" for i in range(10)]
    return {label: cycle[i % len(cycle)] for i, label in enumerate(sorted(labels))}


def task_curves(curves: pd.DataFrame, path: Path, scenario: str, pairing: str) -> Path | None:
    """Acc_t after each task t, mean over orderings with a ±std band (Figures 6a, 9a): H*'s orderings in the tuning
    phase on D^HT beside the evaluation phase on D^E, on one y scale, so the overestimation shows as the gap
    between the panels."""
    titles = {p.name: p.curve_title for p in phases_in_order() if p.curve_title and (curves["phase"] == p.name).any()}
    panels = list(titles)
    if EVALUATE.name not in panels:
        return None
    colour = _colours(curves.loc[curves["phase"].isin(panels), "label"].unique())
    figure = _figure(4.6 * len(panels) + 0.6, 4.4)
    axes = figure.subplots(1, len(panels), sharey=True, squeeze=False)[0]
    for ax, phase in zip(axes, panels):
        part = curves[curves["phase"] == phase]
        for label, rows in part.groupby("label", sort=True):
            rows = rows.sort_values("t")
            t, mean, std = rows["t"].to_numpy(), 100 * rows["mean"].to_numpy(), 100 * rows["std"].to_numpy()
            ax.plot(t, mean, marker="o", color=colour[label], label=label)
            ax.fill_between(t, mean - std, mean + std, color=colour[label], alpha=0.2, linewidth=0)
        ax.set(xlabel="task t", title=titles[phase])
        ax.set_xticks(sorted(part["t"].unique()))
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("Acc_t (%), mean ± std over orderings")
    axes[-1].legend(fontsize="small")
    figure.suptitle(title("Accuracy after each task", scenario, pairing, width=40 * len(panels)))
    return _save(figure, path)


def accuracy_against(summary: pd.DataFrame, columns: tuple[tuple[str, str], ...], path: Path, heading: str,
                     same: str = "") -> Path | None:
    """Final Acc of the evaluation phase against a cost after the last task, one panel per cost: parameters
    (Figures 6b total, 9b trainable) or training time (Figures 6c, 9c). Two costs that are equal for every
    algorithm (nothing frozen: total = trainable parameters) share one panel, its axis named `same`."""
    part = summary[(summary["phase"] == EVALUATE.name) & summary["acc"].notna()]
    panels = [(c, name) for c, name in columns if c in part and part[c].notna().any()]
    if part.empty or not panels:
        return None
    if len(panels) == 2 and part[panels[0][0]].equals(part[panels[1][0]]):
        panels = [(panels[0][0], same or f"{panels[0][1]} = {panels[1][1]}")]
    colour = _colours(part["label"].unique())
    figure = _figure(max(5.5, 4.6 * len(panels)), 4.4)
    for i, (column, name) in enumerate(panels):
        ax = figure.add_subplot(1, len(panels), i + 1)
        for _, row in part.iterrows():
            if math.isnan(row[column]):
                continue
            ax.errorbar(row[column], 100 * row["acc"], yerr=100 * row["acc_std"], fmt="o", capsize=3,
                        color=colour[row["label"]])
            ax.annotate(row["label"], (row[column], 100 * row["acc"]), textcoords="offset points", xytext=(4, 4),
                        fontsize="small")
        ax.set(xlabel=name, ylabel="final Acc on D^E (%)")
        ax.grid(alpha=0.3)
    figure.suptitle(heading)
    return _save(figure, path)


def original_vs_hstar(summary: pd.DataFrame, path: Path, heading: str) -> Path | None:
    """AvgAcc on D^E with the authors' original hyperparameters beside H*, mean ± std (Figure 4a)."""
    original = summary[summary["phase"] == ORIGINAL.name].set_index("label")
    tuned = summary[summary["phase"] == EVALUATE.name].set_index("label")
    labels = sorted(set(original.index) | set(tuned.index))
    if original.empty or not labels:
        return None
    figure = _figure(max(5.5, 1.2 * len(labels) + 2), 4.4)
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
    ax.set(ylabel="AvgAcc on D^E (%), mean ± std", title=heading)
    ax.legend(fontsize="small")
    return _save(figure, path)


def convergence(curves: pd.DataFrame, path: Path, heading: str) -> Path | None:
    """Best-so-far selection score against the number of tuning trials, with the paper's 20-trial mark; a set
    that has no score (diverged, or fewer than S orderings) is marked with an x."""
    if curves.empty or curves["best_so_far"].isna().all():
        return None
    figure = _figure()
    ax = figure.add_subplot()
    colour = _colours(curves["label"].unique())
    for label, rows in curves.groupby("label", sort=True):
        ax.step(rows["trial"], 100 * rows["best_so_far"], where="post", marker=".", label=label, color=colour[label])
        unscored = rows[rows["score"].isna() & rows["best_so_far"].notna()]
        ax.plot(unscored["trial"], 100 * unscored["best_so_far"], "x", color=colour[label], markersize=8)
    if (curves["score"].isna() & curves["best_so_far"].notna()).any():  # one legend entry for every x
        ax.plot([], [], "x", color="grey", label="set not scored (diverged or incomplete)")
    if curves["trial"].max() >= CONVERGENCE_MARK:
        ax.axvline(CONVERGENCE_MARK, color="grey", linestyle="--", linewidth=1)
    ax.set(xlabel="trials", ylabel="best harmonic mean so far (%)", title=heading)
    ax.xaxis.get_major_locator().set_params(integer=True)  # trials are counted, not measured
    ax.legend(fontsize="small")
    return _save(figure, path)


def importance(frame: pd.DataFrame, path: Path, heading: str) -> Path | None:
    """fANOVA importance (%) of each tuned hyperparameter as one grid: hyperparameters as rows, algorithms as
    columns (each named with the number of scored trials it was fitted on), the percentage in each cell and its
    shade; a warning under the grid when a fit had fewer than 20 trials. One panel, whatever the number of
    algorithms: a panel per algorithm made the paper's 15 a figure 60 inches wide that took seconds to draw."""
    if frame.empty:
        return None
    labels = sorted(frame["label"].unique())
    grid = frame.pivot_table(index="hyperparameter", columns="label", values="importance", aggfunc="first")
    grid = grid.reindex(columns=labels).sort_index()
    counts = {label: int(frame.loc[frame["label"] == label, "trials"].iloc[0]) if "trials" in frame else 0
              for label in labels}
    figure = _figure(max(5.5, 1.0 * len(labels) + 2.5), max(3.0, 0.45 * len(grid) + 2.4))
    ax = figure.add_subplot(1, 1, 1)
    values = 100 * grid.to_numpy(dtype=float)
    ax.imshow(np.nan_to_num(values, nan=0.0), cmap="Blues", vmin=0, vmax=100, aspect="auto")
    for (row, column), value in np.ndenumerate(values):
        if not math.isnan(value):
            ax.text(column, row, f"{value:.1f}", ha="center", va="center", fontsize="small",
                    color="white" if value > 60 else "black")
    ax.set_xticks(range(len(labels)), [f"{label}\n({counts[label]} trials)" for label in labels],
                  rotation=45 if len(labels) > 4 else 0, ha="right" if len(labels) > 4 else "center",
                  fontsize="small")
    ax.set_yticks(range(len(grid)), list(grid.index))
    ax.set_title("importance (%)", fontsize="medium")
    figure.suptitle(heading)
    few = min(counts.values())
    if few_trials_warning(few):
        figure.supxlabel(textwrap.fill("Warning: " + few_trials_warning(few), 90), color="firebrick",
                         fontsize="small")
    return _save(figure, path)


def phase_lines(curves: pd.DataFrame, x: str, y: str, scale: float):
    """A figure with one line per algorithm and phase of a long frame (label, phase, x, y), one colour per
    algorithm, the tuning phase (D^HT) dashed and the evaluation phase (D^E) solid; None when nothing to draw."""
    phases = {p.name: p for p in reported_phases()}  # each phase's line style and word: its record's
    curves = curves[curves["phase"].isin(phases)] if not curves.empty else curves
    if curves.empty or curves[y].isna().all():
        return None, None
    colour = _colours(curves["label"].unique())
    order = {name: i for i, name in enumerate(phases)}
    figure = _figure(6.0, 4.4)
    ax = figure.add_subplot()
    keys = sorted(curves[["label", "phase"]].drop_duplicates().itertuples(index=False),
                  key=lambda key: (key[0], order[key[1]]))
    for label, phase in keys:
        rows = curves[(curves["label"] == label) & (curves["phase"] == phase)].sort_values(x)
        ax.plot(rows[x], scale * rows[y], linestyle=phases[phase].line_style, marker=".", color=colour[label],
                label=f"{label}, {phases[phase].column}")
    ax.grid(alpha=0.3)
    return figure, ax


def gacc_alpha(curves: pd.DataFrame, path: Path, heading: str) -> Path | None:
    """FSCIL's gAcc(alpha) against alpha in [0, 1] (logged at alpha = k/12), averaged over sessions and orderings:
    one line per algorithm and phase (`phase_lines`), so the overestimation shows as the gap between an
    algorithm's two lines. The area under a line is its gAcc AUC."""
    figure, ax = phase_lines(curves, "alpha", "gacc", 100)
    if figure is None:
        return None
    ax.set(xlabel="alpha", ylabel="gAcc(alpha) (%), mean over sessions and orderings", xlim=(0, 1), title=heading)
    ax.legend(fontsize="small")
    return _save(figure, path)


def family_curve(curves: pd.DataFrame, path: Path, heading: str, label: str, percent: bool) -> Path | None:
    """One curve of a family's table (IIRC's pw-JS after each task, FLUID's rolling accuracy, CFSL's target accuracy
    after each task) against its step, mean over the phase's orderings, drawn as gAcc(alpha) is (`phase_lines`)."""
    from matplotlib.ticker import MaxNLocator

    figure, ax = phase_lines(curves, "step", "value", 100 if percent else 1)
    if figure is None:
        return None
    ax.set(xlabel="step (task, or window)", ylabel=f"{label}{' (%)' if percent else ''}, mean over orderings",
           title=heading)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole tasks or windows
    ax.legend(fontsize="small")
    return _save(figure, path)
