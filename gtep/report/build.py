"""`gtep report`: read tracked studies from MLflow and write the paper's tables and figures (nothing is re-run).

run_report = validate -> collect (the store's runs as frames) -> summarise -> tables and plots per scenario and pairing
-> terminal / Markdown / CSV / LaTeX / PNG -> one report run in gtep/reports with every file as an artifact.
Everything that can be wrong with the input is found before the first file is written.
"""
from __future__ import annotations

import hashlib
import math
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
from rich.console import Console

from gtep.config import ConfigError
from gtep.orchestration.report_store import open_store
from gtep.report import importance as search
from gtep.report import plots, tables
from gtep.report import summary as sm
from gtep.report.collect import StoreData, collect

FORMATS = ("table", "md", "csv", "latex")


@dataclass
class Report:
    """The frames of a report and the files it wrote. `summary`: one row per (scenario, pairing, algorithm, phase);
    `tables`: the paper-shaped string table per (scenario, pairing); `gaps`: overestimation gap and ranks per
    algorithm; `ranking`: Kendall's tau per (scenario, pairing, metric); `curves`: Acc_t mean/std per task;
    `importance` and `convergence`: from the tuning trials."""
    phases: pd.DataFrame
    summary: pd.DataFrame
    tables: dict[tuple[str, str], pd.DataFrame]
    gaps: pd.DataFrame
    ranking: pd.DataFrame
    curves: pd.DataFrame
    importance: pd.DataFrame
    convergence: pd.DataFrame
    out: Path | None = None
    paths: list[Path] = field(default_factory=list)
    run_id: str | None = None


def check_formats(formats: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """'md,csv' and repeated options alike; an unknown name is an error naming the choices."""
    names = tuple(dict.fromkeys(f.strip().lower() for item in formats for f in str(item).split(",") if f.strip()))
    unknown = [f for f in names if f not in FORMATS]
    if unknown or not names:
        raise ConfigError("--format", f"unknown format {', '.join(map(repr, unknown)) or '(none)'}; choose from "
                          f"{', '.join(FORMATS)} (repeat --format or separate them with commas)")
    return names


def slug(scenario: str, pairing: str) -> str:
    """A folder (and metric) name for one scenario and pairing: readable, short, unique through a hash of the full
    name, and only characters MLflow accepts in a metric name."""
    text = re.sub(r"[^A-Za-z0-9._-]+", "-", f"{scenario.replace('+', '_')}_{pairing}").strip("-")
    digest = hashlib.sha1(f"{scenario}\n{pairing}".encode()).hexdigest()[:6]
    return f"{text[:48].rstrip('-')}-{digest}"


# ---------------------------------------------------------------- frames

def search_frames(data: StoreData, phases: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Importance and best-so-far per tuning phase (one algorithm of one scenario and pairing)."""
    importances, curves = [], []
    tuned = phases[phases["phase"] == "tune"]
    for _, phase in tuned.iterrows():
        trials = data.trials[data.trials["phase_run_id"] == phase["run_id"]]
        if trials.empty:
            continue
        keys = {k: phase[k] for k in (*sm.GROUP, "label")}
        selection = phase["selection"] or "hmean_of_means"
        hparams = data.hparams[data.hparams["trial_run_id"].isin(trials["run_id"])]
        imp = search.hyperparameter_importance(trials, hparams, selection)
        importances.append(imp.assign(**keys, trials=len(trials)))
        curve = search.best_so_far(trials, selection)
        curves.append(curve.assign(**keys, trials_to_best=search.trials_to_best(curve)))
    importance = pd.concat(importances, ignore_index=True) if importances else pd.DataFrame(
        columns=[*sm.GROUP, "label", "hyperparameter", "importance", "trials"])
    convergence = pd.concat(curves, ignore_index=True) if curves else pd.DataFrame(
        columns=[*sm.GROUP, "label", "trial", "set_index", "score", "best_so_far", "trials_to_best"])
    return importance, convergence


def build_frames(data: StoreData) -> Report:
    summary = sm.phase_summaries(data)
    gaps = sm.gaps(summary)
    labelled = data.phases.merge(summary[["run_id", "label"]], on="run_id", how="inner")
    importance, convergence = search_frames(data, labelled)
    paper = {group: tables.paper_table(_part(summary, group), _part(gaps, group)) for group in sm.groups(summary)}
    return Report(phases=data.phases, summary=summary, tables=paper, gaps=gaps, ranking=sm.rankings(summary),
                  curves=sm.task_curves(data, summary), importance=importance, convergence=convergence)


def _part(frame: pd.DataFrame, group: tuple[str, str]) -> pd.DataFrame:
    if frame.empty:
        return frame
    return frame[(frame["scenario"] == group[0]) & (frame["pairing"] == group[1])]


def trials_summary(convergence: pd.DataFrame) -> pd.DataFrame:
    """Per algorithm: R, the best score and after how many trials it was reached (the paper: within 20)."""
    if convergence.empty:
        return pd.DataFrame(columns=["trials", "best HM (%)", "reached after"])
    rows = convergence.groupby("label").agg(trials=("trial", "max"), best=("best_so_far", "max"),
                                            reached=("trials_to_best", "first"))
    return pd.DataFrame({"trials": rows["trials"].astype(int), "best HM (%)": rows["best"].map(tables.pct),
                         "reached after": rows["reached"].map(lambda v: "-" if math.isnan(v) else str(int(v)))})


def importance_table(importance: pd.DataFrame) -> pd.DataFrame:
    """Hyperparameters as rows, algorithms as columns, importance in percent."""
    if importance.empty:
        return pd.DataFrame()
    wide = importance.pivot_table(index="hyperparameter", columns="label", values="importance", aggfunc="first")
    return wide.map(lambda v: "" if pd.isna(v) else f"{100 * v:.1f}").sort_index()


def ranking_line(ranking: pd.DataFrame) -> str:
    parts = [f"Kendall's tau ({r.metric}, {r.algorithms} algorithms) = "
             f"{'NaN' if math.isnan(r.tau) else f'{r.tau:.3f}'}" for r in ranking.itertuples()]
    return "; ".join(parts)


# ---------------------------------------------------------------- files

def write_group(report: Report, group: tuple[str, str], folder: Path, formats: tuple[str, ...]) -> list[Path]:
    """One scenario and pairing: its table in the chosen formats and its five plots."""
    scenario, pairing = group
    table = report.tables[group]
    written: list[Path] = []
    folder.mkdir(parents=True, exist_ok=True)
    if "csv" in formats:
        table.to_csv(folder / "table.csv")
        written.append(folder / "table.csv")
    if "latex" in formats:
        caption = f"Scenario {scenario}, {pairing}: Acc / AvgAcc (%), mean (std) over orderings."
        (folder / "table.tex").write_text(tables.latex_frame(table, caption, f"tab:{folder.name}"))
        written.append(folder / "table.tex")
    summary, conv = _part(report.summary, group), _part(report.convergence, group)
    drawn = [
        plots.task_curves(_part(report.curves, group), folder / "task_curves.png", f"Acc_t on D^E: {scenario}"),
        plots.accuracy_against(summary, (("params_total", "parameters (total)"),
                                         ("params_trainable", "parameters (trainable)")),
                               folder / "acc_vs_params.png", f"Acc vs parameters: {scenario}"),
        plots.accuracy_against(summary, (("train_seconds", "training time (s)"),), folder / "acc_vs_time.png",
                               f"Acc vs training time: {scenario}"),
        plots.original_vs_hstar(summary, folder / "original_vs_hstar.png", f"Original vs H* on D^E: {scenario}"),
        plots.convergence(conv, folder / "convergence.png", f"Best so far: {scenario}"),
        plots.importance(_part(report.importance, group), folder / "importance.png", f"Importance: {scenario}"),
    ]
    return written + [p for p in drawn if p is not None]


def markdown_report(report: Report, folders: dict[tuple[str, str], Path], out: Path) -> str:
    lines = ["# GTEP report", "", "Acc / AvgAcc in %, mean (std) over orderings (the paper's Tables 7-22). "
             "Gap: tuning-phase minus evaluation-phase harmonic mean, percentage points.", ""]
    for group, folder in folders.items():
        rel = folder.relative_to(out).as_posix()
        lines += [f"## {group[0]}: {group[1]}", "", tables.markdown_frame(report.tables[group]),
                  ranking_line(_part(report.ranking, group)), ""]
        trials = trials_summary(_part(report.convergence, group))
        if not trials.empty:
            lines += ["### Tuning trials", "", tables.markdown_frame(trials.rename_axis("algorithm"))]
        imp = importance_table(_part(report.importance, group))
        if not imp.empty:
            lines += ["### Hyperparameter importance (fANOVA, %)", "", tables.markdown_frame(imp)]
        lines += [f"![{name}]({rel}/{name}.png)" for name in ("task_curves", "acc_vs_params", "acc_vs_time",
                                                              "original_vs_hstar", "convergence", "importance")
                  if (folder / f"{name}.png").exists()]
        lines.append("")
    return "\n".join(lines)


def write_files(report: Report, out: Path, formats: tuple[str, ...]) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    folders = {group: out / slug(*group) for group in report.tables}
    written = [p for group, folder in folders.items() for p in write_group(report, group, folder, formats)]
    if "csv" in formats:
        for name in ("summary", "gaps", "ranking", "curves", "importance", "convergence"):
            path = out / f"{name}.csv"
            getattr(report, name).to_csv(path, index=False)
            written.append(path)
    if "md" in formats:
        (out / "report.md").write_text(markdown_report(report, folders, out))
        written.append(out / "report.md")
    if "latex" in formats and not report.ranking.empty:
        frame = report.ranking.set_index("metric")[["scenario", "pairing", "algorithms", "tau"]]
        frame = frame.assign(tau=frame["tau"].map(lambda v: "NaN" if math.isnan(v) else f"{v:.3f}"))
        (out / "ranking.tex").write_text(tables.latex_frame(frame, "Kendall's tau between the tuning and evaluation "
                                                                   "phase rankings.", "tab:gtep-ranking"))
        written.append(out / "ranking.tex")
    return written


def print_report(report: Report, console: Console) -> None:
    for group, table in report.tables.items():
        console.print(tables.rich_frame(table, f"{group[0]}: {group[1]}",
                                        "Acc / AvgAcc (%), mean (std) over orderings"))
        console.print(ranking_line(_part(report.ranking, group)), highlight=False)
        trials = trials_summary(_part(report.convergence, group))
        if not trials.empty:
            console.print(tables.rich_frame(trials.rename_axis("algorithm"), "tuning trials"))
        imp = importance_table(_part(report.importance, group))
        if not imp.empty:
            console.print(tables.rich_frame(imp, "hyperparameter importance (fANOVA, %)"))


def report_metrics(report: Report) -> dict[str, float]:
    """Tau per group as metrics of the report run, so several reports compare in the MLflow UI."""
    return {f"tau_{r.metric}.{slug(r.scenario, r.pairing)}": float(r.tau) for r in report.ranking.itertuples()}


# ---------------------------------------------------------------- the entry point

def run_report(tracking_uri: str, selectors: list[str], *, matrix: str | None = None, out: Path | None = None,
               formats: tuple[str, ...] = ("table",), console: Console | None = None,
               log_to_mlflow: bool = True) -> Report:
    """Read the studies `selectors` name (study names, gtep/<study>, or globs such as 'gtep/mx-*'; with `matrix`,
    only phase runs tagged gtep.matrix=<matrix>) and write the report. Raises ConfigError (naming the option)
    before writing anything when the store, the selectors or the formats are wrong."""
    formats = check_formats(formats)
    runs = open_store(tracking_uri)
    data = collect(runs, list(selectors), matrix)
    report = build_frames(data)
    report.out = Path(out) if out is not None else Path(tempfile.mkdtemp(prefix="gtep-report-"))
    report.paths = write_files(report, report.out, formats)
    if "table" in formats:
        print_report(report, console or Console())
    if log_to_mlflow:
        report.run_id = runs.log_report(report.out, list(selectors), matrix, report_metrics(report))
    return report
