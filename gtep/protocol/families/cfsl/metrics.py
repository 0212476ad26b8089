"""CFSL's metrics (papers/cfsl-task-definitions.txt section 3, notes 002.2). Pure: numpy only.

Per task:
    target_acc   accuracy on the target set, scored once, after the last support set
    target_ce    mean cross-entropy (nats) of the target set's labels under the learner's scores
    atm          across-task memory, size-weighted (notes 002.2, [inferred]; the paper's Eq. 1 with its precision
                 rule): the most bytes of support-set state the learner held at any point of the task (after any
                 support set) / the bytes of every support input it saw, in the unit it received them (float32
                 tensors), so both sides are measured alike: storing every support image as received gives 1 (the
                 paper's anchor, rule 5), storing it as uint8 0.25 (lower precision compresses, as the paper says),
                 a float32 64-d prototype per 5 images of 3x32x32 64/15360 ...
    atm_count    across-task memory as Eq. 1 counts it: |M_x^| / |G_x|, the most stored representation vectors at any
                 point of the task (embeddings, fast-weight rows) / the support samples seen, whatever each vector's
                 size and precision: storing every support image gives 1, one prototype per class
                 (#classes / #support samples, notes 002.3)
    macs         the learner's multiply-adds in the task, learning and predicting (FLOPs / 2, torch's counter)

Per ordering (GTEP's unit: tasks_per_ordering tasks): the mean over its tasks of each, with the std over tasks
(target_acc_task_std, target_ce_task_std) and the half-width of a 95% interval (normal: 1.96 std / sqrt(tasks);
target_acc_ci95, target_ce_ci95) of target accuracy and cross-entropy.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

# <name>_task_std: the std over an ordering's tasks (<name>_std is what tracking calls the std over orderings)
METRIC_NAMES = ("target_acc", "target_acc_task_std", "target_acc_ci95", "target_ce", "target_ce_task_std",
                "target_ce_ci95", "atm", "atm_count", "macs")
CURVE_METRICS = ("target_acc_t",)
DEFAULT_CRITERION_METRIC = "mean_target_acc"
Z95 = 1.959963984540054


def accuracy(scores: np.ndarray, labels: np.ndarray) -> float:
    """Share of rows whose highest score is the label (the first highest on ties, as argmax)."""
    return float(np.mean(np.argmax(scores, axis=1) == labels))


def cross_entropy(scores: np.ndarray, labels: np.ndarray) -> float:
    """Mean -log softmax(scores)[label], computed stably (log-sum-exp)."""
    scores = np.asarray(scores, dtype=np.float64)
    top = scores.max(axis=1, keepdims=True)
    log_norm = top[:, 0] + np.log(np.exp(scores - top).sum(axis=1))
    return float(np.mean(log_norm - scores[np.arange(len(labels)), labels]))


def across_task_memory(held: Sequence[int], seen: int) -> float:
    """ATM = max_t held_t / seen (papers/cfsl-task-definitions.txt Eq. 1): `held` after every support set and
    `seen` over all of them in one unit, bytes for `atm` (notes 002.2's size-weighted reading) or vectors and
    samples for `atm_count` (the equation as written)."""
    if seen <= 0:
        raise ValueError("no support input was seen; ATM is undefined")
    return max(held, default=0) / seen


def mean_std_ci(values: Sequence[float]) -> tuple[float, float, float]:
    """Mean, population std and the half-width of the normal 95% interval of the mean."""
    a = np.asarray(values, dtype=np.float64)
    if a.size == 0:
        return math.nan, math.nan, math.nan
    std = float(a.std())
    return float(a.mean()), std, Z95 * std / math.sqrt(a.size)


def summarize(accuracies: Sequence[float], cross_entropies: Sequence[float], atms: Sequence[float],
              atm_counts: Sequence[float], macs: Sequence[float]) -> dict[str, float | list[float]]:
    """One ordering's metrics from its tasks' values (module docstring)."""
    acc, acc_std, acc_ci = mean_std_ci(accuracies)
    ce, ce_std, ce_ci = mean_std_ci(cross_entropies)
    return {"target_acc": acc, "target_acc_task_std": acc_std, "target_acc_ci95": acc_ci, "target_ce": ce,
            "target_ce_task_std": ce_std, "target_ce_ci95": ce_ci, "atm": float(np.mean(atms)),
            "atm_count": float(np.mean(atm_counts)), "macs": float(np.mean(macs)),
            "target_acc_t": [float(v) for v in accuracies]}
