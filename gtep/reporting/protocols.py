"""Tuning protocols side by side (issue 24): per algorithm of a scenario and pairing, each protocol's H*, the score
it reports, the evaluation-phase score of that H* and the training compute the tuning spent.

A protocol is how a study tuned (its phase runs' params gtep.protocol, gtep.protocol_tasks, gtep.scheduler):
`gtep` (every set over the whole scenario), `first_task (k=K)` (Lee et al. 2024: sets compared on the first K
tasks), either with a scheduler that stopped sets early (`gtep + asha`), and `conventional` (the paper's section
3.1: the tuned H* reported on the tuning data, from a study's conventional phase). Each study is one row (a
conventional phase adds a row for its study); the compute is relative to the same algorithm's `gtep` study
without a scheduler, when the report has one. Pure pandas over the report's frames; nothing is re-run.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from gtep.protocol.criteria import CRITERIA
from gtep.protocol.families import FAMILIES  # noqa: F401  (registers the families and their criteria)
from gtep.protocol.phases import CONVENTIONAL, EVALUATE, TUNE
from gtep.protocol.ties import competition_ranks
from gtep.reporting.collect import StoreData
from gtep.reporting.summary import GROUP

FULL = "gtep"  # the reference row: every set over every ordering of the whole scenario
PROTOCOL_COLUMNS = [*GROUP, "algorithm", "label", "study", "protocol", "best_set_index", "sets", "sets_stopped",
                    "compute_seconds", "compute_ratio", "tuning_score", "reported_score", "evaluation_score",
                    "evaluation_std"]
# the ordering-run column whose std over orderings goes with a criterion's score


def protocol_name(phase: pd.Series) -> str:
    """'gtep', 'first_task (k=2)', 'gtep + asha'; a run older than the params is gtep without a scheduler."""
    protocol = _text(phase.get("protocol")) or FULL
    if protocol == "first_task":
        k = _text(phase.get("protocol_tasks"))
        protocol = f"first_task (k={k})" if k else protocol
    if protocol == "conventional":  # a study tuned for the conventional protocol tunes as gtep does
        protocol = FULL
    scheduler = _text(phase.get("scheduler")) or "none"
    return protocol if scheduler == "none" else f"{protocol} + {scheduler}"


def _text(value: object) -> str:
    return "" if value is None or (isinstance(value, float) and math.isnan(value)) else str(value)


def phase_score(summary_row: pd.Series | None) -> float:
    """The value of the criterion H* is selected by: a family's `score`, else the harmonic mean of Acc and AvgAcc."""
    if summary_row is None:
        return math.nan
    score = float(summary_row.get("score", math.nan)) if "score" in summary_row else math.nan
    return score if not math.isnan(score) else float(summary_row.get("hmean", math.nan))


def score_std(data: StoreData, phase_run_id: str, criterion: str) -> float:
    """Std over a phase's finished orderings of its criterion's per-ordering value (the HM for class-incremental)."""
    name = criterion or "hmean_acc_avgacc"
    rows = data.orderings[(data.orderings["phase_run_id"] == phase_run_id) & (data.orderings["status"] != "diverged")]
    if name not in CRITERIA or rows.empty:
        return math.nan
    values = [v for v in (CRITERIA.get(name).of(r) for r in rows.to_dict("records")) if not math.isnan(v)]
    return float(np.std(values)) if values else math.nan


def compute_seconds(data: StoreData, phase: pd.Series) -> float:
    """The phase run's compute_seconds; for a run older than the metric, its ordering runs' training seconds."""
    logged = float(phase.get("compute_seconds", math.nan))
    if not math.isnan(logged):
        return logged
    rows = data.orderings[data.orderings["phase_run_id"] == phase["run_id"]]
    return float(rows["train_seconds"].fillna(0).sum()) if len(rows) else math.nan


def protocol_rows(data: StoreData, summary: pd.DataFrame) -> pd.DataFrame:
    """One row per study that tuned (and one more per conventional phase), see the module's docstring."""
    rows = []
    phases = data.phases.set_index("run_id", drop=False)
    for _, tuned in summary[summary["phase"] == TUNE.name].iterrows():
        phase = phases.loc[tuned["run_id"]]
        mates = summary[(summary["study"] == tuned["study"]) & (summary["label"] == tuned["label"])
                        & (summary[GROUP[0]] == tuned[GROUP[0]]) & (summary[GROUP[1]] == tuned[GROUP[1]])]
        evaluated = _one(mates, EVALUATE.name)
        criterion = str(phase.get("criterion", "") or "")
        eval_score = phase_score(evaluated)
        eval_std = math.nan if evaluated is None else score_std(data, str(evaluated["run_id"]), criterion)
        base = {**{k: tuned[k] for k in (*GROUP, "algorithm", "label", "study")},
                "best_set_index": _index(phase), "sets": _count(phase, ("sets_complete", "sets_incomplete",
                                                                        "sets_diverged", "sets_stopped")),
                "sets_stopped": _count(phase, ("sets_stopped",)), "compute_seconds": compute_seconds(data, phase),
                "tuning_score": phase_score(tuned), "evaluation_score": eval_score, "evaluation_std": eval_std}
        rows.append({**base, "protocol": protocol_name(phase), "reported_score": eval_score})
        conventional = _one(mates, CONVENTIONAL.name)
        if conventional is not None:  # the same H*, reported on the tuning data
            rows.append({**base, "protocol": "conventional", "reported_score": phase_score(conventional)})
    frame = pd.DataFrame(rows, columns=PROTOCOL_COLUMNS)
    return with_compute_ratio(frame)


def with_compute_ratio(frame: pd.DataFrame) -> pd.DataFrame:
    """compute_ratio: a row's compute over the same algorithm's full gtep study's (NaN when there is none)."""
    if frame.empty:
        return frame
    full = frame[frame["protocol"] == FULL].groupby([*GROUP, "algorithm"])["compute_seconds"].max()
    reference = [full.get(tuple(r), math.nan) for r in frame[[*GROUP, "algorithm"]].itertuples(index=False)]
    frame = frame.copy()
    frame["compute_ratio"] = frame["compute_seconds"] / pd.Series(reference, index=frame.index, dtype=float)
    return frame


def compared(frame: pd.DataFrame) -> pd.DataFrame:
    """The rows worth a table: those of algorithms with two or more protocols in their scenario and pairing."""
    if frame.empty:
        return frame
    counts = frame.groupby([*GROUP, "algorithm"])["protocol"].transform("nunique")
    return frame[counts >= 2].reset_index(drop=True)


def _one(mates: pd.DataFrame, phase: str) -> pd.Series | None:
    rows = mates[mates["phase"] == phase]
    return rows.iloc[-1] if len(rows) else None


def _index(phase: pd.Series) -> float:
    for key in ("best_set_index_tag", "best_set_index"):
        try:
            value = float(phase.get(key, math.nan))
        except (TypeError, ValueError):
            continue
        if not math.isnan(value):
            return value
    return math.nan


def _count(phase: pd.Series, names: tuple[str, ...]) -> float:
    values = [float(phase.get(n, math.nan)) for n in names]
    finite = [v for v in values if not math.isnan(v)]
    return float(sum(finite)) if finite else math.nan


PROTOCOLS_HEADING = "Tuning protocols: each one's H*, its evaluation-phase score and the compute it spent"
PROTOCOLS_NOTE = ("Scores in % (H*'s criterion); reported: what the protocol would publish (conventional: H* on the "
                  "tuning data); evaluation: H* re-trained on D^E, mean (std) over orderings; compute: training "
                  "seconds of the tuning phase, x gtep: over the same algorithm's full gtep study's.")


def protocol_table(frame: pd.DataFrame) -> pd.DataFrame:
    """The rows of one scenario and pairing as strings, one per (algorithm, protocol): the full gtep study (the
    reference) and its conventional report first, then the cheaper protocols, best evaluation score first."""
    if frame.empty:
        return pd.DataFrame()
    rank = frame["protocol"].map({FULL: 0, "conventional": 1}).fillna(2)
    # best evaluation score first, scores within gtep/protocol/ties.py's tolerance tied (kept in the frame's order,
    # not put in an order float rounding chose); NaN last
    score_rank = frame.groupby("algorithm")["evaluation_score"].transform(
        lambda scores: pd.Series(competition_ranks(scores.to_numpy(dtype=float)), index=scores.index))
    frame = frame.assign(_rank=rank, _score_rank=score_rank).sort_values(["algorithm", "_rank", "_score_rank"],
                                                                         kind="stable")
    several = frame.groupby(["algorithm", "protocol"])["study"].transform("nunique") > 1
    rows = {}
    for (_, row), named in zip(frame.iterrows(), several):
        key = f"{row['label'] if row['label'] != row['algorithm'] and named else row['algorithm']}: {row['protocol']}"
        rows[key] = {"study": row["study"], "H*": _set(row["best_set_index"]),
                     "sets (stopped)": _sets(row["sets"], row["sets_stopped"]),
                     "compute (s)": _number(row["compute_seconds"], "{:.0f}"),
                     "x gtep": _number(row["compute_ratio"], "{:.2f}"),
                     "tuning": _pct(row["tuning_score"]), "reported": _pct(row["reported_score"]),
                     "evaluation": _pct(row["evaluation_score"], row["evaluation_std"])}
    return pd.DataFrame.from_dict(rows, orient="index").rename_axis("algorithm: protocol")


def _set(index: float) -> str:
    return "-" if math.isnan(index) else f"set{int(index):03d}"


def _sets(total: float, stopped: float) -> str:
    if math.isnan(total):
        return "-"
    return f"{int(total)}" + (f" ({int(stopped)})" if not math.isnan(stopped) and stopped else "")


def _number(value: float, form: str) -> str:
    return "-" if value is None or math.isnan(value) else form.format(value)


def _pct(mean: float, std: float = math.nan) -> str:
    if mean is None or math.isnan(mean):
        return "-"
    return f"{100 * mean:.2f}" + (f" ({100 * std:.2f})" if not math.isnan(std) else "")
