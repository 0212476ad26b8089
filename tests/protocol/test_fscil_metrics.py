"""FSCIL metrics against the paper's corner cases (Tables A1-A3), its published rows (Tables 1, 3, A5-A7) and
hand-computed values. The paper works in percent, the module in fractions: ``pct`` converts and rounds to the two
decimals the paper prints."""
import math

import numpy as np
import pytest

from gtep.protocol.families.fscil import metrics as fm

BASE, WAYS, SESSIONS = 60, 5, 9  # CIFAR-100 / miniImageNet: 60 base + 8 x 5-way, r = 12, n_t = 9
COUNTS = [BASE * 100] + [WAYS * 100] * (SESSIONS - 1)  # 100 test images per class


def pct(x: float) -> float:
    return round(100 * x, 2)


def pcts(xs) -> list[float]:
    return [pct(x) for x in xs]


def empty(n: int = SESSIONS) -> np.ndarray:
    return np.full((n, n), np.nan)


def lazy() -> np.ndarray:
    """Keeps the base at 85 %, learns nothing new (Table A1)."""
    a = empty()
    for i in range(SESSIONS):
        a[i, : i + 1] = 0.0
        a[i, 0] = 0.85
    return a


def greedy(non_forgetting: bool = False) -> np.ndarray:
    """85 % after the base session, then 100 % on the current session only and 0 elsewhere (Table A2); the
    non-forgetting variant keeps every novel session at 100 % (Table A3). The base is 0 after session 0 in both."""
    a = empty()
    a[0, 0] = 0.85
    for i in range(1, SESSIONS):
        a[i, : i + 1] = 0.0
        a[i, i] = 1.0
        if non_forgetting:
            a[i, 1 : i + 1] = 1.0
    return a


def rebuild(aacc_t: list[float], novel_t: list[float], r: float = BASE / WAYS) -> np.ndarray:
    """A matrix with the published per-session aAcc_i and novel-only means nov_i (percent in, fractions out):
    A_i^1 = ((r + i - 1) aAcc_i - (i - 1) nov_i) / r in the paper's 1-based i, every novel column = nov_i."""
    n = len(aacc_t)
    assert len(novel_t) == n - 1
    a = empty(n)
    a[0, 0] = aacc_t[0] / 100
    for i in range(1, n):  # 0-based: i novel sessions seen
        a[i, 0] = ((r + i) * aacc_t[i] - i * novel_t[i - 1]) / r / 100
        a[i, 1 : i + 1] = novel_t[i - 1] / 100
    return a


def random_matrix(seed: int = 0, n: int = SESSIONS) -> np.ndarray:
    rng = np.random.default_rng(seed)
    a = rng.uniform(0.05, 1.0, size=(n, n))
    a[np.triu_indices(n, k=1)] = np.nan
    return a


# --- corner cases (paper Tables A1-A3) -------------------------------------------------------------------------


def test_lazy_matches_table_a1():
    a = lazy()
    aacc_t = fm.aacc_per_session(a, BASE, WAYS)
    assert pcts(aacc_t) == [85.0, 78.46, 72.86, 68.0, 63.75, 60.0, 56.67, 53.68, 51.0]
    assert pct(fm.aacc(aacc_t)) == 65.49
    assert pct(fm.lacc(aacc_t)) == 51.0
    auc_t, auc = fm.gacc_auc(a, BASE, WAYS)
    assert pcts(auc_t) == [81.46, 66.29, 57.15, 50.61, 45.58, 41.55, 38.22, 35.42, 33.01]
    assert pct(auc) == 49.92
    assert auc_t[0] == pytest.approx(0.85 * 11.5 / 12)  # the trapezoid with gAcc_1(0) := 0


def test_lazy_exact_integral():
    auc_t, auc = fm.gacc_auc(lazy(), BASE, WAYS, mode="exact")
    assert pct(auc_t[0]) == 85.0
    assert pct(auc_t[1]) == 66.83
    assert pct(auc) == 50.48
    # B + ((S - mB)/r) ln(1 + r/m) with S = 0, m = 1, r = 12
    assert auc_t[1] == pytest.approx(0.85 - 0.85 / 12 * math.log(13))


def test_greedy_matches_table_a2():
    a = greedy()
    assert pct(fm.aacc(fm.aacc_per_session(a, BASE, WAYS))) == 14.94
    auc_t, auc = fm.gacc_auc(a, BASE, WAYS)
    assert pct(auc) == 20.03
    # Table A2 prints 10.23 for f_6 (10.2249...) and aAcc 5.55 for f_7 (5.5555...): rounding of its own
    assert pcts(auc_t[:5]) == [81.46, 22.01, 16.38, 13.49, 11.59]
    assert pcts(auc_t[6:]) == [9.17, 8.33, 7.64]


def test_greedy_nf_matches_table_a3():
    a = greedy(non_forgetting=True)
    aacc_t = fm.aacc_per_session(a, BASE, WAYS)
    assert pcts(aacc_t) == [85.0, 7.69, 14.29, 20.0, 25.0, 29.41, 33.33, 36.84, 40.0]
    assert pct(fm.aacc(aacc_t)) == 32.40
    auc_t, auc = fm.gacc_auc(a, BASE, WAYS)
    assert pcts(auc_t) == [81.46, 22.01, 32.76, 40.46, 46.37, 51.12, 55.03, 58.33, 61.16]
    assert pct(auc) == 49.86


# --- properties of gAcc(alpha) ---------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize(("base", "ways"), [(60, 5), (100, 10), (50, 10)])
def test_gacc_special_alphas(seed, base, ways):
    a = random_matrix(seed)
    r = base / ways
    assert fm.gacc_alpha(a, base, ways, 1 / r) == pytest.approx(fm.tacc_per_session(a))
    assert fm.gacc_alpha(a, base, ways, 1.0) == pytest.approx(fm.aacc_per_session(a, base, ways))
    novel = fm.gacc_alpha(a, base, ways, 0.0)
    assert novel[0] == 0.0  # the paper's 0/0 convention for the base-only session
    assert novel[1:] == pytest.approx(fm.novel_accuracy_per_session(a)[1:])
    assert novel[-1] == pytest.approx(np.mean(a[-1, 1:]))


@pytest.mark.parametrize("seed", [0, 3])
def test_exact_integral_matches_fine_numerical_integration(seed):
    a = random_matrix(seed)
    alphas = np.linspace(0.0, 1.0, 20_001)
    curves = np.array([fm.gacc_alpha(a, BASE, WAYS, float(x)) for x in alphas])
    curves[0, 0] = a[0, 0]  # the integrand's limit; a single point does not change the integral
    h = alphas[1] - alphas[0]
    numeric = h * (curves[1:-1].sum(axis=0) + (curves[0] + curves[-1]) / 2)
    exact_t, exact = fm.gacc_auc(a, BASE, WAYS, mode="exact")
    assert exact_t == pytest.approx(numeric.tolist(), abs=1e-6)
    assert exact == pytest.approx(float(np.mean(numeric)), abs=1e-6)
    assert exact_t[0] == pytest.approx(a[0, 0])


def test_paper_mode_is_the_k12_trapezoid():
    a = random_matrix(5)
    grid = np.array([fm.gacc_alpha(a, BASE, WAYS, k / 12) for k in range(13)])
    expected = (grid[:-1] + grid[1:]).sum(axis=0) / 24
    auc_t, auc = fm.gacc_auc(a, BASE, WAYS)
    assert auc_t == pytest.approx(expected.tolist())
    assert auc == pytest.approx(float(expected.mean()))
    assert auc_t[0] == pytest.approx(a[0, 0] * 23 / 24)
    assert fm.gacc_curve(a, BASE, WAYS) == pytest.approx(grid.mean(axis=1).tolist())


# --- published rows rebuilt from per-session aAcc and novel-only means (Tables 1, 3, A5-A7) --------------------

MINI = {  # Table 1 aAcc per session | Table A6 novel per session 2..9 | published aAcc, gAcc
    "CEC": ([72.1, 67.0, 63.0, 59.6, 56.9, 53.9, 51.4, 49.5, 47.8],
            [21.4, 21.3, 19.9, 20.0, 18.0, 17.0, 17.5, 17.7], 57.91, 48.64),
    "NC-FSCIL": ([84.2, 76.1, 72.1, 68.1, 67.3, 63.9, 61.9, 59.6, 57.9],
                 [52.0, 45.4, 42.9, 40.2, 37.4, 34.4, 32.7, 31.5], 67.90, 60.93),
    "S3C": ([77.0, 72.1, 68.2, 65.1, 62.0, 58.8, 56.0, 53.6, 51.9],
            [25.0, 26.0, 27.9, 25.7, 23.7, 22.5, 23.7, 23.5], 62.74, 53.70),
    "C-FSCIL": ([70.6, 63.8, 59.3, 56.4, 54.3, 51.8, 48.9, 47.3, 46.1],
                [36.2, 34.6, 35.3, 35.8, 33.7, 31.5, 32.2, 32.6], 55.40, 50.46),
}

CIFAR = {  # Table 3 / A5 aAcc per session | Table A7 novel per session 2..9 | gAcc published in A7
    "NC-FSCIL": ([82.9, 77.5, 73.7, 69.0, 65.6, 62.0, 59.7, 57.8, 55.4],
                 [46.0, 41.4, 39.1, 36.4, 34.0, 33.6, 32.1, 30.0], 59.72),
    "CEC": ([73.2, 69.1, 65.4, 61.2, 58.0, 55.5, 53.2, 51.3, 49.2],
            [30.2, 27.3, 22.0, 21.4, 22.1, 21.9, 21.5, 20.9], 50.85),
    "S3C": ([78.0, 73.9, 70.2, 66.1, 63.3, 60.1, 58.3, 56.7, 54.0],
            [49.2, 40.8, 36.2, 35.0, 35.2, 35.2, 35.5, 35.2], 58.04),
}


@pytest.mark.parametrize("method", sorted(MINI))
def test_rebuilt_miniimagenet_rows(method):
    aacc_t, novel_t, aacc_published, gacc_published = MINI[method]
    a = rebuild(aacc_t, novel_t)
    assert pcts(fm.aacc_per_session(a, BASE, WAYS)) == pytest.approx(aacc_t)
    assert pcts(fm.novel_accuracy_per_session(a)[1:]) == pytest.approx(novel_t)
    assert pct(fm.aacc(fm.aacc_per_session(a, BASE, WAYS))) == pytest.approx(aacc_published, abs=0.011)
    assert pct(fm.gacc_auc(a, BASE, WAYS)[1]) == gacc_published


@pytest.mark.parametrize("method", sorted(CIFAR))
def test_rebuilt_cifar100_rows(method):
    aacc_t, novel_t, gacc_published = CIFAR[method]
    gacc = pct(fm.gacc_auc(rebuild(aacc_t, novel_t), BASE, WAYS)[1])
    if method == "NC-FSCIL":
        assert gacc == gacc_published  # Table A7 (Table 3 prints 59.73)
    else:  # the rows are printed to one decimal: the rebuilt value lands within a hundredth (50.86, 58.05)
        assert gacc == pytest.approx(gacc_published, abs=0.011)


# --- weighting ------------------------------------------------------------------------------------------------


def test_sample_weighting_equals_class_weighting_with_equal_images_per_class():
    a = random_matrix(7)
    by_class = fm.aacc_per_session(a, BASE, WAYS, "class")
    by_sample = fm.aacc_per_session(a, BASE, WAYS, "sample", COUNTS)
    assert by_sample == pytest.approx(by_class)


def test_sample_weighting_differs_with_unequal_images_per_class():
    a = np.array([[0.8, np.nan, np.nan], [0.7, 0.6, np.nan], [0.6, 0.3, 0.9]])
    by_class = fm.aacc_per_session(a, 4, 2, "class")  # r = 2
    assert by_class == pytest.approx([0.8, (2 * 0.7 + 0.6) / 3, (2 * 0.6 + 0.3 + 0.9) / 4])
    counts = [40, 5, 30]  # 10 test images per base class, few for session 1, many for session 2
    by_sample = fm.aacc_per_session(a, 4, 2, "sample", counts)
    assert by_sample == pytest.approx([0.8, (40 * 0.7 + 5 * 0.6) / 45, (40 * 0.6 + 5 * 0.3 + 30 * 0.9) / 75])
    assert by_sample[2] != pytest.approx(by_class[2])
    summary = fm.summarize_fscil(a, counts, 4, 2)
    assert summary["aacc_sample"] == pytest.approx(np.mean(by_sample))
    assert summary["aacc"] == pytest.approx(np.mean(by_class))


# --- hAcc, PD, RPD, KR -----------------------------------------------------------------------------------------


def test_hacc_pd_rpd_kr_by_hand():
    a = np.array([[0.8, np.nan, np.nan], [0.7, 0.6, np.nan], [0.6, 0.3, 0.9]])
    hacc_t = fm.hacc_per_session(a)
    assert math.isnan(hacc_t[0])
    assert hacc_t[1:] == pytest.approx([2 * 0.7 * 0.6 / 1.3, 0.6])  # novel of session 2: (0.3 + 0.9) / 2
    assert fm.performance_dropping(a) == pytest.approx(((0.6 - 0.8) + (0.3 - 0.6)) / 2)  # -0.25
    assert fm.relative_performance_dropping(a) == pytest.approx((-0.2 / 0.8 - 0.3 / 0.6) / 2)  # -0.375
    assert fm.knowledge_rate(a) == pytest.approx((0.6 / 0.8 + 0.3 / 0.6) / 2)  # 0.625
    assert fm.knowledge_rate(a) == pytest.approx(1 + fm.relative_performance_dropping(a))


def test_lazy_looks_perfect_to_forgetting_metrics():
    a = lazy()
    assert fm.performance_dropping(a) == 0.0
    assert fm.relative_performance_dropping(a) == 0.0
    assert fm.knowledge_rate(a) == 1.0  # the never-learned novel sessions (0/0) are left out
    assert fm.hacc_per_session(a)[1:] == [0.0] * (SESSIONS - 1)  # hAcc does see it: base 85, novel 0


def test_hacc_nan_and_zero_cases():
    a = np.array([[0.5, np.nan, np.nan], [0.0, 0.0, np.nan], [np.nan, 0.4, 0.2]])
    hacc_t = fm.hacc_per_session(a)
    assert hacc_t[1] == 0.0  # both terms 0: 0, not 0/0
    assert math.isnan(hacc_t[2])  # a missing base accuracy propagates


def test_forgetting_metrics_degenerate_runs():
    one = np.array([[0.7]])
    assert fm.performance_dropping(one) == 0.0
    assert fm.relative_performance_dropping(one) == 0.0
    assert fm.knowledge_rate(one) == 1.0
    assert math.isnan(fm.hacc_per_session(one)[0])
    never = np.array([[0.0, np.nan], [0.0, 0.0]])
    assert fm.performance_dropping(never) == 0.0
    assert math.isnan(fm.relative_performance_dropping(never))
    assert math.isnan(fm.knowledge_rate(never))


# --- summary and input checks -----------------------------------------------------------------------------------


def test_summarize_lazy():
    s = fm.summarize_fscil(lazy(), COUNTS, BASE, WAYS)
    scalars = ["aacc", "aacc_sample", "lacc", "tacc", "gacc_auc", "gacc_auc_exact", "hacc", "pd", "rpd", "kr",
               "novel_acc"]
    for key in scalars:
        assert isinstance(s[key], float), key
    expected = {"aacc": 65.49, "aacc_sample": 65.49, "lacc": 51.0, "gacc_auc": 49.92, "gacc_auc_exact": 50.48,
                "hacc": 0.0, "pd": 0.0, "rpd": 0.0, "kr": 100.0, "novel_acc": 0.0}
    assert {k: pct(s[k]) for k in expected} == expected
    assert s["tacc"] == pytest.approx(np.mean([0.85 / (i + 1) for i in range(SESSIONS)]))
    assert pcts(s["aacc_t"]) == [85.0, 78.46, 72.86, 68.0, 63.75, 60.0, 56.67, 53.68, 51.0]
    curve = s["gacc_alpha"]
    assert isinstance(curve, list) and len(curve) == 13
    assert curve[0] == 0.0  # no novel accuracy anywhere, and the base session counts 0 at alpha = 0
    assert curve[-1] == pytest.approx(s["aacc"])  # gAcc(1) = aAcc
    assert curve[1] == pytest.approx(s["tacc"])  # gAcc(1/r) = tAcc with r = 12
    assert fm.summarize_fscil(lazy(), COUNTS, BASE, WAYS, auc_mode="exact")["gacc_auc"] == pytest.approx(
        s["gacc_auc_exact"])


def test_summarize_novel_acc_is_gacc_last_at_zero():
    a = random_matrix(11)
    s = fm.summarize_fscil(a, COUNTS, BASE, WAYS)
    assert s["novel_acc"] == pytest.approx(fm.gacc_alpha(a, BASE, WAYS, 0.0)[-1])
    assert s["gacc_alpha"][0] == pytest.approx(np.mean(fm.gacc_alpha(a, BASE, WAYS, 0.0)))
    assert s["hacc"] == pytest.approx(fm.hacc_per_session(a)[-1])


def test_input_checks():
    a = lazy()
    with pytest.raises(ValueError, match="weighting"):
        fm.aacc_per_session(a, BASE, WAYS, "images")
    with pytest.raises(ValueError, match="test_counts"):
        fm.aacc_per_session(a, BASE, WAYS, "sample")
    with pytest.raises(ValueError, match="mode"):
        fm.gacc_auc(a, BASE, WAYS, "simpson")
    with pytest.raises(ValueError, match="alpha"):
        fm.gacc_alpha(a, BASE, WAYS, 1.5)
    with pytest.raises(ValueError, match="positive"):
        fm.gacc_alpha(a, BASE, 0, 0.5)
    with pytest.raises(ValueError, match="one row per session"):
        fm.tacc_per_session(np.zeros((3, 2)))


# --- RPD and KR after a first session below chance (issue 45, item 7) ------------------------------------------


def below_chance() -> np.ndarray:
    """The run of the issue: the base session scored 0.8 % (chance is 1/60 = 1.7 %), later 12 % of it."""
    a = empty(3)
    a[0, 0] = 0.008
    a[1, :2] = [0.12, 0.5]
    a[2, :3] = [0.12, 0.4, 0.6]
    return a


def test_rpd_and_kr_are_undefined_after_a_first_session_below_chance():
    a = below_chance()
    assert fm.relative_performance_dropping(a) > 5  # the paper's formula alone: a "rate" made of noise
    s = fm.summarize_fscil(a, [6000, 500, 500], BASE, WAYS)
    assert math.isnan(s["rpd"]) and math.isnan(s["kr"])
    assert not math.isnan(s["pd"]) and not math.isnan(s["gacc_auc"])  # the other metrics keep their values
    reasons = fm.undefined_metrics(a, BASE)
    assert set(reasons) == {"rpd", "kr"}
    assert reasons["rpd"] == "undefined: first-session accuracy 0.8% is below chance 1/60 (1.7%)"


def test_rpd_and_kr_stay_defined_from_chance_on():
    a = below_chance()
    a[0, 0] = 1 / BASE  # exactly chance: the ratio is defined (if poor)
    s = fm.summarize_fscil(a, [6000, 500, 500], BASE, WAYS)
    assert s["rpd"] == pytest.approx(fm.relative_performance_dropping(a))
    assert s["kr"] == pytest.approx(1 + s["rpd"])
    assert fm.undefined_metrics(a, BASE) == {}
    assert fm.undefined_metrics(np.array([[0.001]]), BASE) == {}  # one session: nothing divides, RPD 0, KR 1


def fscil_unit(set_index: int, ordering: int, matrix: np.ndarray) -> dict:
    s = fm.summarize_fscil(matrix, [6000, 500, 500], BASE, WAYS)
    return {"status": "finished", "set_index": set_index, "ordering": ordering, "acc": s["lacc"],
            "avg_acc": s["aacc"], **s}


def test_an_undefined_rpd_is_no_divergence_and_never_blocks_h_star():
    """NaN RPD/KR flow through the phase's statistics and H* by gAcc AUC as 'no value', not as a diverged run."""
    from gtep.orchestration.tracking import ordering_result, summarize_units
    from gtep.protocol.criteria import CRITERIA
    from gtep.protocol.families import FAMILIES
    from gtep.protocol.selection import select_best

    fscil = FAMILIES.get("fscil")
    assert not {m.name for m in fscil.metrics if m.selectable} & {"rpd", "kr"}  # never a criterion's component
    good = random_matrix(3, 3)
    units = [fscil_unit(0, 0, below_chance()), fscil_unit(0, 1, good), fscil_unit(1, 0, below_chance()),
             fscil_unit(1, 1, below_chance())]
    results = [ordering_result(u) for u in units]
    assert not any(r.diverged for r in results)
    best = select_best(results, expected_orderings=2, criterion=CRITERIA.get("gacc_auc"))
    assert best.best_index in (0, 1) and all(not s.status == "diverged" for s in best.scores)
    phase = summarize_units(units[:2], 2, fscil, CRITERIA.get("gacc_auc"))
    assert phase["diverged"] == 0 and not math.isnan(phase["score"])
    assert phase["rpd"] == pytest.approx(fm.relative_performance_dropping(good))  # the ordering that has one
    assert math.isnan(summarize_units(units[2:], 2, fscil, CRITERIA.get("gacc_auc"))["rpd"])


def test_the_report_says_why_rpd_is_nan():
    import pandas as pd

    from gtep.reporting.tables import metric_cell, undefined_notes

    row = {"label": "cec", "phase": "evaluate", "family": "fscil", "diverged": 0.0, "rpd": math.nan, "kr": math.nan,
           "pd": -0.1, "gacc_auc": 0.4}
    notes = undefined_notes(pd.DataFrame([row, {**row, "label": "fact", "rpd": 0.2, "kr": 1.2}]))
    assert notes == ["Undefined (NaN): RPD, KR of cec (evaluate): the first session's accuracy is below chance "
                     "(1 / its classes)."]
    assert metric_cell("rpd", row) == "NaN (undefined)"
    diverged = {**row, "diverged": 1.0}  # a diverged ordering is its own reason: the table's diverged column says it
    assert undefined_notes(pd.DataFrame([diverged])) == [] and metric_cell("rpd", diverged) == "NaN"
    assert undefined_notes(pd.DataFrame([{**row, "family": "class_incremental"}])) == []


def test_no_reason_is_given_for_a_phase_without_orderings():
    from gtep.reporting.tables import undefined_reason

    row = {"label": "cec", "phase": "evaluate", "family": "fscil", "rpd": math.nan}
    assert undefined_reason("rpd", {**row, "diverged": 0.0, "orderings": 2.0}).startswith("the first session")
    assert undefined_reason("rpd", {**row, "diverged": 0.0, "orderings": 0.0}) == ""  # nothing ran: no reason
    assert undefined_reason("rpd", {**row, "diverged": math.nan}) == ""
