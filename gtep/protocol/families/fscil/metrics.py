"""Few-shot class-incremental (FSCIL) metrics from the accuracy matrix (Tang et al., "Rethinking Few-shot
Class-incremental Learning: Learning from Yourself", ECCV 2024; notes: shared/notes/companions.md, Paper 000).

The accuracy matrix A has one row per finished session i (0-based) and one column per session j: A[i, j] is the
accuracy in [0, 1] after session i on the test images of session j's classes, NaN for j > i. Session 0 is the base
session with ``base_classes`` classes; every later session adds ``ways`` classes, so r = base_classes / ways is the
weight of the base session in class-weighted accuracy (12 on CIFAR-100 and miniImageNet, 10 on CUB-200). In the
paper's 1-based notation A_i^j is ``A[i - 1, j - 1]`` here, and its task T_1 is our session 0.

Why these metrics: with r >> 1 the usual average accuracy (aAcc) is dominated by the base classes, so a model that
learns nothing new ("Lazy") looks close to the state of the art. The generalized accuracy gAcc(alpha) moves the
base weight from alpha = 1 (aAcc) down to alpha = 0 (novel classes only); its area under the curve over alpha is
the paper's summary score. Everything is a fraction in [0, 1], never percent.
"""
from __future__ import annotations

import math
from typing import Literal, Sequence

import numpy as np

Weighting = Literal["class", "sample"]
AucMode = Literal["paper", "exact"]

PAPER_GRID_STEPS = 12
"""The paper integrates gAcc_i(alpha) with the trapezoid rule on alpha = k/12, k = 0..12 (verified against every
entry of its corner-case Tables A1-A3). For CUB (r = 10) the grid it used is unknown; we keep k/12 there too."""


def _as_matrix(matrix: np.ndarray) -> np.ndarray:
    a = np.asarray(matrix, dtype=float)
    if a.ndim != 2 or a.shape[0] == 0 or a.shape[1] < a.shape[0]:
        raise ValueError(f"the accuracy matrix needs one row per session and at least as many columns, got {a.shape}")
    return a


def _ratio(base_classes: int, ways: int) -> float:
    if base_classes <= 0 or ways <= 0:
        raise ValueError(f"base_classes and ways must be positive, got {base_classes} and {ways}")
    return base_classes / ways


def _base_and_novel_sum(a: np.ndarray, i: int) -> tuple[float, float, int]:
    """B = A[i, 0], S = sum of the novel columns 1..i, m = i (the number of novel sessions seen after session i)."""
    return float(a[i, 0]), float(np.sum(a[i, 1 : i + 1])), i


# --- average accuracy and its variants (paper Eq. 1-3) ---------------------------------------------------------


def aacc_per_session(
    matrix: np.ndarray,
    base_classes: int,
    ways: int,
    weighting: Weighting = "class",
    test_counts: Sequence[int] | None = None,
) -> list[float]:
    """aAcc_i: the accuracy on every class seen up to session i, one value per session.

    ``weighting="class"`` is the paper's Eq. 3, (r A[i,0] + sum_{j=1..i} A[i,j]) / (r + i): every class counts the
    same. ``weighting="sample"`` weights session j by its test images ``test_counts[j]``, which is what a plain
    "correct / total" accuracy measures. Both agree when every class has the same number of test images (CIFAR-100,
    miniImageNet); they differ on CUB-200, so the report must say which one it uses."""
    a = _as_matrix(matrix)
    n = a.shape[0]
    if weighting == "class":
        r = _ratio(base_classes, ways)
        return [float((r * a[i, 0] + np.sum(a[i, 1 : i + 1])) / (r + i)) for i in range(n)]
    if weighting == "sample":
        if test_counts is None or len(test_counts) < n:
            raise ValueError(f"sample weighting needs test_counts for each of the {n} sessions")
        counts = np.asarray(test_counts, dtype=float)[:n]
        return [float(np.dot(a[i, : i + 1], counts[: i + 1]) / counts[: i + 1].sum()) for i in range(n)]
    raise ValueError(f"weighting must be 'class' or 'sample', got {weighting!r}")


def aacc(aacc_t: Sequence[float]) -> float:
    """aAcc = (1/n_t) sum_i aAcc_i (paper Eq. 1): the mean over sessions, the base session included."""
    return float(np.mean(aacc_t))


def lacc(aacc_t: Sequence[float]) -> float:
    """lAcc = aAcc of the last session: accuracy on all classes at the end."""
    return float(aacc_t[-1])


def tacc_per_session(matrix: np.ndarray) -> list[float]:
    """tAcc_i = (1/(i+1)) sum_{j<=i} A[i, j]: task-wise mean, the base session weighted like one novel session."""
    a = _as_matrix(matrix)
    return [float(np.mean(a[i, : i + 1])) for i in range(a.shape[0])]


def tacc(matrix: np.ndarray) -> float:
    """tAcc = mean over sessions of tAcc_i."""
    return float(np.mean(tacc_per_session(matrix)))


# --- generalized accuracy (paper Eq. 4-6) ----------------------------------------------------------------------


def gacc_alpha(matrix: np.ndarray, base_classes: int, ways: int, alpha: float) -> list[float]:
    """gAcc_i(alpha) = (alpha r A[i,0] + sum_{j=1..i} A[i,j]) / (alpha r + i), one value per session (Eq. 4).

    alpha = 1 gives aAcc_i, alpha = 1/r gives tAcc_i, alpha = 0 the mean over the novel sessions only. For the base
    session at alpha = 0 the ratio is 0/0; the paper sets it to 0 (that is what reproduces its Tables A1-A3), and so
    do we, so the session-0 value jumps from 0 to A[0,0] at alpha > 0."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must lie in [0, 1], got {alpha}")
    a = _as_matrix(matrix)
    r = _ratio(base_classes, ways)
    values = []
    for i in range(a.shape[0]):
        base, novel_sum, m = _base_and_novel_sum(a, i)
        if m == 0 and alpha == 0.0:
            values.append(0.0)  # the paper's convention for the 0/0 of the base-only session
        else:
            values.append((alpha * r * base + novel_sum) / (alpha * r + m))
    return values


def gacc_curve(matrix: np.ndarray, base_classes: int, ways: int, steps: int = PAPER_GRID_STEPS) -> list[float]:
    """The mean over sessions of gAcc_i(k/steps), k = 0..steps: the paper's gAcc(alpha) curve (Fig. 2a, 5a), with
    the same session-0 convention as ``gacc_alpha`` (0 at alpha = 0)."""
    if steps < 1:
        raise ValueError(f"steps must be at least 1, got {steps}")
    return [float(np.mean(gacc_alpha(matrix, base_classes, ways, k / steps))) for k in range(steps + 1)]


def gacc_auc(
    matrix: np.ndarray, base_classes: int, ways: int, mode: AucMode = "paper"
) -> tuple[list[float], float]:
    """The area under gAcc_i(alpha) over alpha in [0, 1] per session (Eq. 5) and its mean over sessions, the base
    session included (Eq. 6).

    ``mode="paper"`` (default) reproduces the published numbers: trapezoid rule on alpha = k/12 with
    gAcc_0(0) := 0, so the base session scores A[0,0] * (1 - 1/24) (Lazy: 81.46 for 85).
    ``mode="exact"`` integrates in closed form: with B = A[i,0], S = the novel sum and m = i novel sessions,
    gAcc_i(alpha) = B + (S - m B) / (alpha r + m), hence the integral B + ((S - m B) / r) ln(1 + r / m); the base
    session's integral is B. Exact values are a little higher (Lazy mean 50.48 against the paper's 49.92)."""
    a = _as_matrix(matrix)
    r = _ratio(base_classes, ways)
    if mode == "paper":
        grid = np.array([gacc_alpha(a, base_classes, ways, k / PAPER_GRID_STEPS) for k in range(PAPER_GRID_STEPS + 1)])
        h = 1.0 / PAPER_GRID_STEPS
        per_session = (h * (grid[1:-1].sum(axis=0) + (grid[0] + grid[-1]) / 2)).tolist()
    elif mode == "exact":
        per_session = []
        for i in range(a.shape[0]):
            base, novel_sum, m = _base_and_novel_sum(a, i)
            per_session.append(base if m == 0 else base + (novel_sum - m * base) / r * math.log1p(r / m))
    else:
        raise ValueError(f"mode must be 'paper' or 'exact', got {mode!r}")
    per_session = [float(v) for v in per_session]
    return per_session, float(np.mean(per_session))


# --- base/novel balance and forgetting (paper App. A6, Sec. 3.3) -----------------------------------------------


def novel_accuracy_per_session(matrix: np.ndarray) -> list[float]:
    """A_i^nov = mean of A[i, 1..i], the novel sessions only (= gAcc_i(0)); NaN for the base session."""
    a = _as_matrix(matrix)
    return [float("nan") if i == 0 else float(np.mean(a[i, 1 : i + 1])) for i in range(a.shape[0])]


def hacc_per_session(matrix: np.ndarray) -> list[float]:
    """hAcc_i = 2 A[i,0] A_i^nov / (A[i,0] + A_i^nov) (ALICE; paper Eq. A2), one value per session.

    Defined for i >= 1 only: the base session has no novel classes, so index 0 is NaN (indices stay sessions).
    NaN when either term is NaN, and 0 when both are 0, the same rule as the house ``harmonic_mean``."""
    a = _as_matrix(matrix)
    values = [float("nan")]
    for i, novel in enumerate(novel_accuracy_per_session(a)[1:], start=1):
        base = float(a[i, 0])
        if math.isnan(base) or math.isnan(novel):
            values.append(float("nan"))
        else:
            values.append(0.0 if base + novel == 0 else 2 * base * novel / (base + novel))
    return values


def _drops(matrix: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For every session j before the last: its accuracy right after it was learned, A[j, j], and at the end."""
    a = _as_matrix(matrix)
    last = a.shape[0] - 1
    learned = np.array([a[j, j] for j in range(last)], dtype=float)
    final = np.array([a[last, j] for j in range(last)], dtype=float)
    return learned, final


def performance_dropping(matrix: np.ndarray) -> float:
    """PD = mean over sessions j < last of A[last, j] - A[j, j] (paper App. A6: PD = A_{n_t}^i - A_i^i).

    The definition chosen among the paper's variants (Sec. 3.3 also writes A_i^j - A_j^j for any i): each session
    is compared between the moment it was learned and the end, then the drops are averaged over the sessions that
    can drop (all but the last). The sign is the paper's: forgetting gives a negative PD, 0 means no forgetting.
    0.0 for a one-session run (nothing can be forgotten)."""
    learned, final = _drops(matrix)
    return 0.0 if learned.size == 0 else float(np.mean(final - learned))


def chance_accuracy(base_classes: int) -> float:
    """What guessing scores on the first session: 1 / its number of classes."""
    if base_classes <= 0:
        raise ValueError(f"base_classes must be positive, got {base_classes}")
    return 1.0 / base_classes


def below_chance_reason(matrix: np.ndarray, base_classes: int) -> str | None:
    """Why RPD and KR are undefined for this run, None when they are defined: both divide by what a session scored
    right after it was learned, and a first session below chance (A[0, 0] < 1 / base_classes) learned nothing, so
    the ratio of its later accuracy to that noise is no rate of forgetting (A[0, 0] = 0.008 gave RPD 14.2)."""
    a = _as_matrix(matrix)
    first, chance = float(a[0, 0]), chance_accuracy(base_classes)
    if first >= chance:
        return None
    return (f"undefined: first-session accuracy {100 * first:.1f}% is below chance 1/{base_classes} "
            f"({100 * chance:.1f}%)")


def undefined_metrics(matrix: np.ndarray, base_classes: int) -> dict[str, str]:
    """The metrics ``summarize_fscil`` leaves NaN for this run, each with its reason (empty when all are defined)."""
    reason = below_chance_reason(matrix, base_classes) if _as_matrix(matrix).shape[0] > 1 else None
    return {"rpd": reason, "kr": reason} if reason else {}


def relative_performance_dropping(matrix: np.ndarray, base_classes: int | None = None) -> float:
    """RPD = mean over sessions j < last with A[j, j] > 0 of (A[last, j] - A[j, j]) / A[j, j] (paper App. A6).

    A session never learned (A[j, j] = 0) has an undefined ratio and is left out; NaN when every session is left
    out, 0.0 for a one-session run. With ``base_classes``, NaN as well when the first session scored below chance
    (``below_chance_reason``)."""
    learned, final = _drops(matrix)
    if learned.size == 0:
        return 0.0
    if base_classes is not None and below_chance_reason(matrix, base_classes):
        return float("nan")
    keep = learned > 0
    return float(np.mean((final[keep] - learned[keep]) / learned[keep])) if keep.any() else float("nan")


def knowledge_rate(matrix: np.ndarray, base_classes: int | None = None) -> float:
    """KR = mean over sessions j < last with A[j, j] > 0 of A[last, j] / A[j, j] (paper Sec. 3.3: A_i^j / A_j^j,
    taken with i = the last session, like PD), i.e. 1 + RPD.

    Sessions never learned (A[j, j] = 0) are left out, so the paper's "Lazy" model, which keeps its base accuracy
    and learns nothing, scores the perfect KR = 1 (and PD = 0): exactly the blind spot the paper points out.
    NaN when every session is left out, 1.0 for a one-session run; with ``base_classes``, NaN when the first
    session scored below chance, as RPD."""
    learned, final = _drops(matrix)
    if learned.size == 0:
        return 1.0
    if base_classes is not None and below_chance_reason(matrix, base_classes):
        return float("nan")
    keep = learned > 0
    return float(np.mean(final[keep] / learned[keep])) if keep.any() else float("nan")


# --- everything at once ----------------------------------------------------------------------------------------


def summarize_fscil(
    matrix: np.ndarray,
    test_counts: Sequence[int],
    base_classes: int,
    ways: int,
    auc_mode: AucMode = "paper",
) -> dict[str, float | list[float]]:
    """Every FSCIL metric of one run, ready to report; all fractions.

    Scalars: aacc (class-weighted, Eq. 3), aacc_sample (test-image weighted), lacc, tacc, gacc_auc (the AUC in
    ``auc_mode``, the paper's by default), gacc_auc_exact (always the closed form), hacc (last session's; NaN for a
    one-session run), pd, rpd and kr (NaN when the first session scored below chance: ``undefined_metrics`` says
    why), novel_acc (gAcc_last(0), the mean over the novel sessions after the last one).
    Lists: aacc_t (per session, class-weighted), tacc_t, gacc_auc_t (per-session AUC in ``auc_mode``), hacc_t (NaN
    at session 0) and gacc_alpha, the mean over sessions of gAcc_i(k/12), k = 0..12, to plot the gAcc(alpha) curve."""
    a = _as_matrix(matrix)
    aacc_t = aacc_per_session(a, base_classes, ways, "class")
    aacc_sample_t = aacc_per_session(a, base_classes, ways, "sample", test_counts)
    tacc_t = tacc_per_session(a)
    auc_t, auc = gacc_auc(a, base_classes, ways, auc_mode)
    _, auc_exact = gacc_auc(a, base_classes, ways, "exact")
    hacc_t = hacc_per_session(a)
    return {
        "aacc": aacc(aacc_t),
        "aacc_sample": aacc(aacc_sample_t),
        "lacc": lacc(aacc_t),
        "tacc": float(np.mean(tacc_t)),
        "gacc_auc": auc,
        "gacc_auc_exact": auc_exact,
        "hacc": hacc_t[-1],
        "pd": performance_dropping(a),
        "rpd": relative_performance_dropping(a, base_classes),
        "kr": knowledge_rate(a, base_classes),
        "novel_acc": novel_accuracy_per_session(a)[-1],
        "aacc_t": aacc_t,
        "tacc_t": tacc_t,
        "gacc_auc_t": auc_t,
        "hacc_t": hacc_t,
        "gacc_alpha": gacc_curve(a, base_classes, ways, PAPER_GRID_STEPS),
    }
