"""Every set evaluated (evaluation.sets: all): per study, how the tuning phase ranks its sets against their evaluation
scores, and each cheaper protocol's regret (issue 49). The numbers are those the study's evaluate_sets phase wrote
at its end (protocol_regret.json, gtep/orchestration/set_evaluation.py, from gtep/protocol/regret.py); a study
without that phase shows none of them, and one whose phase did not finish is listed among the runs left out.
Pure pandas over the report's frames."""
from __future__ import annotations

import math
from typing import Any

import pandas as pd

from gtep.protocol.phases import EVALUATE
from gtep.reporting.collect import StoreData, ranks_every_set
from gtep.reporting.summary import GROUP

RANKING_HEADING = "Every set evaluated: the tuning phase's ranking of the sets on D^E"
RANKING_NOTE = ("Kendall's tau-b and Spearman's rho between the sets' tuning and evaluation scores (sets that "
                "diverged in either phase left out); H*'s rank among the sets on D^E (1 = best); regret: the best "
                "set's evaluation score minus H*'s, in points.")
REGRET_HEADING = "Tuning protocols replayed: the set each picks, its compute and its regret on D^E"
REGRET_NOTE = ("compute: the protocol's tuning seconds relative to the full study's; regret: the best set's "
               "evaluation score minus the pick's, in points (a pick that diverged on D^E scores 0); conventional "
               "tunes on D^E itself, so its regret is 0 by construction and its reported score optimistic; random: "
               "the expected regret of a set drawn at random.")
RANKING_COLUMNS = [*GROUP, "label", "study", "sets", "ranked", "diverged", "kendall_tau", "spearman_rho",
                   "best_rank", "regret_points"]
REGRET_COLUMNS = [*GROUP, "label", "study", "protocol", "options", "picks", "compute", "regret_points", "note"]


def _where(summary: pd.DataFrame, study: str) -> dict[str, Any] | None:
    """The group and label the study's evaluation is reported under (its evaluate phase's summary row)."""
    rows = summary[(summary["study"] == study) & (summary["phase"] == EVALUATE.name)]
    if rows.empty:
        return None
    row = rows.iloc[0]
    return {**{k: row[k] for k in GROUP}, "label": row["label"], "study": study}


def _points(value: Any) -> float:
    return math.nan if value is None or (isinstance(value, float) and math.isnan(value)) else 100.0 * float(value)


def ranking_rows(data: StoreData, summary: pd.DataFrame) -> pd.DataFrame:
    """One row per study with every set evaluated."""
    rows = []
    for _, phase in data.phases[ranks_every_set(data.phases)].iterrows():
        where, table = _where(summary, phase["study"]), data.set_evaluations.get(phase["run_id"]) or {}
        if where is None or "ranking" not in table:
            continue
        r = table["ranking"]
        rows.append({**where, "sets": r["sets"], "ranked": r["ranked"],
                     "diverged": ", ".join(f"set{i:03d}" for i in r["diverged"]) or "-",
                     "kendall_tau": r["kendall_tau"], "spearman_rho": r["spearman_rho"],
                     "best_rank": r["best_rank"] if r["best_rank"] is not None else "diverged",
                     "regret_points": _points(r["regret"])})
    return pd.DataFrame(rows, columns=RANKING_COLUMNS)


def regret_rows(data: StoreData, summary: pd.DataFrame) -> pd.DataFrame:
    """One row per (study, protocol with its options)."""
    rows = []
    for _, phase in data.phases[ranks_every_set(data.phases)].iterrows():
        where, table = _where(summary, phase["study"]), data.set_evaluations.get(phase["run_id"]) or {}
        if where is None:
            continue
        for row in table.get("protocols", []):
            rows.append({**where, "protocol": row["protocol"], "options": row["options"],
                         "picks": "-" if row["picked"] is None else f"set{int(row['picked']):03d}",
                         "compute": row["fraction"], "regret_points": _points(row["regret"]), "note": row["note"]})
    return pd.DataFrame(rows, columns=REGRET_COLUMNS)


def shown(frame: pd.DataFrame) -> pd.DataFrame:
    """A frame as the report prints it: numbers rounded, NaN as '-', the group columns dropped."""
    out = frame.drop(columns=[c for c in GROUP if c in frame]).copy()
    for column in ("kendall_tau", "spearman_rho", "compute", "regret_points"):
        if column in out:
            out[column] = out[column].map(lambda v: "-" if v is None or v != v else f"{float(v):.2f}")
    return out.set_index("label")
