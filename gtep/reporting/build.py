"""`gtep report`: read tracked studies from MLflow and write the paper's tables and figures (nothing is re-run).

run_report = validate -> collect (the store's runs as frames) -> summarise -> tables and plots per scenario and pairing
-> terminal / Markdown / CSV / LaTeX / PNG -> one report run in gtep/reports with every file as an artifact.
Everything that can be wrong with the input is found before the first file is written.
"""
from __future__ import annotations

import base64
import hashlib
import html
import math
import multiprocessing
import os
import re
import tempfile
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
from rich.console import Console
from rich.markup import escape

from gtep.config import ConfigError
from gtep.orchestration.report_store import open_store
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

def search_frames(data: StoreData, phases: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Importance and best-so-far per tuning phase (one algorithm of one scenario and pairing)."""
    importances, curves = [], []
    tuned = phases[phases["phase"] == TUNE.name]
    for _, phase in tuned.iterrows():
        trials = data.trials[data.trials["phase_run_id"] == phase["run_id"]]
        if trials.empty:
            continue
        keys = {k: phase[k] for k in (*sm.GROUP, "label")}
        selection = phase["selection"] or "hmean_of_means"
        hparams = data.hparams[data.hparams["trial_run_id"].isin(trials["run_id"])]
        imp = search.hyperparameter_importance(trials, hparams, selection)
        scored = int(search.trial_scores(trials, selection).notna().sum())  # what fANOVA was fitted on
        importances.append(imp.assign(**keys, trials=scored))
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

    @classmethod
    def of(cls, report: Report, group: tuple[str, str], folder: Path) -> "GroupFigures":
        return cls(group[0], group[1], folder, _part(report.curves, group), _part(report.summary, group),
                   _part(report.convergence, group), _part(report.importance, group), _part(report.gacc, group),
                   _part(report.family_curves, group))


def draw_group(figures: GroupFigures) -> list[Path]:
    """One group's plots, each as PNG and PDF."""
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
    return [path for png in drawn if png is not None for path in (png, png.with_suffix(".pdf"))]


def report_workers(groups: int) -> int:
    """Processes drawing the groups' figures: GTEP_REPORT_WORKERS, else one per CPU up to 8, never more than there
    are groups. Rendering (PNG and PDF, every algorithm in every panel) is most of a large report's time: 8 groups
    of 15 algorithms took about 4 of its 5 minutes in one process."""
    wanted = os.environ.get("GTEP_REPORT_WORKERS")
    count = int(wanted) if wanted else min(os.cpu_count() or 1, 8)
    return max(1, min(count, groups))


def draw_groups(report: Report, folders: dict[tuple[str, str], Path]) -> list[Path]:
    """Every group's figures; several groups at once in worker processes (spawned: the report may run inside a
    process with Ray's and MLflow's threads, which a fork would copy mid-flight)."""
    jobs = [GroupFigures.of(report, group, folder) for group, folder in folders.items()]
    workers = report_workers(len(jobs))
    if workers == 1:
        return [path for job in jobs for path in draw_group(job)]
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        return [path for paths in pool.map(draw_group, jobs) for path in paths]


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


def write_files(report: Report, out: Path, formats: tuple[str, ...]) -> list[Path]:
    """Every group's tables and plots, the frames as CSV, report.md, and always report.html (what the MLflow UI
    shows of the report run)."""
    out.mkdir(parents=True, exist_ok=True)
    folders = {group: out / slug(*group) for group in report.tables}
    written = [p for group, folder in folders.items() for p in write_group(report, group, folder, formats)]
    written += draw_groups(report, folders)
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
    if "md" in formats:
        (out / "report.md").write_text(markdown_report(report, folders, out))
        written.append(out / "report.md")
    (out / "report.html").write_text(html_report(report, folders))
    written.append(out / "report.html")
    if "latex" in formats and not report.ranking.empty:
        frame = report.ranking.set_index("metric")[["scenario", "pairing", "algorithms", "tau"]]
        frame = frame.assign(tau=frame["tau"].map(lambda v: "tied" if math.isnan(v) else f"{v:.3f}"))
        (out / "ranking.tex").write_text(tables.latex_frame(frame, "Kendall's tau between the tuning and evaluation "
                                                                   "phase rankings.", "tab:gtep-ranking"))
        written.append(out / "ranking.tex")
    return written


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
        report.run_id = runs.log_report(report.out, list(selectors), matrix, report_metrics(report), report.summary)
    return report
