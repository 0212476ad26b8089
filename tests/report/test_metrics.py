"""Kendall's tau-b and the overestimation gap (gtep.protocol.metrics) against hand computation."""
import math

import pytest

from gtep.protocol.metrics import harmonic_mean_gap, kendall_tau_b


def test_tau_identical_and_reversed_rankings():
    assert kendall_tau_b([0.1, 0.5, 0.9], [1, 2, 3]) == 1.0
    assert kendall_tau_b([0.1, 0.5, 0.9], [3, 2, 1]) == -1.0


def test_tau_one_swapped_pair():
    # tuning a > b > c, evaluation b > a > c: pairs (a,b) discordant, (a,c) and (b,c) concordant -> (2 - 1) / 3
    assert kendall_tau_b([3, 2, 1], [2, 3, 1]) == pytest.approx(1 / 3)


def test_tau_b_with_ties_by_hand():
    # x = [1, 1, 2, 3], y = [1, 2, 2, 3]; six pairs:
    # (0,1) tied in x, (0,2) +, (0,3) +, (1,2) tied in y, (1,3) +, (2,3) +  ->  n_c = 4, n_d = 0, n_0 = 6, n_x = n_y = 1
    assert kendall_tau_b([1, 1, 2, 3], [1, 2, 2, 3]) == pytest.approx(4 / math.sqrt(5 * 5))
    # one discordant pair among ties: x = [1, 2, 2], y = [2, 1, 3]: (0,1) -, (0,2) +, (1,2) tied in x
    assert kendall_tau_b([1, 2, 2], [2, 1, 3]) == pytest.approx(0 / math.sqrt(2 * 3))


def test_tau_drops_nan_pairs_and_needs_two_items():
    assert kendall_tau_b([1, float("nan"), 3, 2], [1, 5, 3, 2]) == 1.0
    assert math.isnan(kendall_tau_b([1.0], [2.0]))
    assert math.isnan(kendall_tau_b([1, 1, 1], [1, 2, 3]))  # a constant side has no ranking
    with pytest.raises(ValueError):
        kendall_tau_b([1, 2], [1, 2, 3])


def test_tau_matches_scipy_when_available():
    stats = pytest.importorskip("scipy.stats")
    x, y = [3, 1, 4, 1, 5, 9, 2, 6], [2, 7, 1, 8, 2, 8, 1, 8]
    assert kendall_tau_b(x, y) == pytest.approx(stats.kendalltau(x, y).statistic)


def test_gap_is_tuning_minus_evaluation_harmonic_mean():
    # tuning Acc 0.6, AvgAcc 0.8 -> HM 0.96 / 1.4; evaluation Acc 0.5, AvgAcc 0.5 -> HM 0.5
    assert harmonic_mean_gap((0.6, 0.8), (0.5, 0.5)) == pytest.approx(2 * 0.6 * 0.8 / 1.4 - 0.5)
    assert harmonic_mean_gap((0.5, 0.5), (0.6, 0.8)) < 0  # evaluation beat tuning: no overestimation
    assert math.isnan(harmonic_mean_gap((float("nan"), 0.8), (0.5, 0.5)))  # a diverged phase
