"""`gtep report`: read tracked studies from MLflow and write the paper's tables and figures (nothing is re-run).

run_report = validate -> collect (the store's runs as frames) -> summarise -> tables and plots per scenario and pairing
-> terminal / Markdown / CSV / LaTeX / PNG -> one report run in gtep/reports with every file as an artifact.
Everything that can be wrong with the input is found before the first file is written.
"""
from __future__ import annotations

import base64
import hashlib
import html
import json
import math
import multiprocessing
import os
import re
import tempfile
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import pandas as pd
from rich.console import Console
from rich.markup import escape

from gtep.config import ConfigError
from gtep.orchestration.importance import read_importance_tag
from gtep.orchestration.report_store import RunStore, open_store
from gtep.protocol.families import FAMILIES, known_metrics, metric_label
from gtep.protocol.phases import TUNE
from gtep.reporting import importance as search
from gtep.reporting import plots, tables
from gtep.reporting import protocols as tp
from gtep.reporting import set_ranking as sr
from gtep.reporting import summary as sm
from gtep.reporting.collect import StoreData, collect

FORMATS = ("table", "md", "csv", "latex")


@dataclass
class Report:
    """The frames of a report and the files it wrote. `summary`: one row per (scenario, pairing, algorithm, phase);
    `tables`: the paper-shaped string table per (scenario, pairing); `gaps`: overestimation gap and ranks per
    algorithm; `ranking`: Kendall's tau per (scenario, pairing, metric), only where two or more algorithms have
    both phases; `curves`: Acc_t mean/std per task and phase; `importance` and `convergence`: from the tuning trials;
    `sets`: complete / incomplete / diverged / interrupted sets per tuning phase; `left_out`: phase runs not
    reported and why; `gacc`: FSCIL's gAcc(alpha) per (scenario, pairing, label, phase), alpha = k/12 (empty when
    no FSCIL phase is reported); `protocols`: each tuning protocol's H*, compute and evaluation score per study
    (gtep/reporting/protocols.py)."""
    phases: pd.DataFrame
    summary: pd.DataFrame
    tables: dict[tuple[str, str], pd.DataFrame]
    gaps: pd.DataFrame
    ranking: pd.DataFrame
    curves: pd.DataFrame
    importance: pd.DataFrame
    convergence: pd.DataFrame
    sets: pd.DataFrame = field(default_factory=pd.DataFrame)
    left_out: pd.DataFrame = field(default_factory=pd.DataFrame)
    gacc: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=sm.GACC_CURVE_COLUMNS))
    protocols: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=tp.PROTOCOL_COLUMNS))
    family_curves: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=sm.FAMILY_CURVE_COLUMNS))
    # studies with every set evaluated (evaluation.sets: all): their set ranking and protocols' regret (set_ranking.py)
    set_ranking: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=sr.RANKING_COLUMNS))
    protocol_regret: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=sr.REGRET_COLUMNS))
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

def search_frames(data: StoreData, phases: pd.DataFrame,
                  workers: Workers | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Importance and best-so-far per tuning phase (one algorithm of one scenario and pairing). A tuning phase
    fits fANOVA when it ends and logs it as its gtep.importance tag; the tag is used when it scored as many sets
    under the same rule as the trials read here. Phases without one (older runs) are fitted here, many at once in
    worker processes (about 0.3 s of CPU each: 120 in the paper's matrix)."""
    importances: list[pd.DataFrame | None] = []  # in the phases' order; None: fitted below
    curves, fits = [], []
    tuned = phases[phases["phase"] == TUNE.name]
    for _, phase in tuned.iterrows():
        trials = data.trials[data.trials["phase_run_id"] == phase["run_id"]]
        if trials.empty:
            continue
        keys = {k: phase[k] for k in (*sm.GROUP, "label")}
        selection = phase["selection"] or "hmean_of_means"
        curve = search.best_so_far(trials, selection)
        curves.append(curve.assign(**keys, trials_to_best=search.trials_to_best(curve)))
        scored = int(search.trial_scores(trials, selection).notna().sum())
        logged = read_importance_tag(str(phase.get("importance_tag") or ""))
        if logged is not None and logged["selection"] == selection and logged["scored"] == scored:
            found = logged["importance"]
            importances.append(pd.DataFrame({"hyperparameter": list(found), "importance": list(found.values())},
                                            columns=["hyperparameter", "importance"]).assign(**keys, trials=scored))
            continue
        hparams = data.hparams[data.hparams["trial_run_id"].isin(trials["run_id"])]
        fits.append((len(importances), keys, trials, hparams, selection))
        importances.append(None)
    for (slot, keys, *_), (imp, scored) in zip(fits, in_workers(fit_importance, [fit[2:] for fit in fits],
                                                                FANOVA_PER_WORKER, workers)):
        importances[slot] = imp.assign(**keys, trials=scored)
    importance = pd.concat(importances, ignore_index=True) if importances else pd.DataFrame(
        columns=[*sm.GROUP, "label", "hyperparameter", "importance", "trials"])
    convergence = pd.concat(curves, ignore_index=True) if curves else pd.DataFrame(
        columns=[*sm.GROUP, "label", "trial", "set_index", "score", "best_so_far", "trials_to_best"])
    return importance, convergence


FANOVA_PER_WORKER = 8  # tuning phases a worker process is worth starting for (it imports pandas and Optuna: ~1 s)


def fit_importance(trials: pd.DataFrame, hparams: pd.DataFrame, selection: str) -> tuple[pd.DataFrame, int]:
    """One tuning phase's fANOVA importance, and how many scored trials it was fitted on."""
    imp = search.hyperparameter_importance(trials, hparams, selection)
    return imp, int(search.trial_scores(trials, selection).notna().sum())


class Workers:
    """The report's worker processes, started once when first needed and shared by its CPU-bound stages (fANOVA's
    fits, then the figures): each spawned process imports pandas, Optuna and matplotlib, a second each."""

    def __init__(self) -> None:
        self.pool: ProcessPoolExecutor | None = None
        self.size = 0

    def map(self, function: Callable, jobs: list[tuple], per_worker: int = 1) -> list:
        """function(*job) for every job, in order: in this process when one worker is all there is to use, else in
        report_workers() spawned processes (the report may run inside a process with Ray's and MLflow's threads,
        which a fork would copy mid-flight)."""
        wanted = report_workers(len(jobs) // max(per_worker, 1))
        if wanted <= 1 and self.pool is None:
            return [function(*job) for job in jobs]
        if self.pool is None:
            self.pool = ProcessPoolExecutor(wanted, mp_context=multiprocessing.get_context("spawn"))
            self.size = wanted
        return list(self.pool.map(function, *zip(*jobs), chunksize=max(1, len(jobs) // (4 * self.size))))

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown()
            self.pool = None

    def __enter__(self) -> "Workers":
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def in_workers(function: Callable, jobs: list[tuple], per_worker: int = 1, workers: Workers | None = None) -> list:
    """Workers.map on the given workers, else on workers of this call's own."""
    if workers is not None:
        return workers.map(function, jobs, per_worker)
    with Workers() as own:
        return own.map(function, jobs, per_worker)


def build_frames(data: StoreData, workers: Workers | None = None) -> Report:
    summary = sm.phase_summaries(data)
    gaps = sm.gaps(summary)
    labelled = data.phases.merge(summary[["run_id", "label"]], on="run_id", how="inner")
    importance, convergence = search_frames(data, labelled, workers)
    paper = {group: tables.paper_table(_part(summary, group), _part(gaps, group)) for group in sm.groups(summary)}
    return Report(phases=data.phases, summary=summary, tables=paper, gaps=gaps, ranking=sm.rankings(summary),
                  curves=sm.task_curves(data, summary), importance=importance, convergence=convergence,
                  sets=sm.set_counts(data, labelled), left_out=data.left_out, gacc=sm.gacc_curves(data, summary),
                  protocols=tp.protocol_rows(data, summary), family_curves=sm.family_curves(data, summary),
                  set_ranking=sr.ranking_rows(data, summary), protocol_regret=sr.regret_rows(data, summary))


def _part(frame: pd.DataFrame, group: tuple[str, str]) -> pd.DataFrame:
    if frame.empty:
        return frame
    return frame[(frame["scenario"] == group[0]) & (frame["pairing"] == group[1])]


def trials_summary(convergence: pd.DataFrame, sets: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per algorithm: R, how many sets are complete, incomplete (fewer than S orderings finished: not eligible for
    H*), diverged (and interrupted or stopped by a scheduler, when any), the best score and after how many trials
    it was reached (the paper: within 20)."""
    counts = pd.DataFrame() if sets is None or sets.empty else sets.set_index("label")[list(sm.SET_STATES)]
    if convergence.empty and counts.empty:
        return pd.DataFrame()
    if not counts.empty:  # the rare states get a column only when some set is in them
        counts = counts.drop(columns=[s for s in ("interrupted", "stopped") if not counts[s].any()])
    if convergence.empty:
        return counts.astype(int)
    rows = convergence.groupby("label").agg(trials=("trial", "max"), best=("best_so_far", "max"),
                                            reached=("trials_to_best", "first"))
    frame = pd.DataFrame({"trials": rows["trials"].astype(int)})
    if not counts.empty:
        frame = frame.join(counts.astype(int), how="left").fillna(0).astype(int)
    frame["best score (%)"] = rows["best"].map(tables.pct)  # H*'s criterion: HM, or the family's (gAcc AUC)
    frame["reached after"] = rows["reached"].map(lambda v: "-" if math.isnan(v) else str(int(v)))
    return frame


def importance_table(importance: pd.DataFrame) -> pd.DataFrame:
    """Hyperparameters as rows, algorithms as columns, importance in percent."""
    if importance.empty:
        return pd.DataFrame()
    wide = importance.pivot_table(index="hyperparameter", columns="label", values="importance", aggfunc="first")
    return wide.map(lambda v: "" if pd.isna(v) else f"{100 * v:.1f}").sort_index()


def importance_notes(importance: pd.DataFrame) -> list[str]:
    """A warning per algorithm whose importance was fitted on fewer than 20 scored trials."""
    if importance.empty:
        return []
    trials = importance.groupby("label")["trials"].first()
    few = trials[[bool(search.few_trials_warning(int(n))) for n in trials]]
    return [f"{', '.join(labels.index)}: {search.few_trials_warning(int(n))}." for n, labels in few.groupby(few)]


def ranking_line(ranking: pd.DataFrame, table: pd.DataFrame | None = None) -> str:
    """Kendall's tau per metric; one sentence instead when fewer than two algorithms have both phases."""
    if ranking.empty:
        count = "" if table is None else f" (here {len(table)})"
        return ("Kendall's tau: not computed; comparing the phases' rankings needs two or more algorithms with a "
                f"tuning and an evaluation result{count}.")
    names = {"hmean": "HM", "acc": "Acc", "avg_acc": "AvgAcc"}
    parts = [f"{names.get(r.metric, r.metric)} {'undefined (tied scores)' if math.isnan(r.tau) else f'{r.tau:.3f}'}"
             + (f" ({r.algorithms} algorithms)" if r.algorithms != ranking["algorithms"].max() else "")
             for r in ranking.itertuples()]
    return (f"Kendall's tau between the tuning and evaluation rankings of {ranking['algorithms'].max()} algorithms: "
            + ", ".join(parts))


def left_out_notes(report: Report, group: tuple[str, str] | None) -> list[str]:
    """The phase runs left out of a group's table (group None: those of no table), e.g. "evaluate of study X:
    incomplete (1/2 orderings)"."""
    frame = report.left_out
    if frame.empty:
        return []
    if group is None:
        rows = frame[[(s, p) not in report.tables for s, p in zip(frame["scenario"], frame["pairing"])]]
    else:
        rows = _part(frame, group)
    return list(rows["note"])


# ---------------------------------------------------------------- files

PLOTS = ("task_curves", "acc_vs_params", "acc_vs_time", "original_vs_hstar", "convergence", "importance",
         "gacc_alpha")
TABLE_NOTE = ("Acc / AvgAcc in %, mean (std) over orderings (the paper's Tables 7-22); HM: harmonic mean of the mean "
              "Acc and AvgAcc, %. Gap: tuning-phase minus evaluation-phase HM, percentage points.")


def write_group(report: Report, group: tuple[str, str], folder: Path, formats: tuple[str, ...]) -> list[Path]:
    """One scenario and pairing: its table in the chosen formats (its plots: draw_groups)."""
    scenario, pairing = group
    table = report.tables[group]
    written: list[Path] = []
    folder.mkdir(parents=True, exist_ok=True)
    if "csv" in formats:
        table.to_csv(folder / "table.csv")
        written.append(folder / "table.csv")
    if "latex" in formats:
        caption = f"Scenario {scenario}, {pairing}: Acc / AvgAcc (%), mean (std) over orderings; HM (%)."
        if family_note(report, group):
            caption += f" {family_note(report, group)}"
        (folder / "table.tex").write_text(tables.latex_frame(table, caption, f"tab:{folder.name}"))
        written.append(folder / "table.tex")
    return written


@dataclass
class GroupFigures:
    """What one group's figures are drawn from: its part of the report's frames (picklable, so groups can be drawn
    in worker processes)."""

    scenario: str
    pairing: str
    folder: Path
    curves: pd.DataFrame
    summary: pd.DataFrame
    convergence: pd.DataFrame
    importance: pd.DataFrame
    gacc: pd.DataFrame
    family_curves: pd.DataFrame
    vector: bool = False  # PDFs beside the PNGs (--format latex)

    @classmethod
    def of(cls, report: Report, group: tuple[str, str], folder: Path, vector: bool = False) -> "GroupFigures":
        return cls(group[0], group[1], folder, _part(report.curves, group), _part(report.summary, group),
                   _part(report.convergence, group), _part(report.importance, group), _part(report.gacc, group),
                   _part(report.family_curves, group), vector)

    def digest(self) -> str:
        """What the figures are drawn from and how: the group, its frames, whether PDFs are wanted, and the code
        that draws them (plots.py and this module), so that a figure is reused only where it would come out the
        same."""
        h = hashlib.sha1(f"{self.scenario}\n{self.pairing}\n{self.vector}".encode())
        for code in (Path(str(plots.__file__)), Path(__file__)):
            h.update(code.read_bytes())
        for frame in (self.curves, self.summary, self.convergence, self.importance, self.gacc, self.family_curves):
            h.update(",".join(map(str, frame.columns)).encode())
            h.update(pd.util.hash_pandas_object(frame.reset_index(drop=True).astype(str), index=True).to_numpy()
                     .tobytes())
        return h.hexdigest()


FIGURES_FILE = "figures.json"  # per group folder: the digest its figures were drawn from, and the files


def reused_figures(figures: GroupFigures, digest: str) -> list[Path] | None:
    """The group's figures as an earlier report into the same folder drew them from the same frames, when every
    file is still there; None otherwise (they are drawn)."""
    record = figures.folder / FIGURES_FILE
    try:
        drawn = json.loads(record.read_text())
    except (OSError, ValueError):
        return None
    files = [figures.folder / name for name in drawn.get("files", []) if "/" not in name]
    if drawn.get("digest") != digest or not all(path.is_file() for path in files):
        return None
    return files


def draw_group(figures: GroupFigures) -> list[Path]:
    """One group's plots, each as PNG (and PDF when `vector`), and the record of what they were drawn from."""
    token = plots.VECTOR.set(figures.vector)
    try:
        paths = _draw(figures)
    finally:
        plots.VECTOR.reset(token)
    record = {"digest": figures.digest(), "files": [path.name for path in paths]}
    (figures.folder / FIGURES_FILE).write_text(json.dumps(record, indent=1))
    return paths


def _draw(figures: GroupFigures) -> list[Path]:
    scenario, pairing, folder, summary = figures.scenario, figures.pairing, figures.folder, figures.summary
    evaluation, tuning = "evaluation phase (H* on D^E)", "tuning phase (D^HT)"
    drawn = [
        plots.task_curves(figures.curves, folder / "task_curves.png", scenario, pairing),
        plots.accuracy_against(summary, (("params_total", "parameters (total)"),
                                         ("params_trainable", "parameters (trainable)")),
                               folder / "acc_vs_params.png",
                               plots.title("Final accuracy vs parameters", scenario, pairing, evaluation),
                               same="parameters (total = trainable: nothing frozen)"),
        plots.accuracy_against(summary, (("train_seconds", "training time (s)"),), folder / "acc_vs_time.png",
                               plots.title("Final accuracy vs training time", scenario, pairing, evaluation)),
        plots.original_vs_hstar(summary, folder / "original_vs_hstar.png",
                                plots.title("Original vs H* on D^E", scenario, pairing, "evaluation phase")),
        plots.convergence(figures.convergence, folder / "convergence.png",
                          plots.title("Best selection score so far", scenario, pairing, tuning)),
        plots.importance(figures.importance, folder / "importance.png",
                         plots.title("Hyperparameter importance (fANOVA)", scenario, pairing, tuning)),
        plots.gacc_alpha(figures.gacc, folder / "gacc_alpha.png",
                         plots.title("gAcc(alpha), tuning dashed, evaluation solid", scenario, pairing)),
    ]
    curves = figures.family_curves
    for metric in dict.fromkeys(curves["metric"]) if not curves.empty else ():  # the families' other curves
        drawn.append(plots.family_curve(curves[curves["metric"] == metric], folder / f"{metric}.png",
                                        plots.title(f"{metric_label(metric)}, tuning dashed, evaluation solid",
                                                    scenario, pairing), metric_label(metric),
                                        percent=known_metrics()[metric].percent))
    return [path for png in drawn if png is not None
            for path in ((png, png.with_suffix(".pdf")) if figures.vector else (png,))]


def report_workers(groups: int) -> int:
    """Processes for a report's CPU-bound parts (fANOVA's fits, the groups' figures): GTEP_REPORT_WORKERS, else one
    per CPU up to 8, never more than there are jobs worth one. A paper-scale matrix's 120 fits and 8 groups of 15
    algorithms were most of its report's time in one process."""
    wanted = os.environ.get("GTEP_REPORT_WORKERS")
    count = int(wanted) if wanted else min(os.cpu_count() or 1, 8)
    return max(1, min(count, groups))


@dataclass
class Drawn:
    """What draw_groups did: the figure files, how many groups were drawn and how many reused, in how many
    processes."""
    paths: list[Path] = field(default_factory=list)
    drawn: int = 0
    reused: int = 0
    workers: int = 0


def draw_groups(report: Report, folders: dict[tuple[str, str], Path], vector: bool = False,
                before: Callable[[int, int, int], None] | None = None, workers: Workers | None = None) -> Drawn:
    """Every group's figures: reused where the folder holds them drawn from the same frames (reused_figures),
    the others drawn, several groups at once in worker processes (spawned: the report may run inside a process
    with Ray's and MLflow's threads, which a fork would copy mid-flight). `before(to draw, reused, workers)` is
    told what is about to happen (the report's progress line)."""
    jobs = [GroupFigures.of(report, group, folder, vector) for group, folder in folders.items()]
    kept = {i: paths for i, job in enumerate(jobs) if (paths := reused_figures(job, job.digest())) is not None}
    todo = [job for i, job in enumerate(jobs) if i not in kept]
    processes = 0 if not todo else workers.size if workers is not None and workers.pool else report_workers(len(todo))
    if before is not None:
        before(len(todo), len(kept), processes)
    fresh = in_workers(draw_group, [(job,) for job in todo], workers=workers)
    drawn = iter(fresh)
    paths = [path for i in range(len(jobs)) for path in (kept[i] if i in kept else next(drawn))]
    return Drawn(paths, len(todo), len(kept), processes)


def family_note(report: Report, group: tuple[str, str]) -> str:
    """What a family's table columns mean (its table_note), with the criteria H* was selected by; '' for a group
    whose families add no columns (class-incremental)."""
    summary = _part(report.summary, group)
    if "family" not in summary:
        return ""
    notes = []
    for family in dict.fromkeys(summary["family"]):
        if family not in FAMILIES or not FAMILIES.get(family).table_note:
            continue
        rows = summary[summary["family"] == family]
        criteria = rows.groupby("criterion", sort=True)["label"].agg(lambda labels: ", ".join(sorted(set(labels))))
        named = "; ".join(f"{criterion} ({labels})" if len(criteria) > 1 else str(criterion)
                          for criterion, labels in criteria.items())
        notes.append(f"{FAMILIES.get(family).table_note} ({named}).")
    return " ".join(notes)


def group_sections(report: Report, group: tuple[str, str]) -> list[tuple[str, pd.DataFrame | None, list[str]]]:
    """The text of one group, shared by the terminal, Markdown and HTML: (heading, table, lines under it)."""
    table = report.tables[group]
    left_out = [f"Left out: {note}." for note in left_out_notes(report, group)]
    family = [note] if (note := family_note(report, group)) else []
    family += tables.undefined_notes(_part(report.summary, group))
    sections: list[tuple[str, pd.DataFrame | None, list[str]]] = [
        ("", table, [*family, ranking_line(_part(report.ranking, group), table), *left_out])]
    trials = trials_summary(_part(report.convergence, group), _part(report.sets, group))
    if not trials.empty:
        sections.append(("Tuning trials (hyperparameter sets)", trials.rename_axis("algorithm"),
                         ["incomplete: fewer than S orderings finished, so the set could not be H*."]
                         if "incomplete" in trials and trials["incomplete"].any() else []))
    compared = tp.protocol_table(tp.compared(_part(report.protocols, group)))
    if not compared.empty:
        sections.append((tp.PROTOCOLS_HEADING, compared, [tp.PROTOCOLS_NOTE]))
    ranked, regret = _part(report.set_ranking, group), _part(report.protocol_regret, group)
    if not ranked.empty:
        sections.append((sr.RANKING_HEADING, sr.shown(ranked), [sr.RANKING_NOTE]))
    if not regret.empty:
        sections.append((sr.REGRET_HEADING, sr.shown(regret), [sr.REGRET_NOTE]))
    imp = importance_table(_part(report.importance, group))
    if not imp.empty:
        sections.append(("Hyperparameter importance (fANOVA, %)", imp,
                         [f"Warning: {n}" for n in importance_notes(_part(report.importance, group))]))
    return sections


def markdown_report(report: Report, folders: dict[tuple[str, str], Path], out: Path) -> str:
    lines = ["# GTEP report", "", TABLE_NOTE, ""]
    lines += [f"- Left out: {note}." for note in left_out_notes(report, None)] + [""] * bool(
        left_out_notes(report, None))
    for group, folder in folders.items():
        rel = folder.relative_to(out).as_posix()
        lines += [f"## {group[0]}: {group[1]}", ""]
        for heading, frame, notes in group_sections(report, group):
            if heading:
                lines += [f"### {heading}", ""]
            if frame is not None:
                lines += [tables.markdown_frame(frame)]
            lines += [*(f"{n}  " for n in notes), ""] if notes else []
        lines += [f"![{name}]({rel}/{name}.png)" for name in PLOTS if (folder / f"{name}.png").exists()]
        lines.append("")
    return "\n".join(lines)


HTML_STYLE = ("body{font-family:sans-serif;margin:1.5em;max-width:1400px}table{border-collapse:collapse;margin:.5em 0}"
              "th,td{border:1px solid #ccc;padding:3px 8px;text-align:right}th:first-child,td:first-child"
              "{text-align:left}p.note{color:#444;margin:.2em 0}p.warning{color:#b22222}img{max-width:100%;"
              "margin:.5em 0;border:1px solid #eee}div.figures{display:flex;flex-wrap:wrap;gap:.5em;"
              "align-items:flex-start}")


def html_report(report: Report, folders: dict[tuple[str, str], Path]) -> str:
    """The report as one self-contained HTML page, figures embedded as data URIs: the MLflow UI renders an HTML
    artifact (its Markdown view would show image links as text), and nothing else needs to be fetched."""
    def table(frame: pd.DataFrame) -> str:
        head = "".join(f"<th>{html.escape(str(c))}</th>" for c in [frame.index.name or "", *frame.columns])
        body = "".join("<tr>" + "".join(f"<td>{html.escape(str(v))}</td>" for v in [label, *row]) + "</tr>"
                       for label, row in frame.iterrows())
        return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"

    def note(text: str) -> str:
        kind = "warning" if text.startswith(("Warning", "Left out")) else "note"
        return f'<p class="{kind}">{html.escape(text)}</p>'

    parts = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>GTEP report</title><style>{HTML_STYLE}"
             f"</style></head><body><h1>GTEP report</h1><p>{html.escape(TABLE_NOTE)}</p>"]
    parts += [note(f"Left out: {n}.") for n in left_out_notes(report, None)]
    for group, folder in folders.items():
        parts.append(f"<h2>{html.escape(group[0])}: {html.escape(group[1])}</h2>")
        for heading, frame, notes in group_sections(report, group):
            parts += [f"<h3>{html.escape(heading)}</h3>"] if heading else []
            parts += [table(frame)] if frame is not None else []
            parts += [note(n) for n in notes]
        parts.append('<div class="figures">')
        for name in PLOTS:
            png = folder / f"{name}.png"
            if png.exists():
                data = base64.b64encode(png.read_bytes()).decode("ascii")
                parts.append(f'<img alt="{name}" src="data:image/png;base64,{data}">')
        parts.append("</div>")
    parts.append("</body></html>")
    return "\n".join(parts)


def write_tables(report: Report, out: Path, formats: tuple[str, ...]) -> list[Path]:
    """Every group's table in the chosen formats, the frames as CSV and Kendall's tau as LaTeX: the numbers,
    written before any figure is drawn."""
    out.mkdir(parents=True, exist_ok=True)
    written = [p for group, folder in group_folders(report, out).items()
               for p in write_group(report, group, folder, formats)]
    if "csv" in formats:
        for name in ("summary", "gaps", "ranking", "curves", "importance", "convergence", "sets", "left_out",
                     "protocols"):
            path = out / f"{name}.csv"
            getattr(report, name).to_csv(path, index=False)
            written.append(path)
        if not report.gacc.empty:  # a report without gAcc(alpha) writes the files it always did
            report.gacc.to_csv(out / "gacc_alpha.csv", index=False)
            written.append(out / "gacc_alpha.csv")
        for name in ("set_ranking", "protocol_regret"):  # only a report with every set of a study evaluated
            if not getattr(report, name).empty:
                getattr(report, name).to_csv(out / f"{name}.csv", index=False)
                written.append(out / f"{name}.csv")
        if not report.family_curves.empty:  # a class-incremental report writes the files it always did
            report.family_curves.to_csv(out / "family_curves.csv", index=False)
            written.append(out / "family_curves.csv")
    if "latex" in formats and not report.ranking.empty:
        frame = report.ranking.set_index("metric")[["scenario", "pairing", "algorithms", "tau"]]
        frame = frame.assign(tau=frame["tau"].map(lambda v: "tied" if math.isnan(v) else f"{v:.3f}"))
        (out / "ranking.tex").write_text(tables.latex_frame(frame, "Kendall's tau between the tuning and evaluation "
                                                                   "phase rankings.", "tab:gtep-ranking"))
        written.append(out / "ranking.tex")
    return written


def write_pages(report: Report, out: Path, formats: tuple[str, ...]) -> list[Path]:
    """report.md (with md) and always report.html (what the MLflow UI shows of the report run), with whatever
    figures the group folders hold."""
    folders = group_folders(report, out)
    written = []
    if "md" in formats:
        (out / "report.md").write_text(markdown_report(report, folders, out))
        written.append(out / "report.md")
    (out / "report.html").write_text(html_report(report, folders))
    written.append(out / "report.html")
    return written


def group_folders(report: Report, out: Path) -> dict[tuple[str, str], Path]:
    return {group: out / slug(*group) for group in report.tables}


def write_files(report: Report, out: Path, formats: tuple[str, ...], figures: bool = True) -> list[Path]:
    """Every group's tables and plots (PDFs too with latex), the frames as CSV, report.md, and always report.html."""
    written = write_tables(report, out, formats)
    if figures:
        written += draw_groups(report, group_folders(report, out), vector="latex" in formats).paths
    return written + write_pages(report, out, formats)


def plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


class Progress:
    """What a report is doing, a line per stage as it starts ("report: reading ..."), on its own console (stderr
    for the command, so that its tables stay clean on stdout), and at the end the seconds each stage took."""

    def __init__(self, console: Console | None) -> None:
        self.console = console
        self.seconds: dict[str, float] = {}
        self.started = self.current = time.perf_counter()
        self.stage_name: str | None = None

    def stage(self, name: str, doing: str) -> None:
        self._close()
        self.stage_name, self.current = name, time.perf_counter()
        if self.console is not None:
            self.console.print(f"report: {escape(doing)}", highlight=False, soft_wrap=True)

    def _close(self) -> None:
        if self.stage_name is not None:
            self.seconds[self.stage_name] = round(time.perf_counter() - self.current, 2)
            self.stage_name = None

    def finish(self) -> None:
        self._close()
        total = time.perf_counter() - self.started
        if self.console is not None:
            parts = ", ".join(f"{name} {seconds:.1f} s" for name, seconds in self.seconds.items())
            self.console.print(f"report: done in {total:.1f} s ({parts})", highlight=False, soft_wrap=True)


def write_views(runs: RunStore, phase_run_ids: list[str], matrix: str | None) -> int:
    """The phase rows and run snapshots still missing (RunStore.write_phase_rows, write_snapshots);
    returns how many rows were written."""
    written = runs.write_phase_rows(phase_run_ids, matrix)
    runs.write_snapshots(phase_run_ids)
    return written


class Background:
    """function(*args) in a thread of its own from now on; result() waits for it and returns (or raises) what it
    did. The report's writes to the store run beside its CPU-bound stages."""

    def __init__(self, function: Callable, *args: object) -> None:
        self.value: object = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(function, args), daemon=True)
        self.thread.start()

    def _run(self, function: Callable, args: tuple) -> None:
        try:
            self.value = function(*args)
        except BaseException as err:  # noqa: BLE001 - raised again by result(), in the caller's thread
            self.error = err

    def result(self) -> Any:
        self.thread.join()
        if self.error is not None:
            raise self.error
        return self.value


def print_report(report: Report, console: Console) -> None:
    for note in left_out_notes(report, None):
        console.print(f"[yellow]Left out: {escape(note)}.[/]", highlight=False)
    for group in report.tables:
        for heading, frame, notes in group_sections(report, group):
            if frame is not None:
                frame = frame if heading else tables.terminal_paper_table(frame)
                console.print(tables.rich_frame(frame, heading or f"{group[0]}: {group[1]}",
                                                "" if heading else "Acc (std) over AvgAcc (std), %, over "
                                                "orderings; HM (%) of the phase to its left"))
            for line in notes:
                style = "yellow" if line.startswith(("Warning", "Left out")) else ""
                console.print(f"[{style}]{escape(line)}[/]" if style else line, highlight=False, markup=bool(style))


def report_metrics(report: Report) -> dict[str, float]:
    """Tau per group as metrics of the report run, so several reports compare in the MLflow UI."""
    return {f"tau_{r.metric}.{slug(r.scenario, r.pairing)}": float(r.tau) for r in report.ranking.itertuples()}


# ---------------------------------------------------------------- the entry point

def run_report(tracking_uri: str, selectors: list[str], *, matrix: str | None = None, out: Path | None = None,
               formats: tuple[str, ...] = ("table",), console: Console | None = None,
               log_to_mlflow: bool = True, figures: bool = True, progress: Console | None = None) -> Report:
    """Read the studies `selectors` name (study names, gtep/<study>, or globs such as 'gtep/mx-*'; with `matrix`,
    only phase runs tagged gtep.matrix=<matrix>) and write the report: the tables first (terminal, CSV, LaTeX),
    then the figures (reused where `out` holds them drawn from the same numbers; none with figures=False), the
    pages, and the report run. `progress`: where the stage lines go (None: nowhere). Raises ConfigError (naming
    the option) before writing anything when the store, the selectors or the formats are wrong."""
    formats = check_formats(formats)
    steps = Progress(progress)
    runs = open_store(tracking_uri)
    scope = f"matrix {matrix}" if matrix else ", ".join(selectors)
    steps.stage("read", f"reading the runs of {scope} from {tracking_uri}")
    data = collect(runs, list(selectors), matrix)
    # what gtep matrix writes of a cell as it ends, where it is missing: the phases' rows in gtep/reports and the
    # phases' snapshots of the runs a report reads of them (the next report reads those instead of searching)
    rows = Background(write_views, runs, data.phases["run_id"].tolist(), matrix) if log_to_mlflow else None
    steps.stage("summarise", f"summarising {len(data.phases)} phase runs of {data.phases['study'].nunique()} "
                f"studies ({len(data.trials)} tuning trials, {len(data.orderings)} orderings)")
    try:
        with Workers() as workers:  # fANOVA's fits, then the figures: the processes start once
            report = build_frames(data, workers)
            report.out = Path(out) if out is not None else Path(tempfile.mkdtemp(prefix="gtep-report-"))
            shown = [f for f in formats if f != "table"]
            steps.stage("tables", plural(len(report.tables), "table")
                        + (f", written as {', '.join(shown)}" if shown else ""))
            if "table" in formats:
                print_report(report, console or Console())
            report.paths = write_tables(report, report.out, formats)
            if figures:
                def drawing(todo: int, reused: int, processes: int) -> None:
                    kept = (f"; {reused} reused (drawn from the same numbers into {report.out} before)" if reused
                            else "")
                    steps.stage("figures", f"figures of {plural(todo, 'group')}"
                                + (f" in {processes} processes" if processes > 1 else "") + kept)
                report.paths += draw_groups(report, group_folders(report, report.out), vector="latex" in formats,
                                            before=drawing, workers=workers).paths
        steps.stage("pages", f"report.html{' and report.md' if 'md' in formats else ''} in {report.out}")
        report.paths += write_pages(report, report.out, formats)
    except BaseException:
        if rows is not None:
            rows.thread.join()  # no write left running behind the error
        raise
    written = rows.result() if rows is not None else 0  # raises what the rows' writing raised
    if log_to_mlflow:
        steps.stage("log", f"logging the report to gtep/reports ({plural(written, 'phase row')} written beside it "
                    f"of {len(data.phases)})")
        report.run_id = runs.log_report(report.out, list(selectors), matrix, report_metrics(report))
    steps.finish()
    return report
