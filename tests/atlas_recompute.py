"""The protocol atlas's docs tables recomputed from the stored raw results alone (issue 60, item 1).

Deliberately independent of gtep: nothing here imports gtep (no replay, regret, selection or metrics code) or the
atlas's own derivation. It reads benchmarks/results/protocol_atlas/<study>.json's `raw` (every set's per-ordering
tuning and evaluation units, each tuning unit's task seconds, first-task status and arrival order) and recomputes,
from the definitions in docs/tuning-protocols.md:

- a set's tuning score: the criterion (harmonic mean of the components' means, or the one component's mean) over its
  S orderings, `hmean_of_means`; a set that diverged on any ordering, or has fewer than S, is not eligible; H*: the
  highest score, the lowest set index among tied ones; a pick is a tie when another eligible set's score is tied
  with it (no pick, except for the full study, whose pick is the study's own H*);
- two scores are tied when they agree within the docs' tolerance (math.isclose, relative 2^-22, absolute 1e-12): in
  every pick, rank and correlation below, so that float rounding (float32 accuracies, summation order) decides nothing;
- a set's evaluation score: the criterion of the components' means over its evaluation orderings (NaN: diverged,
  scoring 0 in a regret); regret: the best set's score minus the pick's;
- compute: training seconds (task 1 counted once per ordering where sets share it, a shared unit file once);
- ASHA (one bracket over the orderings, the units in arrival order), Optuna's pruners (Optuna itself, fed the same
  running scores in the same order), first_task (the accuracy matrix cut to k tasks, Acc and AvgAcc recomputed);
- Kendall's tau-b and Spearman's rho between the tuning and evaluation scores; the random floor;
- each protocol's least possible compute (equal-cost units arriving one set after another, scores falling;
  first_task's is what it spent: it stops nothing by score);

then each block's table cells as the docs print them.
"""
from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from statistics import median
from typing import Any, Callable

import numpy as np

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "protocol_atlas"
REL_TOL, ABS_TOL = 2.0 ** -22, 1e-12  # docs/concepts.md's tie tolerance, restated (this file imports no gtep)
WITHIN, MAX_COMPUTE = 0.01, 0.4
ASHA = ((1, 2.0), (1, 4.0))
PRUNERS = ("median", "successive_halving", "hyperband")
NAMES = {"gtep (full)": "full GTEP", "conventional": "conventional (tuned on D^E)", "random": "random choice"}


def stored(block: str) -> list[dict[str, Any]]:
    out = []
    for path in sorted(RESULTS.glob("*.json")):
        result = json.loads(path.read_text())
        if result.get("block") == block and "raw" in result:
            out.append(result)
    return out


def tied(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=REL_TOL, abs_tol=ABS_TOL)


def above(a: float, b: float) -> bool:
    """a scores higher than b, not tied with it."""
    return a > b and not tied(a, b)


def nan(value: Any) -> float:
    return math.nan if value is None else float(value)


def combine(raw: dict[str, Any], values: list[float]) -> float:
    if any(math.isnan(v) for v in values):
        return math.nan
    if raw["combine"] == "harmonic_mean":
        a, b = values
        return 0.0 if a + b == 0 else 2 * a * b / (a + b)
    return values[0]


# ---------------------------------------------------------------- a set's score, a pick, its cost

def set_score(raw: dict[str, Any], units: list[dict[str, Any]], orderings: int) -> float:
    """NaN when not eligible (diverged, or fewer than S orderings)."""
    if len(units) < orderings or any(u["status"] == "diverged" for u in units):
        return math.nan
    comps = raw["components"]
    if raw["selection"] == "hmean_of_means":
        return combine(raw, [float(np.mean([nan(u.get(c)) for u in units])) for c in comps])
    return float(np.mean([combine(raw, [nan(u.get(c)) for c in comps]) for u in units]))


def scores_of(raw: dict[str, Any], units: list[dict[str, Any]], stopped: set[int] = frozenset()) -> dict[int, float]:
    by_set: dict[int, list[dict[str, Any]]] = {int(i): [] for i in raw["sets"]}
    for u in units:
        by_set[int(u["set_index"])].append(u)
    return {i: (math.nan if i in stopped else set_score(raw, us, int(raw["orderings"]))) for i, us in by_set.items()}


def pick(scores: dict[int, float]) -> tuple[int | None, int]:
    """(the highest-scoring set, lowest index among equals; how many sets share its score)."""
    eligible = {i: s for i, s in scores.items() if not math.isnan(s)}
    if not eligible:
        return None, 0
    top = max(eligible.values())
    best = min(i for i, s in eligible.items() if tied(s, top))
    return best, sum(tied(s, eligible[best]) for s in eligible.values())


def seconds(units: list[dict[str, Any]]) -> float:
    total, orphans, trained, files = 0.0, {}, set(), set()
    for u in units:
        if u.get("unit_file"):
            if u["unit_file"] in files:
                continue
            files.add(u["unit_file"])
        per_task = list(u.get("task_seconds") or [])
        if not per_task:
            total += float(u.get("train_seconds") or 0.0)
            continue
        total += sum(per_task[1:])
        if u.get("first_task") == "reused":
            orphans[int(u["ordering"])] = max(orphans.get(int(u["ordering"]), 0.0), per_task[0])
        else:
            total += per_task[0]
            trained.add(int(u["ordering"]))
    return total + sum(t for o, t in orphans.items() if o not in trained)


# ---------------------------------------------------------------- the stopping rules, in arrival order

def running(raw: dict[str, Any], done: list[dict[str, Any]]) -> float:
    if any(u["status"] == "diverged" for u in done):
        return 0.0
    return combine(raw, [float(np.mean([nan(u.get(c)) for u in done])) for c in raw["components"]])


def asha(orderings: int, grace: int, factor: float) -> Callable[[int, int, float], bool]:
    count = int(np.log(orderings / grace) / np.log(factor) + 1)
    rungs = [(grace * factor ** k, {}) for k in reversed(range(count))]

    def stop(i: int, k: int, score: float) -> bool:
        if k >= orderings:
            return False
        for milestone, recorded in rungs:
            if k < milestone or i in recorded:
                continue
            values = [v for v in recorded.values() if not math.isnan(v)]
            cutoff = float(np.percentile(values, (1 - 1 / factor) * 100)) if values else None
            recorded[i] = score
            return cutoff is not None and score < cutoff
        return False
    return stop


def optuna_pruner(name: str, orderings: int) -> Callable[[int, int, float], bool]:
    """Optuna's pruner with the options the atlas's table uses (gtep's defaults: 2 startup trials, no warm-up,
    minimum resource 1, reduction factor 2), one Optuna trial per set, in a study named as gtep names its own
    (Optuna's Hyperband puts a trial in a bracket by a hash of the study's name)."""
    import optuna

    optuna.logging.set_verbosity(logging.WARNING)
    pruner = {"median": lambda: optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=0),
              "successive_halving": lambda: optuna.pruners.SuccessiveHalvingPruner(min_resource=1,
                                                                                   reduction_factor=2),
              "hyperband": lambda: optuna.pruners.HyperbandPruner(min_resource=1, max_resource=orderings,
                                                                  reduction_factor=2)}[name]()
    study = optuna.create_study(study_name="gtep-pruner-book", direction="maximize", pruner=pruner)
    trials: dict[int, Any] = {}
    pruned: set[int] = set()

    def stop(i: int, k: int, score: float) -> bool:
        if i in pruned:
            return True
        trial = trials.setdefault(i, study.ask()) if i not in trials else trials[i]
        trial.report(float(score), k)
        if k >= orderings:
            study.tell(trial, float(score), state=optuna.trial.TrialState.COMPLETE)
            return False
        if trial.should_prune():
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            pruned.add(i)
            return True
        return False
    return stop


def stopped_by(raw: dict[str, Any], units: list[dict[str, Any]], rule: Callable[[int, int, float], bool],
               order: str = "arrival") -> tuple[set[int], list[dict[str, Any]]]:
    orderings = int(raw["orderings"])
    done: dict[int, list[dict[str, Any]]] = {}
    stopped: set[int] = set()
    trained = []
    for u in sorted(units, key=lambda u: u[order]):
        i = int(u["set_index"])
        if i in stopped:
            continue
        trained.append(u)
        so_far = done.setdefault(i, [])
        so_far.append(u)
        if rule(i, len(so_far), running(raw, so_far)) and len(so_far) < orderings:
            stopped.add(i)
    return stopped, trained


def cut(unit: dict[str, Any], k: int) -> dict[str, Any]:
    """A tuning unit as if its ordering had stopped after k tasks."""
    out = {**unit, "task_seconds": list(unit.get("task_seconds") or [])[:k]}
    if unit["status"] == "diverged" or not unit.get("acc_matrix"):
        return out
    matrix = np.array([[nan(v) for v in row[:k]] for row in unit["acc_matrix"][:k]], dtype=float)
    counts = np.asarray(unit["test_counts"][:k], dtype=float)
    acc_t = [float(np.dot(matrix[t, :t + 1], counts[:t + 1]) / counts[:t + 1].sum()) for t in range(k)]
    out.update(acc=acc_t[-1], avg_acc=float(np.mean(acc_t)))
    out["hmean"] = combine({"combine": "harmonic_mean"}, [out["acc"], out["avg_acc"]])
    return out


# ---------------------------------------------------------------- one study's rows

def evaluation_scores(raw: dict[str, Any]) -> dict[int, float]:
    out = {}
    for i, record in raw["evaluation"].items():
        units = record["units"]
        if any(u["status"] == "diverged" for u in units):
            out[int(i)] = math.nan
            continue
        out[int(i)] = combine(raw, [float(np.mean([float(u[c]) for u in units if u.get(c) is not None]))
                                    for c in raw["components"]])
    return out


def regret(evaluation: dict[int, float], picked: int | None) -> float | None:
    if picked is None:
        return None
    best = max(0.0 if math.isnan(s) else s for s in evaluation.values())
    score = evaluation[picked]
    return best - (0.0 if math.isnan(score) else score)


def study_rows(result: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per protocol (named as the docs name them): fraction, regret (None: no pick), tie, least possible compute."""
    raw = result["raw"]
    units, orderings, sets = raw["tuning"], int(raw["orderings"]), [int(i) for i in raw["sets"]]
    evaluation = evaluation_scores(raw)
    full = seconds(units)
    rows: dict[str, dict[str, Any]] = {}

    def add(name: str, chosen: tuple[int | None, int], spent: float, least: float) -> None:
        picked, tied = chosen
        rows[name] = {"fraction": spent / full, "regret": None if tied > 1 else regret(evaluation, picked),
                      "tie": tied > 1, "least": least}

    rows["gtep (full)"] = {"fraction": 1.0, "regret": regret(evaluation, raw["best_index"]), "tie": False,
                           "least": 1.0}
    scored = {i: (0.0 if math.isnan(s) else s) for i, s in evaluation.items()}
    conventional = min(i for i in scored if tied(scored[i], max(scored.values())))
    rows["conventional"] = {"fraction": 1.0, "regret": regret(evaluation, conventional), "tie": False, "least": 1.0}
    falling = [{"set_index": i, "ordering": o, "status": "finished", "train_seconds": 1.0,
                "arrival": n * orderings + o, **{c: 1 - 0.01 * n for c in raw["components"]}}
               for n, i in enumerate(sets) for o in range(orderings)]
    rules: list[tuple[str, Callable[[], Callable[[int, int, float], bool]]]] = [
        (f"asha (grace {g}, reduction {f:g})", lambda g=g, f=f: asha(orderings, g, f))
        for g, f in ASHA if g < orderings]
    rules += [(f"optuna-{p} (defaults)", lambda p=p: optuna_pruner(p, orderings)) for p in PRUNERS]
    for name, make in rules:
        stopped, trained = stopped_by(raw, units, make())
        least = len(stopped_by(raw, falling, make())[1]) / len(falling)
        add(name, pick(scores_of(raw, trained, stopped)), seconds(trained), least)
    tasks = raw.get("tasks")
    for k in (1, 2, 3):
        if not tasks or k >= tasks:
            continue
        trained = [cut(u, k) for u in units]  # it stops nothing by score: its least is what it spent
        add(f"first_task (k={k})", pick(scores_of(raw, trained)), seconds(trained), seconds(trained) / full)
    best = max(scored.values())
    rows["random"] = {"fraction": 0.0, "regret": float(np.mean([best - s for s in scored.values()])), "tie": False,
                      "least": 0.0}
    return rows


def kendall_tau_b(x: list[float], y: list[float]) -> float:
    concordant = tied_x = tied_y = pairs = 0.0
    for a in range(len(x)):
        for b in range(a + 1, len(x)):
            dx = 0.0 if tied(x[a], x[b]) else np.sign(x[a] - x[b])
            dy = 0.0 if tied(y[a], y[b]) else np.sign(y[a] - y[b])
            pairs += 1
            tied_x += dx == 0
            tied_y += dy == 0
            concordant += dx * dy
    denominator = math.sqrt((pairs - tied_x) * (pairs - tied_y))
    return math.nan if len(x) < 2 or denominator == 0 else concordant / denominator


def average_ranks(values: list[float]) -> list[float]:
    return [sum(above(w, v) for v in values) + (sum(tied(v, w) for v in values) + 1) / 2 for w in values]


def spearman_rho(x: list[float], y: list[float]) -> float:
    if len(x) < 2:
        return math.nan
    rx, ry = np.array(average_ranks(x)), np.array(average_ranks(y))
    rx, ry = rx - rx.mean(), ry - ry.mean()
    denominator = math.sqrt(float(np.sum(rx * rx) * np.sum(ry * ry)))
    return math.nan if denominator == 0 else float(np.sum(rx * ry) / denominator)


def ranking(result: dict[str, Any]) -> dict[str, Any]:
    raw = result["raw"]
    tuning, evaluation = scores_of(raw, raw["tuning"]), evaluation_scores(raw)
    both = [i for i in sorted(evaluation) if not math.isnan(tuning.get(i, math.nan)) and not math.isnan(evaluation[i])]
    x, y = [tuning[i] for i in both], [evaluation[i] for i in both]
    best = raw["best_index"]
    rank = None
    if best is not None and not math.isnan(evaluation[best]):
        rank = 1 + sum(above(0.0 if math.isnan(s) else s, evaluation[best]) for s in evaluation.values())
    return {"tau": kendall_tau_b(x, y), "rho": spearman_rho(x, y), "rank": rank, "regret": regret(evaluation, best)}


# ---------------------------------------------------------------- the block's table as the docs print it

def table(results: list[dict[str, Any]]) -> dict[str, list[str]]:
    """Docs name -> its cells after the name: studies, ties, median regret, worst, within 1 point, median compute,
    least possible compute, within 1 point at <= 0.4 compute."""
    per: dict[str, list[tuple[dict[str, Any], float | None]]] = {}
    for result in results:
        rows = study_rows(result)
        full = rows["gtep (full)"]["regret"]
        for name, row in rows.items():
            per.setdefault(name, []).append((row, None if row["regret"] is None or full is None
                                             else row["regret"] - full))
    out = {}
    for name, values in per.items():
        n = len(values)
        regrets = [100 * row["regret"] for row, _ in values if row["regret"] is not None]
        within = [loss is not None and loss <= WITHIN + 1e-12 for _, loss in values]
        cheap = [w and row["fraction"] <= MAX_COMPUTE for w, (row, _) in zip(within, values)]
        out[NAMES.get(name, name)] = [
            str(n), str(sum(row["tie"] for row, _ in values)),
            f"{median(regrets):.2f}" if regrets else "-", f"{max(regrets):.2f}" if regrets else "-",
            f"{100 * sum(within) / n:.0f} %", f"{median(row['fraction'] for row, _ in values):.2f}",
            f"{min(row['least'] for row, _ in values):.2f}", f"{100 * sum(cheap) / n:.0f} %"]
    return out


def premise(results: list[dict[str, Any]]) -> dict[str, float] | None:
    ranked = [ranking(r) for r in results]
    ranked = [r for r in ranked if not math.isnan(r["tau"])]
    if not ranked:
        return None
    return {"tau": median(r["tau"] for r in ranked), "lowest": min(r["tau"] for r in ranked),
            "rho": median(r["rho"] for r in ranked),
            "best": 100 * sum(r["rank"] == 1 for r in ranked) / len(ranked),
            "rank": median(r["rank"] for r in ranked),
            "regret": 100 * median(r["regret"] or 0.0 for r in ranked), "studies": len(ranked)}
