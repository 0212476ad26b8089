"""Terminal tables (rich) for phases, search spaces and registries, and the paper's result tables (Tables 7-22)
as rich, Markdown and LaTeX for `gtep report`."""
from __future__ import annotations

import math
import re
from typing import Any, Mapping

import pandas as pd
from rich.markup import escape
from rich.table import Table

from gtep.protocol.families import CLASS_INCREMENTAL, FAMILIES, metric_label
from gtep.protocol.phases import reported_phases


def pm(mean: float, std: float) -> str:
    """'61.2 ± 1.3' in percent, or 'NaN' for a diverged phase (as the paper's tables show BEEF)."""
    if mean is None or math.isnan(mean):
        return "NaN"
    return f"{100 * mean:.2f} ± {100 * std:.2f}"


def pct(value: float) -> str:
    return "NaN" if value is None or math.isnan(value) else f"{100 * value:.2f}"


def headline_metrics(summary: dict[str, Any]) -> tuple[str, ...]:
    """The scenario family's own metrics the tables show beside Acc, AvgAcc and HM (none for class-incremental)."""
    family = str(summary.get("family") or CLASS_INCREMENTAL)
    return FAMILIES.get(family).headline if family in FAMILIES else ()


def _plain(summary: dict[str, Any]) -> frozenset[str]:
    """The family's metrics that are not fractions (cross-entropy, ATM, MACs): shown as they are, not in %."""
    family = str(summary.get("family") or CLASS_INCREMENTAL)
    return FAMILIES.get(family).plain_metrics if family in FAMILIES else frozenset()


def metric_header(name: str, summary: dict[str, Any]) -> str:
    label = metric_label(name)
    return label if name in _plain(summary) else f"{label} (%)"


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def undefined_reason(name: str, summary: Mapping[str, Any]) -> str:
    """Why a family's metric has no value in a phase none of whose orderings diverged (its Metric.undefined, e.g.
    FSCIL's RPD after a first session below chance); "" when it has one, or when a diverged ordering is why."""
    family = str(summary.get("family") or CLASS_INCREMENTAL)
    diverged, orderings = summary.get("diverged", 0), summary.get("orderings", 1)
    finished = not _missing(diverged) and not diverged and not _missing(orderings) and orderings > 0
    if family not in FAMILIES or not finished or not _missing(summary.get(name, math.nan)):
        return ""
    return next((m.undefined for m in FAMILIES.get(family).metrics if m.name == name), "")


def undefined_notes(summary: pd.DataFrame) -> list[str]:
    """One line per reason under a report's table: which metrics of which rows (algorithm, phase) are undefined,
    and why, so that a NaN there reads as 'no meaning here', not as a run that diverged."""
    if "family" not in summary:
        return []
    where: dict[str, dict[str, list[str]]] = {}  # reason -> metric label -> rows
    for _, row in summary.iterrows():
        family = str(row.get("family") or CLASS_INCREMENTAL)
        for metric in FAMILIES.get(family).metrics if family in FAMILIES else ():
            reason = undefined_reason(metric.name, row) if metric.undefined else ""
            if reason:
                where.setdefault(reason, {}).setdefault(metric.label, []).append(f"{row['label']} ({row['phase']})")
    notes = []
    for reason, labels in where.items():
        rows = dict.fromkeys(r for rs in labels.values() for r in rs)
        notes.append(f"Undefined (NaN): {', '.join(labels)} of {', '.join(rows)}: {reason}.")
    return notes


def metric_cell(name: str, summary: dict[str, Any]) -> str:
    if undefined_reason(name, summary):
        return "NaN (undefined)"
    mean, std = summary.get(name, math.nan), summary.get(f"{name}_std", math.nan)
    if name not in _plain(summary):
        return pm(mean, std)
    return "NaN" if mean is None or math.isnan(mean) else f"{mean:.4g} ± {std:.2g}"


def metric_gap(name: str, tuning: dict[str, Any], evaluation: dict[str, Any]) -> str:
    gap = tuning.get(name, math.nan) - evaluation.get(name, math.nan)
    return (f"{gap:.4g}" if not math.isnan(gap) else "NaN") if name in _plain(tuning) else pct(gap)


def _criterion_label(summary: dict[str, Any]) -> str:
    name = summary.get("criterion")
    return f"H* by {name}" if name and name != "hmean_acc_avgacc" else ""


def phase_comparison(tuning: dict[str, Any], evaluation: dict[str, Any], tuning_label: str, evaluation_label: str,
                     title: str, extra: dict[str, dict[str, Any]] | None = None) -> Table:
    """Both phases side by side: Acc and AvgAcc (mean ± std over orderings), their harmonic mean, the scenario
    family's own metrics (FSCIL: gAcc AUC, aAcc, novel), the gap. `extra` adds labelled rows after them, e.g.
    {"conventional": ..., "original": ...}; the gap stays tuning - eval."""
    headline = headline_metrics(tuning)
    caption = f"D^HT = {tuning_label}   D^E = {evaluation_label}"
    table = Table(title=title, caption=f"{caption}   {_criterion_label(tuning)}".rstrip())
    columns = ("phase", "Acc (%)", "AvgAcc (%)", "HM (%)", *(metric_header(m, tuning) for m in headline),
               "orderings", "diverged")
    for column in columns:
        table.add_column(column, justify="left" if column == "phase" else "right", no_wrap=True)
    for name, s in (("tuning", tuning), ("evaluation", evaluation), *(extra or {}).items()):
        table.add_row(name, pm(s["acc"], s["acc_std"]), pm(s["avg_acc"], s["avg_acc_std"]), pct(s["hmean"]),
                      *(metric_cell(m, s) for m in headline), orderings_cell(s), str(int(s["diverged"])))
    gap = tuning["hmean"] - evaluation["hmean"]
    table.add_row("gap", pct(tuning["acc"] - evaluation["acc"]),
                  pct(tuning["avg_acc"] - evaluation["avg_acc"]), pct(gap),
                  *(metric_gap(m, tuning, evaluation) for m in headline), "", "",
                  style="bold")
    return table


def orderings_cell(summary: dict[str, Any]) -> str:
    """'k/S': orderings with a result out of the S the phase runs; marked when some are missing."""
    done, expected = int(summary["orderings"]), int(summary.get("expected", summary["orderings"]))
    return f"{done}/{expected}" if done >= expected else f"[bold red]{done}/{expected} incomplete[/]"


def phase_summary(summary: dict[str, Any], label: str, title: str) -> Table:
    headline = headline_metrics(summary)
    table = Table(title=title, caption=f"{label}   {_criterion_label(summary)}".rstrip())
    for column in ("Acc (%)", "AvgAcc (%)", "HM (%)", *(metric_header(m, summary) for m in headline),
                   "orderings", "diverged"):
        table.add_column(column, justify="right", no_wrap=True)
    table.add_row(pm(summary["acc"], summary["acc_std"]), pm(summary["avg_acc"], summary["avg_acc_std"]),
                  pct(summary["hmean"]),
                  *(metric_cell(m, summary) for m in headline), orderings_cell(summary),
                  str(int(summary["diverged"])))
    return table


def hparams_table(hparams: dict[str, Any], title: str) -> Table:
    table = Table(title=title)
    table.add_column("hyperparameter")
    table.add_column("value", justify="right")
    for key, value in hparams.items():
        table.add_row(key, str(value))
    return table


# ---------------------------------------------------------------- the paper's tables (gtep report)

def paper_cell(stats: Any) -> str:
    """'41.21 (1.06) / 59.82 (1.48)': Acc / AvgAcc in percent, std over orderings in parentheses (paper Tables
    7-22); 'NaN (k/S diverged)' when k orderings diverged, as the paper prints BEEF."""
    if stats["diverged"]:
        return f"NaN ({int(stats['diverged'])}/{int(stats['orderings'])} diverged)"
    if not stats["orderings"]:
        return "-"
    return (f"{100 * stats['acc']:.2f} ({100 * stats['acc_std']:.2f}) / "
            f"{100 * stats['avg_acc']:.2f} ({100 * stats['avg_acc_std']:.2f})")


def paper_table(summary: pd.DataFrame, gaps: pd.DataFrame) -> pd.DataFrame:
    """One scenario and pairing as the paper prints it: algorithms as rows, per phase 'Acc / AvgAcc' mean (std)
    and the harmonic mean of the two means (HM, %, the selection score the terminal shows); then the
    overestimation gap of the harmonic mean and the rank in each phase ('2 → 1'). The datasets are the pairing's,
    named in the table's title."""
    columns: dict[str, dict[str, str]] = {}
    for phase in reported_phases():  # the column order: tuning data first, then unseen data
        part = summary[summary["phase"] == phase.name]
        if part.empty:
            continue
        columns[phase.header] = {r["label"]: paper_cell(r) for _, r in part.iterrows()}
        columns[f"HM {phase.header}"] = {r["label"]: pct(r["hmean"]) for _, r in part.iterrows()}
        columns.update(family_columns(part, phase.header))
    table = pd.DataFrame(columns)
    if not gaps.empty:
        by_label = gaps.set_index("label")
        table["gap HM (pp)"] = [pct(by_label.at[label, "gap"]) if label in by_label.index else ""
                                for label in table.index]
        table["rank tune → eval"] = [_ranks(by_label, label) for label in table.index]
    table.index.name = "algorithm"
    return table.sort_index().fillna("-")




def mean_std_cell(mean: float, std: float | None, unit: str = "percent") -> str:
    """'61.20 (1.30)': a mean and its std over orderings, in percent (a ratio or a count as it is: '0.0212 (0)',
    '3.67e+09'); 'NaN' when the mean is undefined."""
    if mean is None or math.isnan(mean):
        return "NaN"
    show = (lambda v: f"{100 * v:.2f}") if unit == "percent" else (lambda v: f"{v:.3g}")
    return f"{show(mean)} ({show(std)})" if std is not None and not math.isnan(std) else show(mean)


def family_columns(part: pd.DataFrame, header: str) -> dict[str, dict[str, str]]:
    """The columns a family adds after a phase's HM (its table_metrics, e.g. FSCIL's aAcc and gAcc AUC, and H*'s
    criterion), only for the rows of that family: a family with none (class-incremental) adds none, so its table
    is the paper's as before."""
    columns: dict[str, dict[str, str]] = {}
    if "family" not in part:
        return columns
    for family in dict.fromkeys(part["family"]):
        if family not in FAMILIES or not FAMILIES.get(family).table_metrics:
            continue
        rows = part[part["family"] == family]
        units = {m.name: m.unit for m in FAMILIES.get(family).metrics}
        for metric in FAMILIES.get(family).table_metrics:
            columns[f"{metric_label(metric)} {header}"] = {
                r["label"]: mean_std_cell(r[metric], r.get(f"{metric}_std"), units.get(metric, "percent"))
                for _, r in rows.iterrows()}
        columns[f"criterion {header}"] = {r["label"]: pct(r["score"]) for _, r in rows.iterrows()}
    return columns


def _ranks(by_label: pd.DataFrame, label: str) -> str:
    if label not in by_label.index:
        return ""
    a, b = by_label.at[label, "rank_tuning"], by_label.at[label, "rank_evaluation"]
    return " → ".join("-" if math.isnan(v) else str(int(v)) for v in (a, b))


def terminal_paper_table(table: pd.DataFrame) -> pd.DataFrame:
    """The paper table narrowed for a terminal: Acc and AvgAcc on two lines of a cell, headers on two lines and
    each phase's HM column headed just 'HM' (it stands right of its phase), so it fits 80 columns where it can."""
    def header(name: str) -> str:
        if name.startswith("HM "):
            return "HM"
        if name == "gap HM (pp)":
            return "gap HM\n(pp)"
        if name == "rank tune → eval":
            return "rank\ntune→eval"
        return name.replace(" (", "\n(", 1)

    narrow = table.map(lambda v: str(v).replace(" / ", "\n") if " / " in str(v) else v)
    return narrow.rename(columns=header)


def rich_frame(frame: pd.DataFrame, title: str, caption: str = "") -> Table:
    """A string frame as a terminal table, its index as the first column."""
    # cells are text, not markup: a label such as "replay [asha]" (an algorithm's study) must print as it is
    table = Table(title=escape(title), caption=escape(caption) if caption else None)
    table.add_column(escape(frame.index.name or ""), no_wrap=True)
    for column in frame.columns:
        table.add_column(escape(str(column)), justify="right")
    for label, row in frame.iterrows():
        table.add_row(escape(str(label)), *[escape(str(v)) for v in row])
    return table


def markdown_frame(frame: pd.DataFrame) -> str:
    """A GitHub-flavoured Markdown table (no tabulate dependency); pipes in cells are escaped."""
    def cell(value: Any) -> str:
        return str(value).replace("|", "\\|").replace("\n", " ")

    header = [frame.index.name or "", *map(str, frame.columns)]
    lines = ["| " + " | ".join(map(cell, header)) + " |", "|" + "|".join(["---"] + ["---:"] * len(frame.columns)) + "|"]
    lines += ["| " + " | ".join(map(cell, [label, *row])) + " |" for label, row in frame.iterrows()]
    return "\n".join(lines) + "\n"


LATEX_SPECIAL = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_", "{": r"\{",
                 "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}", "→": r"$\rightarrow$"}


LATEX_SYMBOLS = {"D^HT": "$D^{HT}$", "D^E": "$D^{E}$", "H*": r"$\mathcal{H}^{*}$"}  # the paper's notation


def latex_escape(text: Any) -> str:
    parts = re.split("(" + "|".join(map(re.escape, LATEX_SYMBOLS)) + ")", str(text))
    return "".join(LATEX_SYMBOLS.get(part) or "".join(LATEX_SPECIAL.get(ch, ch) for ch in part) for part in parts)


def latex_frame(frame: pd.DataFrame, caption: str, label: str) -> str:
    """A booktabs table as in the paper's appendix (needs \\usepackage{booktabs})."""
    spec = "l" + "r" * len(frame.columns)
    head = " & ".join(latex_escape(c) for c in [frame.index.name or "", *frame.columns])
    body = "\n".join(" & ".join(latex_escape(c) for c in [label_, *row]) + r" \\" for label_, row in frame.iterrows())
    return (f"\\begin{{table}}[t]\n\\centering\n\\caption{{{latex_escape(caption)}}}\n\\label{{{label}}}\n"
            f"\\resizebox{{\\linewidth}}{{!}}{{%\n\\begin{{tabular}}{{{spec}}}\n\\toprule\n{head} \\\\\n\\midrule\n"
            f"{body}\n\\bottomrule\n\\end{{tabular}}}}\n\\end{{table}}\n")
