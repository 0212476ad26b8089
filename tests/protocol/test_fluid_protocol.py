"""FLUID's pure parts: the Zipf stream generator, the predict-then-reveal protocol, the metrics on hand-computed
logs, the family's registration and config checks (gtep/protocol/fluid*.py, papers/fluid.txt, notes 004.1-004.2)."""
import math
from pathlib import Path

import numpy as np
import pytest

from gtep.config import ConfigError, load_preset, resolve, validate_config
from gtep.protocol.criteria import CRITERIA
from gtep.protocol.families import FAMILIES
from gtep.protocol.families.fluid import FluidOptions, class_pools, phase_stream
from gtep.protocol.families.fluid import metrics as fm
from gtep.protocol.families.fluid.generator import (
    UNSEEN,
    LabelNotYetPredicted,
    PredictThenReveal,
    first_occurrences,
    fluid_stream,
    zipf_counts,
)
from tests.helpers import fluid_config

# ---------------------------------------------------------------- generator

@pytest.mark.parametrize("s", [0.5, 1.0, 1.5])
def test_class_frequencies_follow_zipf_within_a_tolerance(s):
    """Uncapped, count(rank r) / count(rank 1) = r**-s up to rounding, and the counts sum to the total."""
    counts = zipf_counts([10_000] * 50, s, total=20_000, cap=10_000)
    assert counts.sum() == 20_000
    ranks = np.arange(1, 51)
    expected = counts[0] * ranks ** -s
    assert np.all(np.abs(counts - expected) <= 1 + 0.01 * expected)
    slope = np.polyfit(np.log(ranks), np.log(counts), 1)[0]
    assert slope == pytest.approx(-s, abs=0.02)


def test_a_cap_clips_the_head_and_the_rest_keeps_the_law():
    """The paper's sequences: Zipf scaled to the total, clipped where a class has no more images (notes 004.1)."""
    available = [30, 500, 500, 500, 500, 500, 500, 500, 500, 500]
    counts = zipf_counts(available, 1.0, total=1_500, cap=200)
    assert counts.sum() == 1_500
    assert counts[0] == 30 and counts[1:5].tolist() == [200] * 4  # the class's own images, then the cap
    free = counts[5:]
    ratio = free / free[0] * np.arange(6, 11) / 6  # r * count(r) constant under s = 1
    assert np.allclose(ratio, 1, atol=0.05)


def test_too_few_images_for_the_total_gives_every_image_and_each_class_keeps_one():
    counts = zipf_counts([5, 5, 5], 2.0, total=1_000, cap=100)
    assert counts.tolist() == [5, 5, 5]
    assert zipf_counts([100] * 40, 3.0, total=50, cap=100).min() == 1


def test_the_generated_stream_follows_the_law_and_its_pools():
    pretrain = {c: np.arange(1_000 * c, 1_000 * c + 25) for c in range(10)}
    novel = {c: np.arange(1_000 * c, 1_000 * c + 400) for c in range(10, 40)}
    spec = fluid_stream(pretrain, novel, 5, 20, zipf_s=1.0, total=2_000, cap=300, seed=[0, 1])
    assert len(spec) == 2_000
    classes = set(spec.counts)
    assert len(classes & set(pretrain)) == 5 and len(classes & set(novel)) == 20
    for c, n in spec.counts.items():
        assert (spec.label == c).sum() == n
        shown = spec.image[spec.label == c]
        pool = pretrain.get(c, novel.get(c))
        assert set(shown) <= set(pool) and len(set(shown)) == n  # no image twice
    assert spec.pretrain.tolist() == np.isin(spec.label, list(pretrain)).tolist()
    counts = np.array(sorted(spec.counts.values(), reverse=True))
    uncapped = counts[(counts < 25) | (counts > 25)]
    uncapped = uncapped[uncapped < 300]
    assert np.all(np.diff(counts) <= 0)
    assert len(uncapped) > 5
    first = np.flatnonzero(first_occurrences(spec.label))
    assert first[len(first) // 2] > 20  # classes keep appearing mid-stream (a shuffle, not class blocks)


def test_the_same_seed_gives_the_same_stream_and_another_a_different_one():
    pretrain, novel = {0: range(25), 1: range(25, 50)}, {c: range(100 * c, 100 * c + 100) for c in range(2, 12)}
    a = fluid_stream(pretrain, novel, 2, 8, 1.0, 300, 100, seed=[3, 0])
    b = fluid_stream(pretrain, novel, 2, 8, 1.0, 300, 100, seed=[3, 0])
    c = fluid_stream(pretrain, novel, 2, 8, 1.0, 300, 100, seed=[3, 1])
    assert np.array_equal(a.label, b.label) and np.array_equal(a.image, b.image)
    assert not np.array_equal(a.label, c.label)


def test_a_class_both_pretrain_and_novel_is_refused():
    with pytest.raises(ValueError, match="both pretrain and novel"):
        fluid_stream({0: range(5)}, {0: range(5), 1: range(5)}, 1, 1, 1.0, 10, 5, seed=0)


def test_phase_streams_show_pretrain_test_images_only_and_differ_between_phases():
    y_train, y_test = np.repeat(np.arange(12), 30), np.repeat(np.arange(12), 10)
    options = FluidOptions.of({"pretrain_classes": [0, 1, 2], "n_pretrain_classes": 2, "n_novel_classes": 4,
                               "total_samples": 120, "per_class_cap": 40})
    tuning = phase_stream(y_train, y_test, [3, 4, 5, 6], options, seed=0, ordering=0)
    evaluation = phase_stream(y_train, y_test, [7, 8, 9, 10], options, seed=0, ordering=0)
    for spec in (tuning, evaluation):
        assert np.all(spec.image[spec.pretrain] >= len(y_train))  # test images of the pretrain classes
    assert not set(tuning.label[~tuning.pretrain]) & set(evaluation.label[~evaluation.pretrain])
    assert class_pools(y_train, y_test, [3], with_train=True)[3].size == 40


# ---------------------------------------------------------------- predict, then reveal

def small_stream():
    return fluid_stream({0: [100, 101]}, {1: [0, 1, 2], 2: [3, 4]}, 1, 2, 1.0, 7, 3, seed=0)


def test_no_label_is_visible_before_its_prediction_is_recorded():
    stream = PredictThenReveal(small_stream())
    with pytest.raises(LabelNotYetPredicted):
        stream.reveal(0)
    stream.sample(0)
    with pytest.raises(LabelNotYetPredicted):
        stream.reveal(0)
    stream.record(0, UNSEEN, 1.0)
    assert stream.reveal(0) in (0, 1, 2)
    with pytest.raises(LabelNotYetPredicted):
        stream.reveal(1)  # the next one is still unpredicted
    with pytest.raises(LabelNotYetPredicted):
        stream.sample(2)  # steps go in order
    with pytest.raises(LabelNotYetPredicted):
        stream.record(2, 0, 0.0)


def test_the_stream_keeps_every_recorded_prediction():
    spec = small_stream()
    stream = PredictThenReveal(spec)
    revealed = []
    for t in range(len(stream)):
        assert stream.sample(t) == spec.image[t]
        stream.record(t, t % 3, float(t))
        revealed.append(stream.reveal(t))
    assert stream.finished and revealed == spec.label.tolist()
    assert stream.predictions.tolist() == [t % 3 for t in range(len(spec))]
    assert stream.unseen_scores.tolist() == [float(t) for t in range(len(spec))]


# ---------------------------------------------------------------- metrics on a hand-computed log

# class:      7  7  7  7  3  3  9  7  3  9
# prediction: U  7  7  3  U  3  U  7  7  9     (U = unseen)
LABELS = [7, 7, 7, 7, 3, 3, 9, 7, 3, 9]
PREDS = [UNSEEN, 7, 7, 3, UNSEEN, 3, UNSEEN, 7, 7, 9]
SCORES = [0.9, 0.2, 0.1, 0.3, 0.8, 0.4, 0.35, 0.1, 0.2, 0.3]


def test_accuracies_on_a_hand_computed_log():
    assert fm.overall_accuracy(LABELS, PREDS) == pytest.approx(5 / 10)
    # per class: 7 -> 3/5, 3 -> 1/3, 9 -> 1/2
    assert fm.per_class_accuracy(LABELS, PREDS) == pytest.approx({7: 3 / 5, 3: 1 / 3, 9: 1 / 2})
    assert fm.mean_per_class_accuracy(LABELS, PREDS) == pytest.approx((3 / 5 + 1 / 3 + 1 / 2) / 3)


def test_buckets_split_pretrain_novel_and_head_tail_at_the_cut():
    # cut 3: head = more than 3 samples -> class 7 (5 samples); tail: 3 (3 samples), 9 (2 samples)
    buckets = fm.bucket_accuracies(LABELS, PREDS, pretrain_classes=[7, 9], head_cut=3)
    assert buckets["pretrain_head"] == pytest.approx(3 / 5)
    assert buckets["pretrain_tail"] == pytest.approx(1 / 2)
    assert buckets["novel_tail"] == pytest.approx(1 / 3)
    assert math.isnan(buckets["novel_head"])
    assert fm.bucket_accuracies(LABELS, PREDS, [7, 9], head_cut=5)["pretrain_head"] != \
        fm.bucket_accuracies(LABELS, PREDS, [7, 9], head_cut=4)["pretrain_head"]  # 5 samples: head iff cut < 5


def test_rolling_accuracy_is_over_consecutive_windows():
    assert fm.rolling_accuracy(LABELS, PREDS, 4) == pytest.approx([2 / 4, 2 / 4, 1 / 2])


def test_unseen_detection_auroc_and_best_f1_by_hand():
    first = first_occurrences(LABELS)
    assert first.tolist() == [True, False, False, False, True, False, True, False, False, False]
    # positives 0.9, 0.8, 0.35; negatives 0.2 0.1 0.3 0.4 0.1 0.2 0.3: 0.9 and 0.8 beat all 7, 0.35 beats 6 of 7
    assert fm.auroc(SCORES, first) == pytest.approx((7 + 7 + 6) / 21)
    # threshold 0.8: tp 2, flagged 2 -> F1 = 4/5; threshold 0.35: tp 3, flagged 4 -> 6/7 (the best)
    assert fm.best_f1(SCORES, first) == pytest.approx(6 / 7)
    assert fm.auroc([0.5, 0.5], [True, False]) == pytest.approx(0.5)  # ties count one half
    assert math.isnan(fm.auroc([0.1, 0.2], [False, False]))


def test_summarize_reports_every_metric_with_compute():
    out = fm.summarize(LABELS, PREDS, SCORES, first_occurrences(LABELS), [7, 9], 3, 4,
                       {"inference": 1.5, "update": 2.0})
    assert set(fm.METRIC_NAMES) | set(fm.CURVE_METRICS) == set(out)
    assert out["gmacs_total"] == pytest.approx(3.5) and out["head_cut"] == 3


def test_the_family_is_registered_with_its_criterion_and_raw_metrics():
    family = FAMILIES.get("fluid")
    assert family.data_flow == "stream" and family.default_criterion == "mean_per_class_acc"
    assert CRITERIA.get("mean_per_class_acc").components == ("mean_per_class_acc",)
    assert {"gmacs_total", "unseen_auroc", "head_cut"} <= family.plain_metrics  # never logged as percent
    assert "mean_per_class_acc" not in family.plain_metrics


# ---------------------------------------------------------------- config

def test_a_fluid_config_resolves():
    resolved = resolve(validate_config(fluid_config(), "test"))
    assert resolved.criterion.name == "mean_per_class_acc"
    assert resolved.family.data_classes(resolved.config.scenario.family_options) == (0, 1, 2, 3)


@pytest.mark.parametrize("change, field", [
    ({"pretrain_classes": [0, 1, 5]}, "scenario.fluid.pretrain_classes"),  # 5 is a phase class
    ({"n_pretrain_classes": 5}, "scenario.fluid.n_pretrain_classes"),
    ({"n_novel_classes": 9}, "scenario.fluid.n_novel_classes"),
    ({"pretrain_classes": [0, 0]}, "scenario.fluid.pretrain_classes"),
    ({"pretrain_classes": [0, 99]}, "scenario.fluid.pretrain_classes"),
])
def test_bad_fluid_configs_are_refused_naming_the_field(change, field):
    with pytest.raises(ConfigError) as err:
        resolve(validate_config(fluid_config(**change), "test"))
    assert err.value.field == field


def test_the_fluid_section_needs_its_family_and_a_class_incremental_learner_is_refused():
    data = fluid_config()
    data["scenario"]["family"] = "class_incremental"
    with pytest.raises(ConfigError, match="fluid section needs family: fluid"):
        validate_config(data, "test")
    data = fluid_config()
    data["algorithm"] = "replay"
    with pytest.raises(ConfigError, match="algorithms that can: fluid_et"):
        resolve(validate_config(data, "test"))


def test_the_pretrain_section_must_cover_the_streams_pretrain_classes():
    data = fluid_config()
    data["pretrain"] = {"classes": [0, 1, 2]}
    with pytest.raises(ConfigError) as err:
        resolve(validate_config(data, "test"))
    assert err.value.field == "scenario.fluid.pretrain_classes"


def test_the_cpu_preset_resolves(monkeypatch):
    npz = Path(__file__).resolve().parents[3] / "shared" / "data" / "tinyimagenet200_32.npz"
    if not npz.exists():
        pytest.skip("the Tiny ImageNet npz (../shared/data) is not on this machine")
    monkeypatch.setenv("TINYIMAGENET_NPZ", str(npz))
    resolved = resolve(load_preset("tinyimagenet-fluid"))
    options = resolved.config.scenario.fluid
    assert options is not None
    assert resolved.pretraining is not None and set(options.pretrain_classes) <= set(resolved.pretraining.classes)
    assert not set(resolved.tuning.classes) & set(resolved.evaluation.classes)


def test_terminal_tables_show_auroc_and_gmacs_as_they_are_and_accuracies_in_percent():
    from gtep.reporting.tables import metric_cell, metric_header

    summary = {"family": "fluid", "mean_per_class_acc": 0.125, "mean_per_class_acc_std": 0.01, "gmacs_total": 7.5,
               "gmacs_total_std": 0.1}
    assert metric_header("mean_per_class_acc", summary) == "mean per-class (%)"
    assert metric_header("gmacs_total", summary) == "GMACs"
    assert metric_cell("mean_per_class_acc", summary) == "12.50 ± 1.00"
    assert metric_cell("gmacs_total", summary) == "7.5 ± 0.1"
