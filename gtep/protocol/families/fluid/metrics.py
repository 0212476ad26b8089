"""FLUID's metrics over a prediction log (papers/fluid.txt Table 1, Sec. 5, App. H; notes 004.2).

The log is prequential: every prediction p_t was made before y_t was revealed. A prediction is a dataset
class id or UNSEEN (-1). Conventions the paper leaves open, chosen here:

- an UNSEEN prediction is never correct for the accuracies (they measure classification; detection has its
  own metrics), so the first occurrence of a class can never count as correct;
- head = classes with MORE than `head_cut` samples in the sequence, tail = `head_cut` or fewer (the paper's
  text, "<= 50" tail; its appendix figure says ">= 50" head); `head_cut` is reported beside the buckets;
- rolling accuracy = accuracy over consecutive windows of `window` steps (the last, shorter one included);
- unseen-class detection: positives are the first sightings of the NOVEL classes (App. H: 750 positives for
  the 750 novel classes of a sequence; a pretrain class's first sighting is a negative, as every other step
  is); `unseen_positives: all` counts the first sightings of every class instead. The score is the learner's
  unseen score (higher = more likely unseen). AUROC by ranks (ties averaged), F1 at the threshold that
  maximises it (flag when score >= threshold). NaN when a side is empty, and NaN when a score is NaN (a
  learner whose scores went NaN has diverged: the engine records the run as diverged, never a number).

Pure: numpy only.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np
from numpy.typing import ArrayLike

from gtep.protocol.families.fluid.generator import first_occurrences

METRIC_NAMES = ("mean_per_class_acc", "overall_acc", "pretrain_head_acc", "pretrain_tail_acc", "novel_head_acc",
                "novel_tail_acc", "unseen_auroc", "unseen_f1", "gmacs_inference", "gmacs_update", "gmacs_total",
                "head_cut")
CURVE_METRICS = ("rolling_acc",)
BUCKETS = ("pretrain_head", "pretrain_tail", "novel_head", "novel_tail")
UNSEEN_POSITIVES = ("novel", "all")  # the detector's positives: first sightings of novel classes (App. H), or all


def overall_accuracy(labels: ArrayLike, predictions: ArrayLike) -> float:
    """(1/N) sum_t 1[p_t == y_t]."""
    y, p = np.asarray(labels), np.asarray(predictions)
    return float(np.mean(y == p)) if len(y) else float("nan")


def per_class_accuracy(labels: ArrayLike, predictions: ArrayLike) -> dict[int, float]:
    """Class c -> (1/N_c) sum_{t: y_t = c} 1[p_t == y_t]."""
    y, p = np.asarray(labels), np.asarray(predictions)
    return {int(c): float(np.mean(p[y == c] == c)) for c in np.unique(y)}


def mean_per_class_accuracy(labels: ArrayLike, predictions: ArrayLike) -> float:
    """(1/|C|) sum_c per-class accuracy of c."""
    accs = list(per_class_accuracy(labels, predictions).values())
    return float(np.mean(accs)) if accs else float("nan")


def bucket_accuracies(labels: ArrayLike, predictions: ArrayLike, pretrain_classes: ArrayLike,
                      head_cut: int) -> dict[str, float]:
    """Mean per-class accuracy in each of pretrain/novel x head/tail (head: more than head_cut samples)."""
    y = np.asarray(labels)
    per_class = per_class_accuracy(labels, predictions)
    pretrain = {int(c) for c in np.asarray(pretrain_classes).ravel()}
    out = {}
    for bucket in BUCKETS:
        group, size = bucket.split("_")
        members = [acc for c, acc in per_class.items()
                   if (c in pretrain) == (group == "pretrain") and (int((y == c).sum()) > head_cut) == (size == "head")]
        out[bucket] = float(np.mean(members)) if members else float("nan")
    return out


def rolling_accuracy(labels: ArrayLike, predictions: ArrayLike, window: int) -> list[float]:
    """Accuracy over steps [k*window, (k+1)*window) for every k (the last window may be shorter)."""
    hits = np.asarray(labels) == np.asarray(predictions)
    return [float(hits[i: i + window].mean()) for i in range(0, len(hits), window)]


def unseen_positives(labels: ArrayLike, novel: ArrayLike, which: str = "novel") -> np.ndarray:
    """The steps the detector should flag: first sightings of a class, only of novel classes (`novel`: bool per
    step) unless `which` is "all"."""
    if which not in UNSEEN_POSITIVES:
        raise ValueError(f"unseen_positives is {which!r}; choose from {UNSEEN_POSITIVES}")
    first = first_occurrences(labels)
    return first if which == "all" else first & np.asarray(novel, dtype=bool)


def auroc(scores: ArrayLike, positives: ArrayLike) -> float:
    """Area under the ROC curve: P(score of a positive > score of a negative), ties counting one half. NaN when a
    score is NaN: ranks would place NaN arbitrarily and give a number for a diverged learner."""
    s, pos = np.asarray(scores, dtype=float), np.asarray(positives, dtype=bool)
    n_pos, n_neg = int(pos.sum()), int((~pos).sum())
    if n_pos == 0 or n_neg == 0 or np.isnan(s).any():
        return float("nan")
    order = np.argsort(s, kind="mergesort")
    ranks = np.empty(len(s))
    sorted_s = s[order]
    start = 0
    while start < len(s):  # average ranks over ties
        end = start
        while end + 1 < len(s) and sorted_s[end + 1] == sorted_s[start]:
            end += 1
        ranks[order[start: end + 1]] = (start + end) / 2 + 1
        start = end + 1
    return float((ranks[pos].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def best_f1(scores: ArrayLike, positives: ArrayLike) -> float:
    """The largest F1 of "unseen" over thresholds (flag a step when its score >= the threshold)."""
    s, pos = np.asarray(scores, dtype=float), np.asarray(positives, dtype=bool)
    if not pos.any() or np.isnan(s).any():
        return float("nan")
    best = 0.0
    for threshold in np.unique(s):
        flagged = s >= threshold
        tp = int((flagged & pos).sum())
        if tp:
            best = max(best, 2 * tp / (int(flagged.sum()) + int(pos.sum())))
    return best


def summarize(labels: ArrayLike, predictions: ArrayLike, unseen_scores: ArrayLike,
              positives: ArrayLike, pretrain_classes: ArrayLike, head_cut: int, window: int,
              gmacs: Mapping[str, float]) -> dict[str, float | list[float]]:
    """Every metric of one stream (METRIC_NAMES and CURVE_METRICS); `positives` are the steps the detector should
    flag (unseen_positives), `gmacs` has 'inference' and 'update'."""
    out: dict[str, float | list[float]] = {
        "mean_per_class_acc": mean_per_class_accuracy(labels, predictions),
        "overall_acc": overall_accuracy(labels, predictions),
        **{f"{b}_acc": v for b, v in bucket_accuracies(labels, predictions, pretrain_classes, head_cut).items()},
        "unseen_auroc": auroc(unseen_scores, positives), "unseen_f1": best_f1(unseen_scores, positives),
        "gmacs_inference": float(gmacs["inference"]), "gmacs_update": float(gmacs["update"]),
        "gmacs_total": float(gmacs["inference"]) + float(gmacs["update"]), "head_cut": float(head_cut),
        "rolling_acc": rolling_accuracy(labels, predictions, window),
    }
    return out
