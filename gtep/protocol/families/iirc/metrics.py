"""IIRC metrics (paper section 4.2, Eq. 1-2; notes 001.2) over multi-hot predictions and targets.

Predictions and targets are bool arrays (n_samples x n_labels) over the same label index. Per sample i with
target set Y and predicted set P:

    exact match   1[P == Y]
    JS            |P & Y| / |P | Y|
    precision     |P & Y| / |P|
    pw-JS         JS * precision

Edge cases (the paper defines none): P and Y both empty -> exact match 1, JS 1, precision 1, pw-JS 1 (the
prediction is exactly right); P empty, Y not -> JS 0, precision 0, pw-JS 0; Y empty, P not -> 0 for all.
Under IIRC's complete-information evaluation Y is never empty (a sample is evaluated once one of its
labels is observed), so only an empty prediction matters in practice. A metric over no samples is NaN.

    R[k, j]   pw-JS after training task k on the evaluation samples of task j (j <= k; NaN above the
              diagonal; the paper writes R_jk with j >= k)
    R_k       pw-JS after task k over ALL evaluation samples of tasks 0..k, de-duplicated (the paper's R_j,
              its headline curve, Table 5)

`summarize` gives the scalars pw_js (final R_k), mean_pw_js (mean of R_k over tasks: the default H*
criterion), js, mean_js, exact_match (final), and the per-task lists. Pure: numpy only.

Diagnostics (paper App. D.2-D.3), over the same samples as R_k, each restricted to one kind of label column
(`iirc.label_kinds`); their final values and per-task curves (name_t):

    superclass_pw_js                 pw-JS over the superclass labels alone, on the samples that carry an
                                     observed superclass (Figures A.10-A.11: are old superclasses still given to
                                     samples of their new subclasses?)
    subclass_precision_with_super    precision over the labels of subclasses under a superclass alone, on the
                                     samples that predict at least one of them (Figures A.12-A.13: confusion
                                     between sibling subclasses)
    subclass_precision_standalone    the same over the standalone subclasses' labels (the paper's baseline)

Which samples they average over is not stated in the paper [inferred here]: a sample without an observed
superclass would score 1 on superclass pw-JS by predicting none, and precision is undefined for a sample that
predicts none of the kind's labels. NaN when no sample qualifies (e.g. standalone precision on a hierarchy
without standalone subclasses).
"""
from __future__ import annotations

from typing import Callable, Mapping, Sequence

import numpy as np

DIAGNOSTICS = ("superclass_pw_js", "subclass_precision_with_super", "subclass_precision_standalone")
METRIC_NAMES = ("pw_js", "mean_pw_js", "js", "mean_js", "exact_match", "precision", *DIAGNOSTICS)
CURVE_METRICS = ("pw_js_t", "js_t", "exact_match_t", "precision_t", "pw_js_current_t", *(f"{n}_t" for n in DIAGNOSTICS))
DEFAULT_CRITERION_METRIC = "mean_pw_js"  # a Criterion("mean_pw_js", ("mean_pw_js",), ...) in criteria.py


def _pair(pred: np.ndarray, target: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    p, y = np.asarray(pred, dtype=bool), np.asarray(target, dtype=bool)
    if p.ndim == 1:
        p, y = p[None, :], y[None, :]
    if p.shape != y.shape or p.ndim != 2:
        raise ValueError(f"predictions {p.shape} and targets {y.shape} must be equal (n_samples, n_labels) arrays")
    return p, y


def _counts(pred: np.ndarray, target: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    p, y = _pair(pred, target)
    return (p & y).sum(axis=1), (p | y).sum(axis=1), p.sum(axis=1)


def sample_exact_match(pred: np.ndarray, target: np.ndarray) -> np.ndarray:
    p, y = _pair(pred, target)
    return np.all(p == y, axis=1).astype(float)


def sample_jaccard(pred: np.ndarray, target: np.ndarray) -> np.ndarray:
    """|P & Y| / |P | Y| per sample; 1 when both are empty."""
    inter, union, _ = _counts(pred, target)
    return np.where(union == 0, 1.0, inter / np.maximum(union, 1))


def sample_precision(pred: np.ndarray, target: np.ndarray) -> np.ndarray:
    """|P & Y| / |P| per sample; for an empty P: 1 if Y is empty too, else 0."""
    inter, union, n_pred = _counts(pred, target)
    return np.where(n_pred == 0, (union == 0).astype(float), inter / np.maximum(n_pred, 1))


def sample_pw_jaccard(pred: np.ndarray, target: np.ndarray) -> np.ndarray:
    """Jaccard x precision per sample (paper Eq. 1's summand)."""
    return sample_jaccard(pred, target) * sample_precision(pred, target)


def _mean(values: np.ndarray) -> float:
    return float(values.mean()) if values.size else float("nan")


def exact_match(pred: np.ndarray, target: np.ndarray) -> float:
    """MR: the fraction of samples whose predicted set is exactly the target set."""
    return _mean(sample_exact_match(pred, target))


def jaccard(pred: np.ndarray, target: np.ndarray) -> float:
    """JS: the mean per-sample Jaccard similarity."""
    return _mean(sample_jaccard(pred, target))


def precision(pred: np.ndarray, target: np.ndarray) -> float:
    """The mean per-sample precision."""
    return _mean(sample_precision(pred, target))


def pw_jaccard(pred: np.ndarray, target: np.ndarray) -> float:
    """pw-JS: the mean per-sample precision-weighted Jaccard similarity (paper Eq. 1-2)."""
    return _mean(sample_pw_jaccard(pred, target))


METRICS: Mapping[str, Callable[[np.ndarray, np.ndarray], float]] = {
    "pw_js": pw_jaccard, "js": jaccard, "exact_match": exact_match, "precision": precision}


def _columns(pred: np.ndarray, target: np.ndarray, columns: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    p, y = _pair(pred, target)
    keep = np.asarray(columns, dtype=bool)
    if keep.shape != (p.shape[1],):
        raise ValueError(f"the column mask has shape {keep.shape}; give one bool per label ({p.shape[1]})")
    return p[:, keep], y[:, keep]


def superclass_pw_jaccard(pred: np.ndarray, target: np.ndarray, superclass_columns: np.ndarray) -> float:
    """App. D.2: pw-JS with only the superclass labels (predicted and true) taken into account, on the samples
    whose target has a superclass (see the module docstring)."""
    p, y = _columns(pred, target, superclass_columns)
    rows = y.any(axis=1)
    return pw_jaccard(p[rows], y[rows])


def precision_among(pred: np.ndarray, target: np.ndarray, columns: np.ndarray) -> float:
    """App. D.3: the mean per-sample precision with only the labels of `columns` taken into account (one type of
    subclass), on the samples that predict at least one of them."""
    p, y = _columns(pred, target, columns)
    rows = p.any(axis=1)
    return precision(p[rows], y[rows])


def diagnostics(pred: np.ndarray, target: np.ndarray, kinds: Mapping[str, np.ndarray]) -> dict[str, float]:
    """The DIAGNOSTICS of one prediction; `kinds` are `iirc.label_kinds`' column masks."""
    return {"superclass_pw_js": superclass_pw_jaccard(pred, target, kinds["superclass"]),
            "subclass_precision_with_super": precision_among(pred, target, kinds["with_super"]),
            "subclass_precision_standalone": precision_among(pred, target, kinds["standalone"])}


def _mask(members: np.ndarray, n: int) -> np.ndarray:
    m = np.asarray(members)
    if m.dtype == bool:
        return m
    out = np.zeros(n, dtype=bool)
    out[m.astype(np.int64)] = True
    return out


def task_matrix(predictions: Sequence[np.ndarray], targets: Sequence[np.ndarray], members: Sequence[np.ndarray],
                metric: str = "pw_js") -> np.ndarray:
    """R[k, j]: `metric` after task k on the samples of task j (NaN for j > k).

    predictions[k] and targets[k] are the model's predictions after task k and the targets then (labels
    restricted to the classes observed through task k; `iirc.evaluation_targets`), both over one fixed list
    of evaluation samples; members[j] selects task j's samples of that list (a bool mask or indices;
    `iirc.task_members`)."""
    fn = METRICS[metric]
    n_tasks = len(predictions)
    out = np.full((n_tasks, len(members)), np.nan)
    for k in range(n_tasks):
        p, y = _pair(predictions[k], targets[k])
        for j in range(min(k + 1, len(members))):
            m = _mask(members[j], len(p))
            out[k, j] = fn(p[m], y[m])
    return out


def after_each_task(predictions: Sequence[np.ndarray], targets: Sequence[np.ndarray],
                    members: Sequence[np.ndarray],
                    kinds: Mapping[str, np.ndarray] | None = None) -> dict[str, list[float]]:
    """R_k for each metric: after task k, over the union of the samples of tasks 0..k (each sample once); with
    `kinds` (`iirc.label_kinds`), the DIAGNOSTICS too."""
    names = [*METRICS, *(DIAGNOSTICS if kinds is not None else ())]
    out: dict[str, list[float]] = {f"{name}_t": [] for name in names}
    seen: np.ndarray | None = None
    for k in range(len(predictions)):
        p, y = _pair(predictions[k], targets[k])
        m = _mask(members[k], len(p))
        seen = m if seen is None else seen | m
        for name, fn in METRICS.items():
            out[f"{name}_t"].append(fn(p[seen], y[seen]))
        if kinds is not None:
            for name, value in diagnostics(p[seen], y[seen], kinds).items():
                out[f"{name}_t"].append(value)
    return out


def summarize_curves(pw_js_t: Sequence[float], js_t: Sequence[float], exact_match_t: Sequence[float],
                     precision_t: Sequence[float] | None = None,
                     pw_js_current_t: Sequence[float] | None = None) -> dict[str, float | list[float]]:
    """Scalars from the per-task R_k curves: final pw-JS, mean pw-JS over tasks (the default criterion),
    final and mean JS, final exact match and precision; the curves themselves as lists."""
    prec = list(precision_t) if precision_t is not None else [float("nan")] * len(pw_js_t)
    out: dict[str, float | list[float]] = {
        "pw_js": float(pw_js_t[-1]), "mean_pw_js": float(np.mean(pw_js_t)),
        "js": float(js_t[-1]), "mean_js": float(np.mean(js_t)),
        "exact_match": float(exact_match_t[-1]), "precision": float(prec[-1]),
        "pw_js_t": [float(v) for v in pw_js_t], "js_t": [float(v) for v in js_t],
        "exact_match_t": [float(v) for v in exact_match_t], "precision_t": [float(v) for v in prec]}
    if pw_js_current_t is not None:
        out["pw_js_current_t"] = [float(v) for v in pw_js_current_t]
    return out


def summarize(predictions: Sequence[np.ndarray], targets: Sequence[np.ndarray], members: Sequence[np.ndarray],
              kinds: Mapping[str, np.ndarray] | None = None) -> dict[str, float | list[float]]:
    """Every per-ordering IIRC metric from the predictions and targets after each task (see `task_matrix`):
    the scalars of METRIC_NAMES, the curves of CURVE_METRICS (pw_js_current_t: R[k, k], the performance on
    a task right after learning it). The whole matrix R is `task_matrix`. The DIAGNOSTICS need the label
    columns' `kinds` (`iirc.label_kinds`); without them they are NaN."""
    curves = after_each_task(predictions, targets, members, kinds)
    r = task_matrix(predictions, targets, members)
    out = summarize_curves(curves["pw_js_t"], curves["js_t"], curves["exact_match_t"], curves["precision_t"],
                           [float(r[k, k]) for k in range(min(r.shape))])
    for name in DIAGNOSTICS:
        curve = curves.get(f"{name}_t", [float("nan")] * len(predictions))
        out[name] = float(curve[-1]) if curve else float("nan")
        out[f"{name}_t"] = [float(v) for v in curve]
    return out
