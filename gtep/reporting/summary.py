"""From the store's runs to the numbers the paper reports (pure pandas and numpy; no MLflow here).

Per scenario and dataset pairing (one paper table, Tables 7-22) and per algorithm:
  tuning       H*'s orderings in the tuning phase (the best trial's ordering runs)
  conventional H* re-run on D^HT's classes with fresh orderings (the conventional protocol's number)
  evaluation   H* on D^E (the evaluate phase's ordering runs)
  original     the authors' `original` preset on D^E (paper Figure 4a, Table 7)
each as Acc and AvgAcc, mean and std over orderings; then the overestimation gap and the change of ranking.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from gtep.orchestration.report_store import (
    CLASS_INCREMENTAL,
    GACC_COLUMNS,
    ORDERING_METRICS,
    default_criterion,
    family_metrics,
)
from gtep.protocol.criteria import CRITERIA
from gtep.protocol.families import FAMILIES
from gtep.protocol.metrics import harmonic_mean, harmonic_mean_gap, kendall_tau_b
from gtep.protocol.phases import EVALUATE, TUNE, fixed_set_phases, reported_phases
from gtep.protocol.summary import ordering_statistics
from gtep.protocol.ties import competition_ranks
from gtep.reporting.collect import StoreData, best_trial_id

GROUP = ["scenario", "pairing"]
COST_METRICS = ("params_total", "params_trainable", "train_seconds", "forgetting")
RANKED = ("hmean", "acc", "avg_acc")


def summarize_orderings(rows: pd.DataFrame, family: str = CLASS_INCREMENTAL) -> dict[str, float]:
    """Mean and population std over orderings of Acc, AvgAcc and the family's other ordering metrics (its table's
    scalars that every ordering run logs: forgetting, old and new accuracy), as `summarize_units` does when a phase
    ends: a diverged ordering makes the means NaN (the paper's NaN for BEEF) while the std and costs describe the
    finished ones. HM is the harmonic mean of the means; hmean_std the std of the orderings' own HMs."""
    finished = rows[rows["status"] != "diverged"]
    diverged = len(rows) - len(finished)
    out: dict[str, float] = {"orderings": float(len(rows)), "diverged": float(diverged)}
    scalars = FAMILIES.get(family).metric_names if family in FAMILIES else ()
    names = ("acc", "avg_acc", *(n for n in scalars if n in ORDERING_METRICS and n not in ("acc", "avg_acc", "hmean")))
    out.update(ordering_statistics(rows.to_dict("records"), names))
    out["hmean"] = harmonic_mean(out["acc"], out["avg_acc"])
    hmeans = [harmonic_mean(float(a), float(b)) for a, b in zip(finished["acc"], finished["avg_acc"])]
    out["hmean_std"] = float(np.std(hmeans)) if hmeans else math.nan
    for key in COST_METRICS:
        values = finished[key].dropna().to_numpy(dtype=float)
        out[key] = float(np.mean(values)) if len(values) else math.nan
    return out


def phase_orderings(data: StoreData, phase: pd.Series) -> pd.DataFrame:
    """The ordering runs behind a phase's column. A tuning phase with no H* (every set diverged) shows all of its
    orderings, so its cell reads NaN with their diverged count."""
    rows = data.orderings[data.orderings["phase_run_id"] == phase["run_id"]]
    if phase["phase"] == TUNE.name:
        best = best_trial_id(data, phase)
        if best is not None:
            rows = rows[rows["trial_run_id"] == best]
    return rows.sort_values("ordering")


def algorithm_labels(phases: pd.DataFrame) -> pd.Series:
    """The table's row name: the algorithm, with its study when one group holds the algorithm twice."""
    studies = phases.groupby([*GROUP, "algorithm"])["study"].transform("nunique")
    return phases["algorithm"].where(studies <= 1, phases["algorithm"] + " [" + phases["study"] + "]")


def family_of(phase: pd.Series) -> str:
    """A phase run's scenario family; a store (or frame) older than the tag is class-incremental."""
    family = phase.get("family", "")
    return str(family) if isinstance(family, str) and family else CLASS_INCREMENTAL


def family_summary(data: StoreData, phase: pd.Series, rows: pd.DataFrame, stats: dict[str, float]) -> dict[str, float]:
    """A family's own metrics (FSCIL: aAcc, gAcc AUC, ...) over the phase's orderings, as `summarize_orderings`
    does for Acc (a diverged ordering makes the mean NaN), the phase run's own number where the orderings have none;
    and `score`, the value of the criterion H* was selected by (H*'s trial's, else the phase run's, else computed)."""
    family = family_of(phase)
    names = family_metrics().get(family, ())
    out = ordering_statistics(rows.to_dict("records"), names)
    for name in names:
        if math.isnan(out[f"{name}_std"]):  # no ordering has it: the phase run's own number
            out[name] = float(phase.get(name, math.nan))
            out[f"{name}_std"] = float(phase.get(f"{name}_std", math.nan))
    criterion = str(phase.get("criterion", "") or default_criterion(family))
    score = math.nan
    if phase["phase"] == TUNE.name and "score" in data.trials:
        best = data.trials.loc[data.trials["run_id"] == best_trial_id(data, phase), "score"]
        score = float(best.iloc[0]) if len(best) else math.nan
    if math.isnan(score):
        score = float(phase.get("score", math.nan))
    if math.isnan(score) and not stats["diverged"] and criterion in CRITERIA:
        score = CRITERIA.get(criterion).of({**stats, **out})
    return {**out, "score": score}


def phase_summaries(data: StoreData) -> pd.DataFrame:
    """One row per (scenario, pairing, algorithm, phase) with the means, stds, diverged counts and costs; when a
    phase is of a family other than class-incremental, every row also has its family and criterion, and that
    phase's row the family's metrics and its criterion's `score` (see `family_summary`)."""
    # the phases with a summary row, in the paper's column order: tuning, then unseen data (their records')
    order = {p.name: i for i, p in enumerate(reported_phases())}
    phases = data.phases[data.phases["phase"].isin(order)].copy()
    phases["label"] = algorithm_labels(phases)
    families = [family_of(phase) for _, phase in phases.iterrows()]
    mixed = any(f != CLASS_INCREMENTAL for f in families)
    rows = []
    for family, (_, phase) in zip(families, phases.iterrows()):
        units = phase_orderings(data, phase)
        stats = summarize_orderings(units, family)
        tags: dict[str, str] = {}
        if mixed:
            tags = {"family": family, "criterion": str(phase.get("criterion", "") or default_criterion(family))}
            if family != CLASS_INCREMENTAL:
                stats.update(family_summary(data, phase, units, stats))
        rows.append({**{k: phase[k] for k in (*GROUP, "similarity", "label", "algorithm", "study", "phase",
                                              "dataset", "backbone", "run_id")}, **tags, **stats})
    frame = pd.DataFrame(rows)
    return frame.sort_values([*GROUP, "label", "phase"], key=lambda c: c.map(order) if c.name == "phase" else c,
                             kind="stable").reset_index(drop=True)


def _pivot(summary: pd.DataFrame, phase: str, columns: tuple[str, ...]) -> pd.DataFrame:
    part = summary[summary["phase"] == phase].set_index([*GROUP, "label"])
    return part[list(columns)]


def _side_by_side(tune: pd.DataFrame, evaluate: pd.DataFrame) -> pd.DataFrame:
    """The phases' columns side by side, named metric_tuning and metric_evaluation, for the groups in both (suffixes
    added before the join: pandas 3 deprecates join's lsuffix/rsuffix)."""
    return tune.add_suffix("_tuning").join(evaluate.add_suffix("_evaluation"), how="inner")


def gaps(summary: pd.DataFrame) -> pd.DataFrame:
    """Per algorithm: the harmonic means of both phases, the overestimation gap (tuning minus evaluation,
    paper Figures 4b and 7b) and the algorithm's rank in each phase (1 = best, by harmonic mean; harmonic means within
    gtep/protocol/ties.py's tolerance share a rank, so float rounding of a mean decides no rank)."""
    tune = _pivot(summary, TUNE.name, ("acc", "avg_acc", "hmean"))
    evaluate = _pivot(summary, EVALUATE.name, ("acc", "avg_acc", "hmean"))
    both = _side_by_side(tune, evaluate).reset_index()
    if both.empty:
        return pd.DataFrame(columns=[*GROUP, "label", "hmean_tuning", "hmean_evaluation", "gap", "rank_tuning",
                                     "rank_evaluation"])
    both["gap"] = [harmonic_mean_gap((r.acc_tuning, r.avg_acc_tuning), (r.acc_evaluation, r.avg_acc_evaluation))
                   for r in both.itertuples()]
    for phase in ("tuning", "evaluation"):
        both[f"rank_{phase}"] = both.groupby(GROUP)[f"hmean_{phase}"].transform(
            lambda scores: pd.Series(competition_ranks(scores.to_numpy(dtype=float)), index=scores.index))
    return both


def rankings(summary: pd.DataFrame) -> pd.DataFrame:
    """Per scenario and pairing: Kendall's tau-b between the algorithms' tuning-phase and evaluation-phase scores
    (harmonic mean, Acc, AvgAcc). tau = 1: the tuning phase ranks the algorithms as unseen data does; lower: the
    conventional protocol would have ordered them differently (paper section 4.1, Figure 4)."""
    rows = []
    tune = _pivot(summary, TUNE.name, RANKED)
    evaluate = _pivot(summary, EVALUATE.name, RANKED)
    both = _side_by_side(tune, evaluate)
    for group, part in both.groupby(level=[0, 1], sort=True):
        for metric in RANKED:
            x, y = part[f"{metric}_tuning"], part[f"{metric}_evaluation"]
            usable = x.notna() & y.notna()
            if usable.sum() < 2:  # one algorithm has no ranking to compare: no row, rather than a NaN line
                continue
            rows.append({"scenario": group[0], "pairing": group[1], "metric": metric, "algorithms": int(usable.sum()),
                         "tau": kendall_tau_b(x.to_numpy(), y.to_numpy()),
                         "order_tuning": _order(x[usable]), "order_evaluation": _order(y[usable])})
    return pd.DataFrame(rows, columns=[*GROUP, "metric", "algorithms", "tau", "order_tuning", "order_evaluation"])


def _order(scores: pd.Series) -> str:
    """'a > b > c', best first, by label on ties (within gtep/protocol/ties.py's tolerance) so the text is stable."""
    ranks = competition_ranks(scores.to_numpy(dtype=float))
    items = sorted(((float(rank), str(k[-1])) for k, rank in zip(scores.index, ranks)))
    return " > ".join(name for _, name in items)


def task_curves(data: StoreData, summary: pd.DataFrame) -> pd.DataFrame:
    """Acc_t per task, mean and std over the finished orderings of each evaluation-like phase and of H*'s orderings
    in the tuning phase (paper Figures 6a and 9a; the two side by side show the overestimation); a diverged ordering
    has no complete curve and is left out, as from the means."""
    rows = []
    curved = [TUNE.name, *(p.name for p in fixed_set_phases())]
    for _, phase in summary[summary["phase"].isin(curved)].iterrows():
        units = phase_orderings(data, data.phases[data.phases["run_id"] == phase["run_id"]].iloc[0])
        runs = units[units["status"] != "diverged"]["run_id"]
        steps = data.steps[data.steps["run_id"].isin(runs)]
        for t, values in steps.groupby("t")["acc"]:
            rows.append({**{k: phase[k] for k in (*GROUP, "label", "phase")}, "t": int(t), "mean": float(values.mean()),
                         "std": float(np.std(values.to_numpy(dtype=float))), "orderings": int(len(values))})
    return pd.DataFrame(rows, columns=[*GROUP, "label", "phase", "t", "mean", "std", "orderings"])


GACC_CURVE_COLUMNS = [*GROUP, "label", "phase", *GACC_COLUMNS[1:]]
FAMILY_CURVE_COLUMNS = [*GROUP, "label", "phase", "metric", "step", "value"]


def gacc_curves(data: StoreData, summary: pd.DataFrame) -> pd.DataFrame:
    """gAcc(alpha) of each FSCIL phase in the summary (the phase run's curve: the mean over its orderings), long:
    (scenario, pairing, label, phase, k, alpha, gacc), gacc a fraction; empty when no phase logged one."""
    if data.gacc.empty or summary.empty:
        return pd.DataFrame(columns=GACC_CURVE_COLUMNS)
    keys = summary[[*GROUP, "label", "phase", "run_id"]]
    frame = keys.merge(data.gacc, on="run_id", how="inner")
    return frame[GACC_CURVE_COLUMNS].sort_values([*GROUP, "label", "phase", "k"], kind="stable").reset_index(drop=True)


# stopped: ended early by the study's scheduler (search.scheduler), never H*
SET_STATES = ("complete", "incomplete", "diverged", "interrupted", "stopped")


def set_status(trials: pd.DataFrame) -> pd.Series:
    """complete | incomplete | diverged | interrupted | stopped per trial (a hyperparameter set): its gtep.status
    tag, or for a store older than the tag, diverged when an ordering diverged and complete when the trial run
    finished."""
    tag = trials["set_status"] if "set_status" in trials else pd.Series("", index=trials.index)
    derived = pd.Series(np.where(trials["diverged_orderings"].fillna(0) > 0, "diverged",
                                 np.where(trials["status"] == "FINISHED", "complete",
                                          np.where(trials["status"] == "KILLED", "interrupted", "incomplete"))),
                        index=trials.index)
    return tag.fillna("").where(tag.fillna("").isin(SET_STATES), derived)


def set_counts(data: StoreData, phases: pd.DataFrame) -> pd.DataFrame:
    """Per tuning phase (one algorithm of a scenario and pairing): how many sets are complete, incomplete (fewer
    than S orderings finished: not eligible for H*), diverged or interrupted."""
    rows = []
    for _, phase in phases[phases["phase"] == TUNE.name].iterrows():
        own = data.trials[data.trials["phase_run_id"] == phase["run_id"]]
        counts = set_status(own).value_counts()
        rows.append({**{k: phase[k] for k in (*GROUP, "label")}, **{s: int(counts.get(s, 0)) for s in SET_STATES}})
    return pd.DataFrame(rows, columns=[*GROUP, "label", *SET_STATES])


def groups(summary: pd.DataFrame) -> list[tuple[str, str]]:
    return [tuple(g) for g in summary[GROUP].drop_duplicates().itertuples(index=False)]


def family_curves(data: StoreData, summary: pd.DataFrame) -> pd.DataFrame:
    """The reported phases' family curves (pw-JS after each task, rolling accuracy, ...), long: (scenario, pairing,
    label, phase, metric, step, value); empty when no reported phase logged one."""
    if data.family_curves.empty or summary.empty:
        return pd.DataFrame(columns=FAMILY_CURVE_COLUMNS)
    keys = summary[[*GROUP, "label", "phase", "run_id"]]
    frame = keys.merge(data.family_curves, on="run_id", how="inner")
    return frame[FAMILY_CURVE_COLUMNS].sort_values([*GROUP, "label", "metric", "phase", "step"],
                                                   kind="stable").reset_index(drop=True)
