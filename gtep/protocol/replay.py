"""Replay a finished study's tuning results under a cheaper protocol, training nothing (gtep replay).

The recorded units (one per (set, ordering): its accuracy matrix, per-task seconds and metrics) are read
back and put through a decision rule:

- `asha`: Ray Tune's asynchronous successive halving (ASHAScheduler, one bracket, stop_last_trials) on the
  orderings axis, re-implemented over the recorded sequence of results. A set reports its running score
  (H*'s criterion over its first k orderings, 0 once one diverged) after each ordering; at a rung k (grace
  period x reduction_factor^i, below S) it is stopped when that score is below the (1 - 1/reduction_factor)
  quantile of the scores recorded at that rung so far. ASSUMED ORDER: results arrive in the order the full
  study finished them (`finished_at`, then set index and ordering); a live run with a scheduler frees its
  slots sooner, so its order (and so its decisions) can differ. A stopped set's later orderings count as not
  trained, and the set is never H*.
- `first_task` (Lee et al. 2024): each set is compared on the first k tasks of every ordering (its accuracy
  matrix cut to k rows and columns, the metrics recomputed); its cost is those tasks' seconds. H* then runs the
  whole scenario in evaluation, as with gtep.
- `none`: the full study's rule; it reproduces the study's H*.
- a stop rule (`stopped_by`): any rule that decides from each set's running score after each ordering, in the
  same arrival order; `gtep replay --pruner NAME` passes Optuna's pruner this way (gtep/orchestration/pruning.py).

A study folder is read by gtep/orchestration/replay.py (the protocol layer stays pure).

Cost is training seconds (a unit's task_seconds; train_seconds is their sum), relative to the full study's; a
first task reused from the study's store counts once, where it was trained (spent_seconds).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import numpy as np

from gtep.protocol.criteria import DEFAULT_CRITERION, Criterion
from gtep.protocol.metrics import summarize
from gtep.protocol.selection import NoEligibleSetError, OrderingResult, SelectionRule, score_set, select_best

REPLAY_RULES = ("none", "asha", "first_task")


@dataclass(frozen=True)
class ReplayOutcome:
    rule: str
    best_index: int | None  # None: no set would have been eligible
    seconds: float  # training seconds the rule would have spent
    full_seconds: float  # what the full study spent
    stopped: tuple[int, ...] = ()
    scores: dict[int, float] = field(default_factory=dict)  # each set's score under the rule (NaN: not eligible)

    @property
    def fraction(self) -> float:
        return self.seconds / self.full_seconds if self.full_seconds > 0 else float("nan")


def spent_seconds(units: list[dict[str, Any]]) -> float:
    """Training seconds of a group of units. A unit that reused its ordering's stored first task (`first_task`
    "reused") carries that task's seconds without having spent them, so task 1 counts only for the units that
    trained it, and once for an ordering whose units in the group all reused a first task trained by a unit
    outside it (a replay that skips the unit that trained it would have trained it elsewhere). A unit file
    shared by several units (the same values suggested twice) counts once."""
    total = 0.0
    orphans: dict[int, float] = {}
    trained_orderings = set()
    files: set[str] = set()
    for u in units:
        if u.get("unit_file"):  # two sets with the same values (an adaptive searcher's repeat) share one unit
            if u["unit_file"] in files:
                continue
            files.add(str(u["unit_file"]))
        per_task = list(u.get("task_seconds") or [])
        if not per_task:
            total += float(u.get("train_seconds") or 0.0)
            continue
        total += float(sum(per_task[1:]))
        if u.get("first_task") == "reused":
            orphans[int(u["ordering"])] = max(orphans.get(int(u["ordering"]), 0.0), float(per_task[0]))
        else:
            total += float(per_task[0])
            trained_orderings.add(int(u["ordering"]))
    return total + sum(t for s, t in orphans.items() if s not in trained_orderings)


def as_result(unit: dict[str, Any]) -> OrderingResult:
    scalars = {k: float(v) for k, v in unit.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    return OrderingResult(int(unit["set_index"]), int(unit["ordering"]), float(unit.get("acc") or 0.0),
                          float(unit.get("avg_acc") or 0.0), unit.get("status") == "diverged", scalars)


def arrival_order(units: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The order results reached the scheduler in the full study: when each unit finished."""
    return sorted(units, key=lambda u: (u.get("finished_at") or 0, int(u["set_index"]), int(u["ordering"])))


def running_score(done: list[dict[str, Any]], criterion: Criterion) -> float:
    """What a trial reports as `score` after its orderings so far (gtep/orchestration/trainable.py)."""
    if any(u.get("status") == "diverged" for u in done):
        return 0.0
    means = [float(np.mean([float(u.get(name, math.nan)) for u in done])) for name in criterion.components]
    return criterion.combine(means)


def asha_rungs(orderings: int, grace_period: int, reduction_factor: float) -> list[float]:
    """The rung milestones of Ray's single ASHA bracket, highest first (max_t = S)."""
    count = int(np.log(orderings / grace_period) / np.log(reduction_factor) + 1)
    return [grace_period * reduction_factor ** k for k in reversed(range(count))]


StopRule = Callable[[int, int, float], bool]  # (set index, orderings done, running score) -> stop the set now


def asha_rule(orderings: int, grace_period: int = 1, reduction_factor: float = 2.0) -> StopRule:
    """Ray's single ASHA bracket (_Bracket.on_result) as a stop rule: at the first rung a set reaches, it is
    stopped when its score is below the (1 - 1/reduction_factor) quantile of the scores recorded there so far."""
    rungs: list[tuple[float, dict[int, float]]] = [(m, {}) for m in asha_rungs(orderings, grace_period,
                                                                                 reduction_factor)]

    def should_stop(i: int, k: int, score: float) -> bool:
        if k >= orderings:
            return False  # the set is complete; Ray stops it anyway (stop_last_trials)
        for milestone, recorded in rungs:
            if k < milestone or i in recorded:
                continue
            values = [v for v in recorded.values() if not math.isnan(v)]
            cutoff = float(np.percentile(values, (1 - 1 / reduction_factor) * 100)) if values else None
            recorded[i] = score
            return cutoff is not None and score < cutoff
        return False
    return should_stop


def asha_stopped(units: list[dict[str, Any]], orderings: int, grace_period: int = 1, reduction_factor: float = 2.0,
                 criterion: Criterion = DEFAULT_CRITERION) -> tuple[set[int], list[dict[str, Any]]]:
    """(stopped sets, units that would have been trained) under ASHA, in arrival order."""
    return stopped_by(units, orderings, asha_rule(orderings, grace_period, reduction_factor), criterion)


def stopped_by(units: list[dict[str, Any]], orderings: int, should_stop: StopRule,
               criterion: Criterion = DEFAULT_CRITERION) -> tuple[set[int], list[dict[str, Any]]]:
    """(stopped sets, units that would have been trained) under any rule that sees each set's running score after
    each of its orderings, in arrival order (an Optuna pruner: gtep/orchestration/pruning.py). The rule also sees
    the S-th result of a set, so it can record the set as finished; that result never stops it."""
    done: dict[int, list[dict[str, Any]]] = {}
    stopped: set[int] = set()
    trained = []
    for unit in arrival_order(units):
        i = int(unit["set_index"])
        if i in stopped:
            continue
        trained.append(unit)
        so_far = done.setdefault(i, [])
        so_far.append(unit)
        if should_stop(i, len(so_far), running_score(so_far, criterion)) and len(so_far) < orderings:
            stopped.add(i)
    return stopped, trained


def first_task_unit(unit: dict[str, Any], tasks: int) -> dict[str, Any]:
    """A unit as if its ordering had stopped after `tasks` tasks: the metrics of its matrix's first rows."""
    matrix = unit.get("acc_matrix")
    if unit.get("status") == "diverged" or not matrix:
        return {**unit, "task_seconds": list(unit.get("task_seconds") or [])[:tasks]}
    cut = np.array([[math.nan if v is None else v for v in row[:tasks]] for row in matrix[:tasks]], dtype=float)
    metrics = summarize(cut, list(unit["test_counts"])[:tasks])
    scalars = {k: v for k, v in metrics.items() if not isinstance(v, list)}
    return {**{k: v for k, v in unit.items() if k not in ("forgetting", "old_acc", "new_acc")}, **scalars,
            "acc_matrix": cut.tolist(), "task_seconds": list(unit.get("task_seconds") or [])[:tasks]}


def replay(units: list[dict[str, Any]], orderings: int, sets: Iterable[int], rule: str = "none", *,
           criterion: Criterion = DEFAULT_CRITERION, selection: SelectionRule = "hmean_of_means",
           grace_period: int = 1, reduction_factor: float = 2.0, protocol_tasks: int = 1,
           stop_rule: StopRule | None = None) -> ReplayOutcome:
    """H* and the training seconds of `rule` (REPLAY_RULES) over a study's tuning units; with `stop_rule`
    (an Optuna pruner's decisions), the sets it stops under the name `rule`."""
    if rule not in REPLAY_RULES and stop_rule is None:
        raise ValueError(f"unknown replay rule {rule!r}; choose from {REPLAY_RULES}")
    sets = list(sets)
    full = spent_seconds(units)
    stopped: set[int] = set()
    trained = units
    seconds = full
    if stop_rule is not None:
        stopped, trained = stopped_by(units, orderings, stop_rule, criterion)
        seconds = spent_seconds(trained)
    elif rule == "asha":
        stopped, trained = asha_stopped(units, orderings, grace_period, reduction_factor, criterion)
        seconds = spent_seconds(trained)
    elif rule == "first_task":
        trained = [first_task_unit(u, protocol_tasks) for u in units]
        seconds = spent_seconds(trained)
    results = [as_result(u) for u in trained]
    by_set = {i: score_set(i, [r for r in results if r.set_index == i], orderings, criterion, i in stopped)
              for i in sets}
    scores = {i: (s.score(selection) if s.usable else math.nan) for i, s in by_set.items()}
    try:
        best = select_best(results, selection, expected_orderings=orderings, sets=sets, criterion=criterion,
                           stopped=stopped).best_index
    except NoEligibleSetError:
        best = None
    return ReplayOutcome(rule, best, seconds, full, tuple(sorted(stopped)), scores)
