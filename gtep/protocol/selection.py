"""Choosing H* from (set, ordering) results (GTEP paper, Algorithm 1 line 2 and section 4.1).

Default rule ("hmean_of_means"): average Acc and AvgAcc over the S orderings of a set, then take their
harmonic mean; H* is the set with the highest score. The mean of per-ordering harmonic means
("mean_of_hmeans") is computed beside it and can be selected instead. Ties go to the lower set index, so
selection is deterministic. Scores within gtep/protocol/ties.py's tolerance (relative 2^-22 ~ 2.4e-7, absolute
1e-12) are ties: two sets whose scores are mathematically equal but differ in the last bits (float32 accuracies, a
mean's summation order) get the same H* on every machine. Another criterion (gtep/protocol/criteria.py: a
scenario family's, or search.criterion) replaces the harmonic mean of Acc and AvgAcc in both rules; the fields
keep the rules' names.

Only a complete set is eligible: one whose S orderings all finished. A set with a diverged ordering is
excluded (shown as NaN), as the paper does for BEEF; so is an incomplete set (an ordering missing because
its trial ran out of retries or the study was interrupted), whatever its finished orderings scored: a mean
over fewer orderings is a different, noisier statistic and must not compete with complete ones. A set that
an early-stopping scheduler (search.scheduler: asha, hyperband) stopped is incomplete for the same reason; its
status reads "stopped".
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterable, Literal, Mapping

import numpy as np

from gtep.protocol.criteria import DEFAULT_CRITERION, Criterion
from gtep.protocol.ties import top_group

SelectionRule = Literal["hmean_of_means", "mean_of_hmeans"]


@dataclass(frozen=True)
class OrderingResult:
    """The outcome of training one hyperparameter set on one class ordering."""

    set_index: int
    ordering: int
    acc: float
    avg_acc: float
    diverged: bool = False
    metrics: Mapping[str, float] = field(default_factory=dict)  # the family's scalar metrics, fractions

    def value(self, name: str) -> float:
        if name in ("acc", "avg_acc") and name not in self.metrics:
            return self.acc if name == "acc" else self.avg_acc
        return float(self.metrics.get(name, float("nan")))


SetStatus = Literal["complete", "diverged", "incomplete", "stopped"]


@dataclass(frozen=True)
class SetScore:
    set_index: int
    orderings: int  # orderings with a result (finished or diverged)
    diverged_orderings: int
    acc_mean: float
    acc_std: float
    avg_acc_mean: float
    avg_acc_std: float
    hmean_of_means: float  # the criterion of the components' means (the HM of mean Acc and AvgAcc by default)
    mean_of_hmeans: float  # the mean of the orderings' criterion values
    expected_orderings: int | None = None  # S; None: whatever the set has is all there is
    criterion: str = DEFAULT_CRITERION.name
    stopped: bool = False  # stopped early by the study's scheduler (never H*, whatever it had scored)

    @property
    def finished_orderings(self) -> int:
        return self.orderings - self.diverged_orderings

    @property
    def status(self) -> SetStatus:
        if self.diverged_orderings:
            return "diverged"
        if self.orderings == 0 or (self.expected_orderings is not None and self.orderings < self.expected_orderings):
            return "stopped" if self.stopped else "incomplete"
        return "complete"

    @property
    def usable(self) -> bool:
        """Eligible for H*: every one of its S orderings finished."""
        return self.status == "complete"

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


class NoEligibleSetError(RuntimeError):
    """No set finished all S orderings: there is no H* to carry to the evaluation phase."""


AllSetsDivergedError = NoEligibleSetError  # the name it had when divergence was the only way to be ineligible


def _mean_std(values: list[float]) -> tuple[float, float]:
    if not values:
        return float("nan"), float("nan")
    return float(np.mean(values)), float(np.std(values))


def score_set(set_index: int, results: list[OrderingResult], expected_orderings: int | None = None,
              criterion: Criterion = DEFAULT_CRITERION, stopped: bool = False) -> SetScore:
    """Aggregate one set over its orderings; a diverged ordering makes every mean NaN. `expected_orderings` (S)
    marks a set with fewer results as incomplete; its means describe only what finished."""
    diverged = sum(r.diverged for r in results)
    finite = [r for r in results if not r.diverged]
    acc_mean, acc_std = _mean_std([r.acc for r in finite])
    avg_mean, avg_std = _mean_std([r.avg_acc for r in finite])
    component_means = [_mean_std([r.value(name) for r in finite])[0] for name in criterion.components]
    if diverged:
        acc_mean = avg_mean = float("nan")
        component_means = [float("nan")] * len(component_means)
    per_ordering_hm = [criterion.combine([r.value(name) for name in criterion.components]) for r in finite]
    return SetScore(
        set_index=set_index,
        orderings=len(results),
        diverged_orderings=diverged,
        acc_mean=acc_mean,
        acc_std=acc_std,
        avg_acc_mean=avg_mean,
        avg_acc_std=avg_std,
        hmean_of_means=criterion.combine(component_means),
        mean_of_hmeans=float(np.mean(per_ordering_hm)) if per_ordering_hm and not diverged else float("nan"),
        expected_orderings=expected_orderings,
        criterion=criterion.name,
        stopped=stopped,
    )


def score_sets(results: Iterable[OrderingResult], expected_orderings: int | None = None,
               sets: Iterable[int] = (), criterion: Criterion = DEFAULT_CRITERION,
               stopped: Iterable[int] = ()) -> list[SetScore]:
    """One score per set that has results, and per index in `sets` (the R sampled sets) that has none;
    `stopped`: the sets a scheduler stopped early."""
    halted = {int(i) for i in stopped}
    by_set: dict[int, list[OrderingResult]] = {int(i): [] for i in sets}
    for result in results:
        by_set.setdefault(result.set_index, []).append(result)
    return [score_set(i, sorted(rs, key=lambda r: r.ordering), expected_orderings, criterion, i in halted)
            for i, rs in sorted(by_set.items())]


def select_best(results: Iterable[OrderingResult], rule: SelectionRule = "hmean_of_means",
                expected_orderings: int | None = None, sets: Iterable[int] = (),
                criterion: Criterion = DEFAULT_CRITERION, stopped: Iterable[int] = ()) -> SelectionResult:
    """H* = argmax over complete sets of the rule's score under `criterion`, the lowest set index among scores tied
    within tolerance (gtep/protocol/ties.py); NoEligibleSetError if there is none.

    `expected_orderings` is S: a set with fewer results is incomplete and never wins. `sets` names every
    sampled set, so that one whose trial never reported counts as incomplete too."""
    scores = score_sets(results, expected_orderings, sets, criterion, stopped)
    usable = [s for s in scores if s.usable and not math.isnan(s.score(rule))]
    if not usable:
        raise NoEligibleSetError(no_eligible_set_message(scores))
    # the tie rule (lowest set index) among the sets tied with the best score within tolerance, not only exactly:
    # an exact comparison would let float rounding of a mean decide between mathematically equal scores
    best = min(top_group({s.set_index: s.score(rule) for s in usable}))
    return SelectionResult(best_index=best, rule=rule, scores=scores)


def no_eligible_set_message(scores: list[SetScore]) -> str:
    diverged = sum(s.status == "diverged" for s in scores)
    incomplete = [s for s in scores if s.status in ("incomplete", "stopped")]
    if not incomplete:
        return (f"all {len(scores)} hyperparameter sets diverged (non-finite loss) on at least one ordering; "
                "narrow the search space (e.g. lower learning rates) or add trials")
    expected = incomplete[0].expected_orderings
    done = ", ".join(f"set {s.set_index}: {s.finished_orderings}/{expected}" for s in incomplete[:5])
    more = f" and {len(incomplete) - 5} more" if len(incomplete) > 5 else ""
    return (f"no hyperparameter set finished all {expected} orderings: {len(incomplete)} of {len(scores)} sets are "
            f"incomplete ({done}{more}) and {diverged} diverged; resume the study to finish the missing orderings "
            "(gtep tune --resume OUTPUT/STUDY), or add trials")
