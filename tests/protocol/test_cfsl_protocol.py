"""The CFSL task sampler's invariants (the spec's Algorithm 1 with its index corrected, notes 002.1) and its
metrics on hand-computed cases (notes 002.2)."""
import math

import numpy as np
import pytest

from gtep.config import ConfigError, load_preset, resolve, validate_config
from gtep.protocol.criteria import CRITERIA
from gtep.protocol.families import FAMILIES
from gtep.protocol.families.cfsl import ContinualFewShot, with_aliases
from gtep.protocol.families.cfsl import metrics as cfsl_metrics
from gtep.protocol.families.cfsl.generator import CfslOptions, ordering_tasks, sample_task

CLASSES = list(range(40))
POOL = np.repeat(np.arange(40), 40)  # 40 classes x 40 images, pool index i is of class i // 40


def options(**changes) -> CfslOptions:
    base = dict(support_sets=6, ways=3, shots=2, target_shots=3, class_change_interval=2, overwrite=False,
                tasks_per_ordering=3)
    return CfslOptions(**{**base, **changes})


def every_task(**changes):
    spec = options(**changes)
    return spec, [t for s in range(2) for t in ordering_tasks(POOL, CLASSES, spec, seed=5, ordering=s)]


@pytest.mark.parametrize("cci", [1, 2, 3, 6])
@pytest.mark.parametrize("overwrite", [False, True])
def test_counts_and_class_changes_every_cci_support_sets(cci, overwrite):
    spec, tasks = every_task(class_change_interval=cci, overwrite=overwrite)
    for task in tasks:
        assert len(task.support) == spec.support_sets and len(task.blocks) == 6 // cci
        assert len(task.classes) == len(set(task.classes)) == 3 * (6 // cci)  # new classes within the task
        for n, s in enumerate(task.support):
            assert s.index == n and s.block == n // cci
            assert len(s.samples) == 3 * 2 and sorted(np.bincount(s.classes).tolist())[-3:] == [2, 2, 2]
            assert set(s.classes) == set(task.blocks[n // cci])  # the same classes for CCI sets, then new ones
            assert all(POOL[i] == c for i, c in zip(s.samples, s.classes))
        assert len(task.target_samples) == spec.support_sets * 3 * 3  # K_T per class per support set
        assert all(POOL[i] == c for i, c in zip(task.target_samples, task.target_classes))


def test_without_overwrite_a_block_gets_its_own_label_range_kept_through_its_support_sets():
    spec, tasks = every_task(overwrite=False)
    for task in tasks:
        assert task.num_labels == 9
        for s in task.support:
            assert sorted(set(s.labels)) == list(range(3 * s.block, 3 * s.block + 3))
        label_of = {}
        for s in task.support:
            for c, label in zip(s.classes, s.labels):
                assert label_of.setdefault(c, label) == label  # one class, one label (not offset per support set)
        assert all(label_of[c] == label for c, label in zip(task.target_classes, task.target_labels))
        assert len(set(label_of.values())) == len(label_of)


def test_with_overwrite_every_block_reuses_labels_0_to_nc():
    spec, tasks = every_task(overwrite=True)
    for task in tasks:
        assert task.num_labels == 3
        for s in task.support:
            assert sorted(set(s.labels)) == [0, 1, 2]
        for a, block in enumerate(task.blocks):
            labels = {label for s in task.support if s.block == a for label in s.labels}
            assert labels == {0, 1, 2} and len(block) == 3
        # the merged target set: one label for a class of every block (the overwrite semantics)
        per_label = {label: {c for c, lab in zip(task.target_classes, task.target_labels) if lab == label}
                     for label in range(3)}
        assert all(len(classes) == len(task.blocks) for classes in per_label.values())


def test_samples_are_unique_within_a_task_and_support_and_target_are_disjoint():
    _, tasks = every_task(class_change_interval=3)
    for task in tasks:
        support = [i for s in task.support for i in s.samples]
        assert len(support) == len(set(support))  # never reused across support sets (the reference code does)
        assert len(task.target_samples) == len(set(task.target_samples))
        assert not set(support) & set(task.target_samples)


def test_same_seed_same_tasks_and_orderings_differ():
    spec = options()
    first = ordering_tasks(POOL, CLASSES, spec, seed=1, ordering=0)
    assert first == ordering_tasks(POOL, CLASSES, spec, seed=1, ordering=0)
    assert first != ordering_tasks(POOL, CLASSES, spec, seed=1, ordering=1)
    assert first != ordering_tasks(POOL, CLASSES, spec, seed=2, ordering=0)
    assert first[0] != first[1]
    assert sample_task(POOL, CLASSES, spec, 1, 0, 2) == first[2]


def test_impossible_tasks_are_refused_with_the_fix():
    with pytest.raises(ValueError, match="multiple of class_change_interval"):
        sample_task(POOL, CLASSES, options(class_change_interval=4), 0, 0, 0)
    with pytest.raises(ValueError, match="needs 42 classes"):
        sample_task(POOL, CLASSES, options(ways=7, class_change_interval=1), 0, 0, 0)
    with pytest.raises(ValueError, match="has 40 samples but a task takes 42"):
        sample_task(POOL, CLASSES, options(class_change_interval=6, shots=4, target_shots=3), 0, 0, 0)


def test_no_class_is_shared_across_the_phases_of_the_omniglot_preset():
    resolved = resolve(load_preset("omniglot-cfsl"))
    tuning, evaluation = set(resolved.tuning.classes), set(resolved.evaluation.classes)
    assert tuning and evaluation and not tuning & evaluation
    assert resolved.pretraining is not None and not set(resolved.pretraining.classes) & (tuning | evaluation)
    spec = CfslOptions.of(resolved.config.scenario.family_options)
    pool = np.repeat(np.arange(242), 20)
    for phase in (resolved.tuning, resolved.evaluation):
        for task in ordering_tasks(pool, phase.classes, spec, resolved.config.seed, 0):
            assert set(task.classes) <= set(phase.classes)


def test_every_cfsl_preset_resolves_with_disjoint_phases_and_pretraining(tmp_path, monkeypatch):
    from PIL import Image

    # SlimageNet64's three splits as gtep ImageFolder roots (a task needs 50 classes in val and in test)
    for split, count in (("train", 5), ("val", 50), ("test", 50)):
        for c in range(count):
            for part in ("train", "val"):
                folder = tmp_path / split / part / f"{split}{c:03d}"
                folder.mkdir(parents=True)
                Image.fromarray(np.zeros((8, 8, 3), dtype=np.uint8)).save(folder / "0.png")
    monkeypatch.setenv("SLIMAGENET_ROOT", str(tmp_path))
    for name in ("omniglot-cfsl", "omniglot-cfsl-cci2", "omniglot-cfsl-overwrite", "slimagenet64-cfsl"):
        resolved = resolve(load_preset(name))
        assert resolved.family.name == "cfsl" and resolved.pretraining is not None, name
        if resolved.tuning.dataset == resolved.evaluation.dataset:
            assert not set(resolved.tuning.classes) & set(resolved.evaluation.classes), name
    slim = resolve(load_preset("slimagenet64-cfsl"))
    assert slim.tuning.dataset.endswith("/val?size=64") and slim.evaluation.dataset.endswith("/test?size=64")
    assert slim.pretraining is not None and len(slim.pretraining.classes) == 5
    assert slim.pipeline("tune").describe() == "pycil-cifar"


def test_config_refuses_a_task_larger_than_a_phase_before_compute():
    doc = load_preset("omniglot-cfsl").model_dump(mode="python")
    doc["scenario"]["cfsl"]["ways"] = 8  # 80 classes a task; tuning has 67
    with pytest.raises(ConfigError) as err:
        resolve(validate_config(doc, "test"))
    assert err.value.field == "scenario.cfsl" and "tune phase has 67" in str(err.value)
    doc["scenario"]["cfsl"].update(ways=5, class_change_interval=3)
    with pytest.raises(ConfigError, match="multiple of class_change_interval"):
        validate_config(doc, "test")


# ---------------------------------------------------------------- metrics

def test_accuracy_and_cross_entropy_by_hand():
    scores = np.array([[2.0, 0.0], [0.0, 0.0], [0.0, 3.0]])
    labels = np.array([0, 1, 0])
    assert cfsl_metrics.accuracy(scores, labels) == pytest.approx(1 / 3)  # the tie goes to label 0, as argmax
    expected = np.mean([math.log(1 + math.exp(-2)), math.log(2), math.log(1 + math.exp(3))])
    assert cfsl_metrics.cross_entropy(scores, labels) == pytest.approx(expected)
    assert cfsl_metrics.cross_entropy(np.array([[1000.0, 0.0]]), np.array([1])) == pytest.approx(1000.0)


def test_atm_is_the_most_held_over_all_seen_in_one_unit():
    # a prototype learner: 5 labels x 64 float32 + 5 float32 counts, after 10 support sets of 5 float32 3x32x32
    # images (the unit the learner receives them in)
    state = [5 * 64 * 4 + 5 * 4] * 10
    assert cfsl_metrics.across_task_memory(state, 10 * 5 * 3 * 32 * 32 * 4) == pytest.approx(1300 / 614400)
    assert cfsl_metrics.across_task_memory([10, 40, 20], 40) == 1.0  # storing every input as received gives 1
    # counted as Eq. 1 writes it: 5 prototypes over 50 support samples (notes 002.3: #classes / #support samples)
    assert cfsl_metrics.across_task_memory([5] * 10, 50) == pytest.approx(0.1)
    with pytest.raises(ValueError):
        cfsl_metrics.across_task_memory([1], 0)


def test_summary_mean_std_and_95_interval_over_tasks():
    out = cfsl_metrics.summarize([0.5, 0.7, 0.9, 0.7], [1.0, 2.0, 3.0, 2.0], [0.1, 0.3, 0.2, 0.2], [1.0, 0.5, 0.5, 0.0],
                                 [10, 20, 30, 40])
    std = math.sqrt(((0.2 ** 2) * 2) / 4)
    assert out["target_acc"] == pytest.approx(0.7) and out["target_acc_task_std"] == pytest.approx(std)
    assert out["target_acc_ci95"] == pytest.approx(1.959963984540054 * std / 2)
    assert out["target_ce"] == pytest.approx(2.0) and out["atm"] == pytest.approx(0.2) and out["macs"] == 25
    assert out["atm_count"] == pytest.approx(0.5)
    aliased = with_aliases(out)
    assert aliased["acc"] == aliased["avg_acc"] == out["target_acc"] and aliased["acc_t"] == [0.5, 0.7, 0.9, 0.7]


def test_the_family_is_registered_with_its_criterion():
    family = FAMILIES.get("cfsl")
    assert isinstance(family, ContinualFewShot) and family.data_flow == "continual_few_shot"
    assert family.default_criterion == "mean_target_acc"
    # both readings of ATM are per-ordering metrics, logged as they are (not as percent)
    assert {"atm", "atm_count"} <= set(family.metric_names) and {"atm", "atm_count"} <= family.plain_metrics
    assert CRITERIA.get("mean_target_acc").of({"target_acc": 0.42}) == 0.42
    assert family.increments({"support_sets": 10, "ways": 5, "shots": 1, "target_shots": 5,
                              "class_change_interval": 2}) == [5] * 5
