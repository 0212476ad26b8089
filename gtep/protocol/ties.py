"""When two scores are the same score: one tolerance for every place gtep ranks sets or algorithms (issue 68).

A set's score is a mean over orderings (and a harmonic mean of means), so two sets whose scores are mathematically
equal (a shared first task, the same accuracies in another order) can differ in the last bits, by summation order
alone: np.mean([0.1, 0.2, 0.3]) is 0.20000000000000004 and np.mean([0.3, 0.2, 0.1]) is 0.19999999999999998. Compared
exactly, such a pair is decided by float rounding, which depends on the order results arrived, on numpy's summation
(pairwise past 8 values, SIMD width) and so on the machine: a stored Kendall tau (atlas-iirc-iirc_finetune: 0.467)
that an independent recomputation gives as 0.414. Every ranking (H*, Kendall's tau, Spearman's rho, H*'s rank on
D^E, the reports' ranks and orders) therefore treats scores within this tolerance as tied, and then applies its
stated tie rule (H*: the lowest set index).

The tolerance, as math.isclose's: |a - b| <= max(SCORE_REL_TOL * max(|a|, |b|), SCORE_ABS_TOL).

- SCORE_REL_TOL = 2^-22 (about 2.4e-7): twice the largest disagreement that rounding can put between two equal
  scores. Each accuracy-matrix entry is a float32 quotient (gtep/engine/runner.py: correct / count, both exact
  integers in float32), so it is within 2^-24 (6e-8) of its exact value, relatively; Acc_t, AvgAcc, their means over
  orderings and their harmonic mean are means of non-negative values or a harmonic mean of them, which keep that
  relative bound, so two mathematically equal scores differ by at most 2 * 2^-24 (1.2e-7) relatively, and float64
  summation order adds only ~1e-16. The stored atlas shows both: equal scores apart by 1.9e-16 (summation order) and
  by 7e-10 to 2.7e-8 (float32 quotients), while its closest scores that really differ are 2.5e-5 apart. A real
  difference is one test image more or less: in the last of T tasks of one of S orderings it moves AvgAcc by
  1 / (N * T * S) for N test images in all, about 5e-7 relatively for ImageNet-1k's 50,000 at T = 10, S = 5 (2e-6 for
  CIFAR-100's 10,000), still above the tolerance. 1e-9 would not do: it leaves ties of float32 quotients decided by
  their rounding.
- SCORE_ABS_TOL = 1e-12. Near 0 a relative tolerance means nothing (0 against 1e-17 from a cancellation would
  never tie); scores are fractions in [0, 1] or criteria of that size, so 1e-12 is below any difference that could
  be meant and above the rounding of values of that size.

Closeness is not transitive (a ~ b and b ~ c do not make a ~ c), so a ranking groups scores first: sorted from the
highest, a score joins the current group when it is within tolerance of the group's first (highest) score, and
starts a new group otherwise. The top group is then exactly the scores within tolerance of the best one, which is
what H* selection needs, and every ranking below (tau, rho, ranks) uses the same groups, so all of them agree.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

SCORE_REL_TOL = 2.0 ** -22  # 2.4e-7: twice the 1.2e-7 two float32 quotients of one number can disagree by
SCORE_ABS_TOL = 1e-12


def same_score(a: float, b: float) -> bool:
    """Whether two scores are tied: equal within SCORE_REL_TOL / SCORE_ABS_TOL (NaN ties with nothing)."""
    return math.isclose(a, b, rel_tol=SCORE_REL_TOL, abs_tol=SCORE_ABS_TOL)


def tie_levels(values: Sequence[float]) -> np.ndarray:
    """Each value's group, 0 for the highest group, 1 for the next...; NaN stays NaN (it is in no group). Values in
    one group are tied; a higher level is a strictly lower score."""
    a = np.asarray(values, dtype=float)
    levels = np.full(a.shape, np.nan)
    finite = np.flatnonzero(~np.isnan(a))
    order = finite[np.argsort(-a[finite], kind="stable")]
    level, anchor = -1, math.nan
    for i in order:
        if level < 0 or not same_score(float(a[i]), anchor):
            level, anchor = level + 1, float(a[i])
        levels[i] = level
    return levels


def top_group(scores: dict[int, float]) -> list[int]:
    """The keys whose score is tied with the best one (the top group), in ascending key order; [] if none scored."""
    keys = sorted(scores)
    levels = tie_levels([scores[k] for k in keys])
    return [k for k, level in zip(keys, levels) if level == 0]


def competition_ranks(values: Sequence[float]) -> np.ndarray:
    """Ranks from 1 (the best, highest score), tied values sharing the best rank of their group ('1, 1, 3': pandas'
    rank(ascending=False, method='min') with ties within tolerance); NaN for NaN."""
    levels = tie_levels(values)
    ranks = np.full(levels.shape, np.nan)
    for i, level in enumerate(levels):
        if not math.isnan(level):
            ranks[i] = 1 + int(np.sum(levels < level))
    return ranks


def average_ranks(values: Sequence[float]) -> np.ndarray:
    """Ranks from 1 (the lowest score), tied values sharing their group's mean rank (as Spearman's rho needs);
    NaN for NaN."""
    levels = tie_levels(values)
    ranks = np.full(levels.shape, np.nan)
    for i, level in enumerate(levels):
        if not math.isnan(level):
            below = int(np.sum(levels > level))  # the values in lower-scoring groups
            ranks[i] = below + (int(np.sum(levels == level)) + 1) / 2
    return ranks
