"""Which hyperparameters mattered in a tuning phase: Optuna's fANOVA (Hutter et al. 2014) over its scored sets.

The one fit both sides use: a tuning phase fits it when it ends (gtep/orchestration/phases.py, logged on the phase
run as the gtep.importance tag, so that a report over a paper-scale matrix reads 120 small tags instead of fitting
120 forests), and a report fits it itself for a phase run that has no such tag (gtep/reporting/importance.py).
It lives here, not in the protocol core, which stays free of frameworks (Optuna).
Every hyperparameter is a categorical over the values its sets drew, as MLflow stores them (strings): the sets are
the paper's predefined discrete sets (Tables 4 and 5), and both sides then encode the same values the same way.
"""
from __future__ import annotations

import json
import math
import warnings
from typing import Any, Mapping, Sequence

IMPORTANCE_TAG = "gtep.importance"
FANOVA_SEED = 0


def fanova_importance(points: Sequence[tuple[Mapping[str, str], float]], seed: int = FANOVA_SEED
                      ) -> dict[str, float]:
    """fANOVA importance of each hyperparameter that varied among the scored sets, normalised to sum to 1, for
    `points`: (a set's hyperparameters as strings, its selection score), in the sets' order (the forest is seeded
    but depends on the order). A NaN score (a diverged, incomplete or stopped set) is left out. Empty when fewer
    than two sets scored or their scores or hyperparameters do not vary (nothing to attribute)."""
    scored = [(dict(params), float(score)) for params, score in points if not math.isnan(float(score))]
    names = sorted({name for params, _ in scored for name in params})
    varying = [name for name in names if all(name in params for params, _ in scored)
               and len({params[name] for params, _ in scored}) > 1]
    values = [score for _, score in scored]
    if len(scored) < 2 or not varying or max(values) == min(values):
        return {}
    import optuna
    from optuna.distributions import BaseDistribution, CategoricalDistribution
    from optuna.importance import FanovaImportanceEvaluator, get_param_importances

    distributions: dict[str, BaseDistribution] = {
        name: CategoricalDistribution(sorted({params[name] for params, _ in scored})) for name in varying}
    frozen = [optuna.trial.create_trial(params={name: params[name] for name in varying},
                                        distributions=distributions, value=score) for params, score in scored]
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="maximize")
    study.add_trials(frozen)
    with warnings.catch_warnings():  # few trials make fANOVA's forest warn; the numbers are still what it found
        warnings.simplefilter("ignore")
        found = get_param_importances(study, evaluator=FanovaImportanceEvaluator(seed=seed), normalize=True)
    return {name: float(value) for name, value in found.items()}


def importance_tag(importance: Mapping[str, float], selection: str, scored: int) -> str:
    """The gtep.importance tag's value: the fit, the selection rule it scored by and how many sets it saw (a
    report uses the tag only when it reads as many scored sets under the same rule)."""
    return json.dumps({"selection": selection, "scored": scored,
                       "importance": {name: round(value, 12) for name, value in importance.items()}},
                      sort_keys=True)


def read_importance_tag(text: str) -> dict[str, Any] | None:
    """The tag parsed, or None when it is absent or not what importance_tag() writes (then a report fits)."""
    try:
        data = json.loads(text) if text else None
    except ValueError:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("importance"), dict):
        return None
    if not isinstance(data.get("scored"), int) or not isinstance(data.get("selection"), str):
        return None
    try:
        data["importance"] = {str(k): float(v) for k, v in data["importance"].items()}
    except (TypeError, ValueError):
        return None
    return data
