"""Class-incremental metrics from the accuracy matrix (GTEP paper section 4.1; Masana et al. 2020).

The accuracy matrix A has one row per finished task t and one column per task j: A[t, j] is the accuracy
after training task t on the test images of task j's classes (NaN for j > t). With n_j test images per
task, Acc_t is the accuracy on all classes seen up to t, i.e. the n-weighted mean of row t.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from gtep.protocol.ties import tie_levels


def accuracy_after_each_task(matrix: np.ndarray, test_counts: Sequence[int]) -> list[float]:
    """Acc_t = correct predictions on all seen classes after task t / test images of those classes."""
    matrix = np.asarray(matrix, dtype=float)
    counts = np.asarray(test_counts, dtype=float)
    accs = []
    for t in range(matrix.shape[0]):
        seen = counts[: t + 1]
        accs.append(float(np.dot(matrix[t, : t + 1], seen) / seen.sum()))
    return accs


def final_accuracy(acc_t: Sequence[float]) -> float:
    """Acc: accuracy on all classes after the last task."""
    return float(acc_t[-1])


def average_accuracy(acc_t: Sequence[float]) -> float:
    """AvgAcc = (1/T) * sum_t Acc_t, Acc_t = accuracy on all classes seen up to task t."""
    return float(np.mean(acc_t))


def harmonic_mean(a: float, b: float) -> float:
    """2ab / (a + b): the paper's selection score for Acc and AvgAcc; 0 if both are 0, NaN if either is."""
    if math.isnan(a) or math.isnan(b):
        return float("nan")
    return 0.0 if a + b == 0 else 2 * a * b / (a + b)


def forgetting(matrix: np.ndarray) -> float:
    """Average forgetting (Chaudhry et al. 2018): mean over tasks j < T of max_{t<T} A[t, j] - A[T, j]."""
    matrix = np.asarray(matrix, dtype=float)
    last = matrix.shape[0] - 1
    if last == 0:
        return 0.0
    drops = [np.max(matrix[j:last, j]) - matrix[last, j] for j in range(last)]
    return float(np.mean(drops))


def old_new_accuracy(matrix: np.ndarray, test_counts: Sequence[int]) -> tuple[float, float]:
    """After the last task: accuracy on the classes of earlier tasks (old) and of the last task (new).
    Old is NaN for a one-task scenario."""
    matrix = np.asarray(matrix, dtype=float)
    counts = np.asarray(test_counts, dtype=float)
    last = matrix.shape[0] - 1
    new = float(matrix[last, last])
    if last == 0:
        return float("nan"), new
    old = float(np.dot(matrix[last, :last], counts[:last]) / counts[:last].sum())
    return old, new


def summarize(matrix: np.ndarray, test_counts: Sequence[int]) -> dict[str, float | list[float]]:
    """Every metric of one ordering run, ready to report."""
    acc_t = accuracy_after_each_task(matrix, test_counts)
    acc, avg = final_accuracy(acc_t), average_accuracy(acc_t)
    old, new = old_new_accuracy(matrix, test_counts)
    return {
        "acc_t": acc_t,
        "acc": acc,
        "avg_acc": avg,
        "hmean": harmonic_mean(acc, avg),
        "forgetting": forgetting(matrix),
        "old_acc": old,
        "new_acc": new,
    }


def harmonic_mean_gap(tuning: tuple[float, float], evaluation: tuple[float, float]) -> float:
    """Overestimation gap (paper section 3.1, Figures 4b and 7b): the tuning phase's harmonic mean of (Acc, AvgAcc)
    minus the evaluation phase's. Positive: the tuning scenario overstated what H* achieves on unseen data.
    Each pair holds the means over orderings; NaN when either phase diverged."""
    return harmonic_mean(*map(float, tuning)) - harmonic_mean(*map(float, evaluation))


def kendall_tau_b(x: Sequence[float], y: Sequence[float]) -> float:
    """Kendall's tau-b between two scorings of the same items (Kendall 1945), ties counted on either side:

        tau_b = (n_c - n_d) / sqrt((n_0 - n_x) * (n_0 - n_y)),  n_0 = n(n-1)/2,

    n_c / n_d: concordant / discordant pairs, n_x / n_y: pairs tied in x / in y, a tie being two scores within
    gtep/protocol/ties.py's tolerance (two means that differ by summation order only are tied, whatever the
    machine). The report uses it for the change of the algorithms' ranking between the tuning and the evaluation
    phase (paper Figure 4b: the order of publication in the tuning phase is not the order in the evaluation
    phase). Pairs with a NaN are dropped; NaN when fewer than two items remain or either side is constant."""
    a, b = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if a.shape != b.shape:
        raise ValueError(f"kendall_tau_b needs two equally long sequences, got {a.shape} and {b.shape}")
    keep = ~(np.isnan(a) | np.isnan(b))
    a, b = a[keep], b[keep]
    if a.size < 2:
        return float("nan")
    upper = np.triu_indices(a.size, k=1)  # every unordered pair once
    la, lb = tie_levels(a), tie_levels(b)  # compare tie groups, not raw floats: level 0 is the highest score
    da = np.sign(la[None, :] - la[:, None])[upper]
    db = np.sign(lb[None, :] - lb[:, None])[upper]
    n0 = da.size
    tied_x, tied_y = int(np.sum(da == 0)), int(np.sum(db == 0))
    denominator = math.sqrt((n0 - tied_x) * (n0 - tied_y))
    if denominator == 0:
        return float("nan")
    return float(np.sum(da * db) / denominator)
