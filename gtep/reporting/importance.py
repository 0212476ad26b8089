"""What the tuning trials say about the search: hyperparameter importance and best-so-far convergence.

The paper draws R = 30 sets and reports that the best score converges within about 20 trials (section 4 and
appendix A); the best-so-far curve against the number of trials shows whether a study's R was enough. Importance
uses Optuna's evaluators on an in-memory study rebuilt from the trials, every hyperparameter a categorical over
the values its trials drew (the sets are the paper's predefined discrete sets, Tables 4 and 5).
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from gtep.orchestration.importance import FANOVA_SEED, fanova_importance

CONVERGENCE_MARK = 20  # the paper: the best hyperparameters are found within 20 of the 30 trials
FEW_TRIALS = 20  # fANOVA's forest on fewer scored sets than this is a rough indication only


def few_trials_warning(trials: int) -> str:
    """The note under an importance table or plot fitted on fewer than FEW_TRIALS scored sets ('' otherwise)."""
    if trials >= FEW_TRIALS:
        return ""
    return (f"fANOVA was fitted on {trials} scored trial{'s' if trials != 1 else ''} (fewer than {FEW_TRIALS}): "
            "the importances are a rough indication, not a finding")


def trial_scores(trials: pd.DataFrame, selection: str) -> pd.Series:
    """The selection score of each trial (indexed by trial run id): the harmonic mean of the orderings' mean Acc
    and AvgAcc (the paper's), or the mean of per-ordering harmonic means; NaN for a set with a diverged ordering
    and for one tagged incomplete, interrupted or stopped (fewer than S orderings: it cannot be H*)."""
    column = "mean_of_hmeans" if selection == "mean_of_hmeans" else "hmean"
    indexed = trials.set_index("run_id")
    scores = indexed[column].astype(float)
    if selection != "mean_of_hmeans" and "score" in indexed and "criterion" in indexed:
        # a scenario family's criterion (FSCIL: gAcc AUC) selected H*: its trials are ranked by it
        other = indexed["criterion"].fillna("hmean_acc_avgacc") != "hmean_acc_avgacc"
        scores = scores.where(~other, indexed["score"].astype(float))
    left_out = indexed["diverged_orderings"].fillna(0) > 0
    if "set_status" in indexed:
        left_out |= indexed["set_status"].isin(("diverged", "incomplete", "interrupted", "stopped"))
    return scores.where(~left_out)


def best_so_far(trials: pd.DataFrame, selection: str = "hmean_of_means") -> pd.DataFrame:
    """Best score after n trials, n = 1..R, trials taken in the order they were drawn (set index)."""
    ordered = trials.sort_values("set_index", kind="stable")
    scores = trial_scores(ordered, selection).reindex(ordered["run_id"]).to_numpy(dtype=float)
    best = np.fmax.accumulate(np.where(np.isnan(scores), -np.inf, scores)) if len(scores) else scores
    best = np.where(np.isinf(best), np.nan, best)
    return pd.DataFrame({"trial": np.arange(1, len(scores) + 1), "set_index": ordered["set_index"].to_numpy(),
                         "score": scores, "best_so_far": best})


def trials_to_best(curve: pd.DataFrame) -> float:
    """The number of trials after which the best-so-far score reached its final value (NaN if none is finite)."""
    values = curve["best_so_far"].to_numpy(dtype=float)
    if not len(values) or np.all(np.isnan(values)):
        return math.nan
    final = np.nanmax(values)
    return float(curve["trial"].to_numpy()[np.argmax(values >= final)])


def hyperparameter_importance(trials: pd.DataFrame, hparams: pd.DataFrame, selection: str = "hmean_of_means",
                              seed: int = FANOVA_SEED) -> pd.DataFrame:
    """Optuna's fANOVA importance (gtep/orchestration/importance.py) of each hyperparameter that varied, for the
    selection score, normalised to sum to 1, fitted on the trials in their sets' order. Diverged sets are left out.
    Empty when fewer than two sets scored or the scores do not vary (nothing to attribute)."""
    scores = trial_scores(trials, selection).dropna()
    if {"run_id", "set_index"} <= set(trials.columns):  # fANOVA is seeded but depends on the trials' order: the
        # sets' order, not the store's (a resumed study's trial runs come back in another order)
        position = pd.to_numeric(trials.drop_duplicates("run_id").set_index("run_id")["set_index"], errors="coerce")
        scores = scores.loc[sorted(scores.index, key=lambda run: (position.get(run, np.inf), str(run)))]
    params: dict[str, dict[str, str]] = {}
    for run, name, value in hparams[["trial_run_id", "name", "value"]].itertuples(index=False):
        params.setdefault(run, {})[str(name)] = str(value)
    found = fanova_importance([(params.get(run, {}), float(score)) for run, score in scores.items()], seed)
    return pd.DataFrame({"hyperparameter": list(found), "importance": list(found.values())},
                        columns=["hyperparameter", "importance"])
