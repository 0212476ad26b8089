"""Choosing H* from (set, ordering) results (GTEP paper, Algorithm 1 line 2 and section 4.1).

Default rule ("hmean_of_means"): average Acc and AvgAcc over the S orderings of a set, then take their
harmonic mean; H* is the set with the highest score. The mean of per-ordering harmonic means
("mean_of_hmeans") is computed beside it and can be selected instead. A set with a diverged ordering is
excluded (shown as NaN), as the paper does for BEEF. Ties go to the lower set index, so selection is
deterministic.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterable, Literal

import numpy as np

from gtep.protocol.metrics import harmonic_mean

SelectionRule = Literal["hmean_of_means", "mean_of_hmeans"]


@dataclass(frozen=True)
class OrderingResult:
    """The outcome of training one hyperparameter set on one class ordering."""

    set_index: int
    ordering: int
    acc: float
    avg_acc: float
    diverged: bool = False


@dataclass(frozen=True)
class SetScore:
    set_index: int
    orderings: int
    diverged_orderings: int
    acc_mean: float
    acc_std: float
    avg_acc_mean: float
    avg_acc_std: float
    hmean_of_means: float
    mean_of_hmeans: float

    @property
    def usable(self) -> bool:
        return self.diverged_orderings == 0 and self.orderings > 0

    def score(self, rule: SelectionRule) -> float:
        return self.hmean_of_means if rule == "hmean_of_means" else self.mean_of_hmeans


@dataclass(frozen=True)
class SelectionResult:
    best_index: int
    rule: SelectionRule
    scores: list[SetScore] = field(default_factory=list)

    @property
    def best(self) -> SetScore:
        return next(s for s in self.scores if s.set_index == self.best_index)


class AllSetsDivergedError(RuntimeError):
    """Every sampled set had a diverged ordering: there is no H* to carry to the evaluation phase."""


def _mean_std(values: list[float]) -> tuple[float, float]:
    if not values:
        return float("nan"), float("nan")
    return float(np.mean(values)), float(np.std(values))


def score_set(set_index: int, results: list[OrderingResult]) -> SetScore:
    """Aggregate one set over its orderings; a diverged ordering makes every mean NaN."""
    diverged = sum(r.diverged for r in results)
    finite = [r for r in results if not r.diverged]
    acc_mean, acc_std = _mean_std([r.acc for r in finite])
    avg_mean, avg_std = _mean_std([r.avg_acc for r in finite])
    if diverged:
        acc_mean = avg_mean = float("nan")
    per_ordering_hm = [harmonic_mean(r.acc, r.avg_acc) for r in finite]
    return SetScore(
        set_index=set_index,
        orderings=len(results),
        diverged_orderings=diverged,
        acc_mean=acc_mean,
        acc_std=acc_std,
        avg_acc_mean=avg_mean,
        avg_acc_std=avg_std,
        hmean_of_means=harmonic_mean(acc_mean, avg_mean),
        mean_of_hmeans=float(np.mean(per_ordering_hm)) if per_ordering_hm and not diverged else float("nan"),
    )


def score_sets(results: Iterable[OrderingResult]) -> list[SetScore]:
    by_set: dict[int, list[OrderingResult]] = {}
    for result in results:
        by_set.setdefault(result.set_index, []).append(result)
    return [score_set(i, sorted(rs, key=lambda r: r.ordering)) for i, rs in sorted(by_set.items())]


def select_best(results: Iterable[OrderingResult], rule: SelectionRule = "hmean_of_means") -> SelectionResult:
    """H* = argmax over usable sets of the rule's score; raises AllSetsDivergedError if none is usable."""
    scores = score_sets(results)
    usable = [s for s in scores if s.usable and not math.isnan(s.score(rule))]
    if not usable:
        raise AllSetsDivergedError(
            f"all {len(scores)} hyperparameter sets diverged (non-finite loss) on at least one ordering; "
            "narrow the search space (e.g. lower learning rates) or add trials"
        )
    best = max(usable, key=lambda s: (s.score(rule), -s.set_index))
    return SelectionResult(best_index=best.set_index, rule=rule, scores=scores)
