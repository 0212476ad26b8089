"""Scores within the tie tolerance are ties wherever gtep ranks sets (issue 68, item 1): two sets whose means are
mathematically equal but were summed in another order get the H*, tau, rho, rank and pick of an exact tie, whichever
of them the rounding favours."""
from __future__ import annotations

import math

import numpy as np
import pytest

from gtep.protocol.metrics import kendall_tau_b
from gtep.protocol.regret import conventional_row, rank_sets, spearman_rho, tied_at_top
from gtep.protocol.selection import OrderingResult, select_best
from gtep.protocol.ties import (
    SCORE_ABS_TOL,
    SCORE_REL_TOL,
    average_ranks,
    competition_ranks,
    same_score,
    tie_levels,
    top_group,
)

FORWARD, BACKWARD = [0.1, 0.2, 0.3], [0.3, 0.2, 0.1]
# the same three numbers summed in two orders: 0.6000000000000001 and 0.6, means 0.20000000000000004 and 0.19999...8
UP, DOWN = float(np.mean(FORWARD)), float(np.mean(BACKWARD))


def test_the_two_orders_are_different_floats_and_one_score():
    assert sum(FORWARD) != sum(BACKWARD) and UP > DOWN  # what an exact comparison would rank
    assert same_score(UP, DOWN) and same_score(sum(FORWARD), sum(BACKWARD))
    assert not same_score(0.2, 0.2 + 1e-5)  # a real difference (a test image) is not a tie
    assert same_score(0.0, 1e-17) and not same_score(0.0, 1e-9)  # the absolute tolerance near 0
    assert not same_score(math.nan, math.nan)
    assert SCORE_REL_TOL == 2.0 ** -22 and SCORE_ABS_TOL == 1e-12


def results(first: list[float], second: list[float]) -> list[OrderingResult]:
    """Set 0 scores `first` over its three orderings, set 1 `second` (the same values, maybe in another order),
    set 2 clearly less: by the mean, sets 0 and 1 are mathematically tied."""
    out = []
    for i, values in enumerate((first, second, [0.05, 0.05, 0.05])):
        out += [OrderingResult(i, o, acc=v, avg_acc=v) for o, v in enumerate(values)]
    return out


@pytest.mark.parametrize("rule", ["hmean_of_means", "mean_of_hmeans"])
def test_h_star_is_the_exact_ties_lowest_index_whichever_set_the_summation_order_favours(rule):
    exact = select_best(results(FORWARD, FORWARD), rule, expected_orderings=3)
    assert exact.best_index == 0  # the stated tie rule: the lowest set index
    for first, second in ((FORWARD, BACKWARD), (BACKWARD, FORWARD)):
        picked = select_best(results(first, second), rule, expected_orderings=3)
        scores = [s.score(rule) for s in picked.scores]
        assert scores[0] != scores[1], "the two sets' scores differ as floats"
        assert picked.best_index == exact.best_index == 0, (first, second, scores)
    # a real difference still wins over the lower index
    assert select_best(results(FORWARD, [v + 1e-4 for v in FORWARD]), rule, expected_orderings=3).best_index == 1


@pytest.mark.parametrize("order", ["up-down", "down-up"])
def test_tau_rho_rank_and_picks_are_the_exact_ties_in_both_orders(order):
    a, b = (UP, DOWN) if order == "up-down" else (DOWN, UP)
    tuning = [a, b, 0.1, 0.3]
    exact = [UP, UP, 0.1, 0.3]
    evaluation = [0.5, 0.6, 0.2, 0.4]
    assert kendall_tau_b(tuning, evaluation) == kendall_tau_b(exact, evaluation)
    # 3 concordant pairs, 2 discordant, 1 tied in x
    assert kendall_tau_b(tuning, evaluation) == pytest.approx(1 / math.sqrt(5 * 6))
    assert spearman_rho(tuning, evaluation) == spearman_rho(exact, evaluation)
    # the other side's ties too: the evaluation scores 0 and 1 differ by summation order only
    assert kendall_tau_b(evaluation, tuning) == kendall_tau_b(evaluation, exact)
    assert kendall_tau_b([0.1, 0.3, 0.5], [a, b, 0.9]) == kendall_tau_b([0.1, 0.3, 0.5], [UP, UP, 0.9])
    # H*'s rank on D^E: a set tied with it does not rank above it
    ranking = rank_sets(dict(enumerate(exact)), {0: a, 1: b, 2: 0.1}, best_index=0)
    assert ranking.best_rank == 1 and ranking.regret == pytest.approx(0.0, abs=1e-15)
    # a protocol's pick: the tie names both sets; conventional (the set best on D^E) takes the lowest index
    assert tied_at_top({0: a, 1: b, 2: 0.1}, 0) == [0, 1]
    assert conventional_row({0: a, 1: b, 2: 0.1}).picked == 0
    assert top_group({3: b, 5: a, 1: 0.1}) == [3, 5]


def test_ranks_group_scores_within_tolerance_from_the_best_down():
    assert tie_levels([UP, 0.1, DOWN, math.nan]).tolist()[:3] == [0, 1, 0]
    assert competition_ranks([DOWN, 0.9, UP, 0.1]).tolist() == [2, 1, 2, 4]
    assert average_ranks([DOWN, 0.9, UP, 0.1]).tolist() == [2.5, 4, 2.5, 1]
    assert math.isnan(competition_ranks([math.nan, 0.5])[0])
    # a group spans at most the tolerance from its best score: a chain of near-ties does not merge without end
    step = 0.6 * SCORE_REL_TOL
    chain = [1.0, 1.0 - step, 1.0 - 2 * step]
    assert tie_levels(chain).tolist() == [0, 0, 1]
