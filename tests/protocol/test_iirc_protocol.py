"""IIRC's pure core: task configurations, sample assignment, label rules and metrics (notes 001.1-001.2)."""
from __future__ import annotations

import math

import numpy as np
import pytest

from gtep.protocol.families.iirc import metrics as im
from gtep.protocol.families.iirc.generator import (
    Hierarchy,
    assign_samples,
    evaluation_labels,
    evaluation_targets,
    hold_out,
    iirc_tasks,
    label_kinds,
    multi_hot,
    task_members,
    task_training_indices,
    training_labels,
    training_targets,
)
from gtep.protocol.scenarios import TaskSpec


def cifar_like() -> Hierarchy:
    """IIRC-CIFAR's shape: 15 superclasses over 77 subclasses (4-8 each), 23 standalone, 115 labels."""
    sizes = [8] + [5] * 13 + [4]
    tree, next_id = {}, 100
    for s, size in enumerate(sizes):
        tree[s] = list(range(next_id, next_id + size))
        next_id += size
    return Hierarchy.of(tree, standalone=range(500, 523))


# ---------------------------------------------------------------- task configurations

def check_tasks(h: Hierarchy, tasks: list[TaskSpec], first: int, per_task: int) -> None:
    assert set(tasks[0].new_classes) <= set(h.superclasses) and len(tasks[0].new_classes) == first
    ordered = [c for t in tasks for c in t.new_classes]
    assert sorted(ordered) == sorted(h.classes) and len(ordered) == len(set(ordered))  # each class once
    task_of = {c: t.index for t in tasks for c in t.new_classes}
    for sub, sup in h.parent.items():
        assert task_of[sup] < task_of[sub]  # strictly earlier task
    assert all(len(t.new_classes) == per_task for t in tasks[1:-1])
    seen: list[int] = []
    for i, t in enumerate(tasks):
        seen += t.new_classes
        assert t.index == i and t.seen_classes == tuple(seen)


def test_cifar_like_configurations_keep_the_invariants():
    h = cifar_like()
    assert len(h.classes) == 115 and len(h.subclasses) == 100
    orders = []
    for ordering in range(10):
        tasks = iirc_tasks(h, 10, 5, seed=7, ordering=ordering)
        assert len(tasks) == 22  # 10 + 21 * 5 = 115
        check_tasks(h, tasks, 10, 5)
        orders.append([c for t in tasks for c in t.new_classes])
    assert len({tuple(o) for o in orders}) == 10  # orderings differ
    assert iirc_tasks(h, 10, 5, seed=7, ordering=3) == iirc_tasks(h, 10, 5, seed=7, ordering=3)
    assert iirc_tasks(h, 10, 5, seed=8, ordering=3) != iirc_tasks(h, 10, 5, seed=7, ordering=3)
    # later tasks do mix superclasses with subclasses (and standalone ones)
    later = [c for t in iirc_tasks(h, 10, 5, 7, 0)[1:] for c in t.new_classes]
    assert {c for c in later if c in h.superclasses} and {c for c in later if c in h.standalone}


def test_a_shorter_last_task_and_a_tight_hierarchy():
    # A and B with four subclasses each, one superclass first, tasks of 4: after task 0 = {A}, task 1 must
    # take B, or task 2 could only hold B's locked subclasses. Every ordering still completes.
    h = Hierarchy.of({0: [1, 2, 3, 4], 10: [11, 12, 13, 14]})
    for ordering in range(20):
        tasks = iirc_tasks(h, 1, 4, seed=0, ordering=ordering)
        assert [len(t.new_classes) for t in tasks] == [1, 4, 4, 1]
        check_tasks(h, tasks, 1, 4)


def test_impossible_configurations_are_refused():
    with pytest.raises(ValueError):  # task 1 would need B together with its own subclass
        iirc_tasks(Hierarchy.of({0: [1], 10: [11]}), 1, 3, seed=0, ordering=0)
    with pytest.raises(ValueError):
        iirc_tasks(Hierarchy.of({0: [1]}), 2, 1, seed=0, ordering=0)
    with pytest.raises(ValueError):
        Hierarchy.of({0: [1, 2], 3: [2]})  # a subclass under two superclasses


# ---------------------------------------------------------------- sample assignment

def synthetic_labels(subclasses, per_class: int, seed: int = 0) -> np.ndarray:
    labels = np.repeat(np.asarray(subclasses), per_class)
    return np.random.default_rng(seed).permutation(labels)


def test_assignment_counts_follow_the_notes():
    h = Hierarchy.of({100: range(1, 9), 200: range(11, 16), 300: range(21, 31)}, standalone=[40, 41])
    labels = synthetic_labels(h.subclasses, 400)
    per_class = assign_samples(labels, h, seed=3)
    for sub in h.parent:
        assert len(per_class[sub]) == 320 and np.all(labels[per_class[sub]] == sub)
    assert len(per_class[100]) == 8 * 160 == 1280
    assert len(per_class[200]) == 5 * 160 == 800
    assert len(per_class[300]) == 10 * 128  # (8/10) * 40% of 400 from each of its 10 subclasses
    assert len(per_class[40]) == len(per_class[41]) == 400
    for sup, subs in h.superclasses.items():
        assert set(labels[per_class[sup]]) == set(subs)
        assert len(np.unique(per_class[sup])) == len(per_class[sup])
    for sub in range(1, 9):  # 20% of a subclass's images are seen under both labels
        of_sub = set(np.flatnonzero(labels == sub))
        both = set(per_class[sub]) & set(per_class[100])
        assert len(both) == 80 and both <= of_sub
        assert set(per_class[sub]) | (set(per_class[100]) & of_sub) == of_sub  # nothing left out
    for sub in range(21, 31):  # capped: 320 + 128 - 400 = 48 in both
        assert len(set(per_class[sub]) & set(per_class[300])) == 48


def test_assignment_reproduces_table_1_and_is_seeded():
    h = cifar_like()
    labels = synthetic_labels(h.subclasses, 400)
    per_class = assign_samples(labels, h, seed=0)
    assert sum(len(v) for v in per_class.values()) == 23 * 400 + 77 * 320 + 77 * 160 == 46_160
    assert len(np.unique(np.concatenate(list(per_class.values())))) == 40_000
    again, other = assign_samples(labels, h, seed=0), assign_samples(labels, h, seed=1)
    assert all(np.array_equal(per_class[c], again[c]) for c in h.classes)
    assert not np.array_equal(per_class[100], other[100])
    assert np.array_equal(per_class[500], other[500])  # standalone: all of them, whatever the seed


def test_odd_counts_round_down():
    h = Hierarchy.of({9: [1]})
    per_class = assign_samples(np.array([1] * 7), h, seed=0)
    assert len(per_class[1]) == 5 and len(per_class[9]) == 2  # floor(5.6), floor(2.8)


# ---------------------------------------------------------------- labels

def test_training_labels_carry_only_the_current_task():
    h = Hierarchy.of({10: [11, 12]}, standalone=[20])
    assert h.full_labels(11) == {10, 11} and h.full_labels(20) == {20}
    # superclass 10 in task 0, subclass 11 in task 1: in task 1 a sample of 11 is labelled 11 only
    assert training_labels(h.full_labels(11), [11, 20]) == {11}
    assert training_labels(h.full_labels(11), [10]) == {10}
    index = [10, 11, 12, 20]
    assert training_targets([11, 20], h, [11, 20], index).tolist() == [[False, True, False, False],
                                                                       [False, False, False, True]]


def test_evaluation_labels_are_complete_over_observed_classes():
    h = Hierarchy.of({10: [11, 12]}, standalone=[20])
    assert evaluation_labels(h.full_labels(11), [10, 11, 20]) == {10, 11}  # both once both were observed
    assert evaluation_labels(h.full_labels(12), [10, 11, 20]) == {10}  # unseen subclass: superclass only
    assert evaluation_labels(h.full_labels(20), [10]) == frozenset()
    index = [10, 11, 12, 20]
    assert evaluation_targets([11, 12], h, [10, 11], index).tolist() == [[True, True, False, False],
                                                                         [True, False, False, False]]
    with pytest.raises(KeyError):
        multi_hot([{99}], index)


def test_task_training_indices_and_members():
    h = Hierarchy.of({10: [11, 12]}, standalone=[20])
    tasks = [TaskSpec(0, (10,), (10,)), TaskSpec(1, (11, 20), (10, 11, 20)), TaskSpec(2, (12,), (10, 11, 20, 12))]
    labels = synthetic_labels([11, 12, 20], 10)
    per_class = assign_samples(labels, h, seed=0)
    assert np.array_equal(task_training_indices(per_class, tasks[1]), np.sort(np.r_[per_class[11], per_class[20]]))
    members = task_members(np.array([11, 12, 20]), h, tasks)
    assert [m.tolist() for m in members] == [[True, True, False], [True, False, True], [False, True, False]]


# ---------------------------------------------------------------- metrics

def rows(*sets, n=5):
    return multi_hot(list(sets), list(range(n)))


def test_metrics_on_hand_computed_cases():
    # target, prediction, (exact, JS, precision, pw-JS)
    cases = [
        ({0, 1}, {1, 2}, (0, 1 / 3, 1 / 2, 1 / 6)),  # partial overlap
        ({0, 1}, {0}, (0, 1 / 2, 1, 1 / 2)),  # superclass only, for a superclass + subclass sample
        ({0}, {0, 2, 3}, (0, 1 / 3, 1 / 3, 1 / 9)),  # over-prediction, punished twice by pw-JS
        ({0, 1}, set(), (0, 0, 0, 0)),  # empty prediction
        ({0, 1}, {0, 1}, (1, 1, 1, 1)),  # perfect
        (set(), set(), (1, 1, 1, 1)),  # nothing to predict, nothing predicted
        (set(), {4}, (0, 0, 0, 0)),
    ]
    y, p = rows(*[c[0] for c in cases]), rows(*[c[1] for c in cases])
    expected = np.array([c[2] for c in cases], dtype=float)
    assert np.allclose(im.sample_exact_match(p, y), expected[:, 0])
    assert np.allclose(im.sample_jaccard(p, y), expected[:, 1])
    assert np.allclose(im.sample_precision(p, y), expected[:, 2])
    assert np.allclose(im.sample_pw_jaccard(p, y), expected[:, 3])
    assert im.exact_match(p, y) == pytest.approx(expected[:, 0].mean())
    assert im.jaccard(p, y) == pytest.approx(expected[:, 1].mean())
    assert im.precision(p, y) == pytest.approx(expected[:, 2].mean())
    assert im.pw_jaccard(p, y) == pytest.approx(expected[:, 3].mean())
    assert im.pw_jaccard(rows({0}), rows({0})) == 1.0  # a single sample
    assert math.isnan(im.pw_jaccard(np.zeros((0, 3), bool), np.zeros((0, 3), bool)))
    with pytest.raises(ValueError):
        im.jaccard(np.zeros((2, 3), bool), np.zeros((2, 4), bool))


def test_task_matrix_and_summary_through_the_label_rules():
    h = Hierarchy.of({10: [11, 12]}, standalone=[20])
    tasks = [TaskSpec(0, (10,), (10,)), TaskSpec(1, (11, 20), (10, 11, 20)), TaskSpec(2, (12,), (10, 11, 20, 12))]
    index = [10, 11, 12, 20]
    samples = np.array([11, 12, 20])  # one test image per subclass
    members = task_members(samples, h, tasks)
    targets = [evaluation_targets(samples, h, t.seen_classes, index) for t in tasks]
    assert [sorted(index[j] for j in np.flatnonzero(r)) for r in targets[1]] == [[10, 11], [10], [20]]
    predictions = [multi_hot(p, index) for p in (
        [{10}, {10}, {10}],  # after task 0: image of 20 is not evaluated yet
        [{11}, {10, 11}, {20}],  # pw-JS 1/2 (forgot 10), 1/4 (extra 11), 1
        [{10, 11}, {12}, set()],  # 1, 1/2 (forgot 10), 0 (empty)
    )]
    r = im.task_matrix(predictions, targets, members)
    nan = float("nan")
    assert np.allclose(r, [[1, nan, nan], [0.375, 0.75, nan], [0.75, 0.5, 0.5]], equal_nan=True)
    out = im.summarize(predictions, targets, members)
    assert out["pw_js_t"] == pytest.approx([1, 1.75 / 3, 0.5])
    assert out["pw_js"] == pytest.approx(0.5)
    assert out["mean_pw_js"] == pytest.approx((1 + 1.75 / 3 + 0.5) / 3)
    assert out["js_t"] == pytest.approx([1, 2 / 3, 0.5]) and out["js"] == pytest.approx(0.5)
    assert out["exact_match_t"] == pytest.approx([1, 1 / 3, 1 / 3]) and out["exact_match"] == pytest.approx(1 / 3)
    assert out["precision_t"] == pytest.approx([1, 2.5 / 3, 2 / 3])
    assert out["pw_js_current_t"] == pytest.approx([1, 0.75, 0.5])
    assert set(im.METRIC_NAMES) <= set(out) and set(im.CURVE_METRICS) <= set(out)
    # members as index arrays give the same matrix
    as_indices = [np.flatnonzero(m) for m in members]
    assert np.allclose(im.task_matrix(predictions, targets, as_indices), r, equal_nan=True)


# ---------------------------------------------------------------- in-task validation split (issue 31)

def test_the_in_task_validation_split_is_seeded_and_never_trained_on():
    h = Hierarchy.of({10: [0, 1]}, standalone=[2, 3, 4])
    labels = np.concatenate([np.repeat([0, 1, 2], 20), [3] * 3, [4]])  # 20, 20, 20, 3 and 1 images
    held = hold_out(labels, h.subclasses, 0.1, seed=5)
    counts = [int((held & (labels == c)).sum()) for c in range(5)]
    assert counts == [2, 2, 2, 1, 0]  # floor(10% n), at least one of a class of 2 or more, never a class's only one
    assert np.array_equal(held, hold_out(labels, h.subclasses, 0.1, seed=5))
    assert not np.array_equal(held, hold_out(labels, h.subclasses, 0.1, seed=6))
    assert not hold_out(labels, h.subclasses, 0.0, seed=5).any()
    # both parts are assigned as the paper assigns training images; no held-out image is a training image
    train = assign_samples(np.where(held, -1, labels), h, seed=5)
    validation = assign_samples(np.where(held, labels, -1), h, seed=5)
    trained = np.concatenate(list(train.values()))
    assert not held[trained].any() and held[np.concatenate(list(validation.values()))].all()
    assert len(train[0]) == 14 and len(train[10]) == 2 * 7  # 80% and 40% of the 18 left
    assert len(validation[0]) == 1 and len(validation[2]) == 2  # floor(80% of 2); standalone: all


# ---------------------------------------------------------------- diagnostics (paper App. D.2-D.3, issue 31)

def diagnostic_case():
    h = Hierarchy.of({10: [11, 12], 30: [31]}, standalone=[20, 21])
    index = [10, 30, 11, 12, 31, 20, 21]
    pairs = [  # (target, prediction): superclass pw-JS, precision with a superclass, standalone precision
        ({10, 11}, {10, 12}),  # 1; 0 (12 for 11); - (none predicted)
        ({10, 12}, {12, 20}),  # 0 (forgot 10); 1; 0 (20 is wrong)
        ({20}, {20, 10}),  # - (no superclass to carry, the wrong 10 aside); -; 1
        ({21}, {20, 21}),  # -; -; 1/2
        ({10, 11}, {10, 11, 21}),  # 1; 1; 0
        ({30, 31}, {10, 30}),  # JS 1/2 x precision 1/2 = 1/4; -; -
    ]
    y = multi_hot([t for t, _ in pairs], index)
    p = multi_hot([q for _, q in pairs], index)
    return h, index, p, y


def test_label_kinds_mark_superclasses_and_both_types_of_subclass():
    h, index, _, _ = diagnostic_case()
    kinds = label_kinds(h, index)
    assert kinds["superclass"].tolist() == [True, True, False, False, False, False, False]
    assert kinds["with_super"].tolist() == [False, False, True, True, True, False, False]
    assert kinds["standalone"].tolist() == [False, False, False, False, False, True, True]


def test_superclass_pw_js_and_precision_by_subclass_type_on_hand_computed_cases():
    h, index, p, y = diagnostic_case()
    kinds = label_kinds(h, index)
    assert im.superclass_pw_jaccard(p, y, kinds["superclass"]) == pytest.approx((1 + 0 + 1 + 0.25) / 4)
    assert im.precision_among(p, y, kinds["with_super"]) == pytest.approx((0 + 1 + 1) / 3)
    assert im.precision_among(p, y, kinds["standalone"]) == pytest.approx((0 + 1 + 0.5 + 0) / 4)
    assert im.diagnostics(p, y, kinds) == {
        "superclass_pw_js": pytest.approx(0.5625), "subclass_precision_with_super": pytest.approx(2 / 3),
        "subclass_precision_standalone": pytest.approx(0.375)}
    assert math.isnan(im.precision_among(p[:1], y[:1], kinds["standalone"]))  # nothing of the kind predicted
    with pytest.raises(ValueError):
        im.precision_among(p, y, kinds["standalone"][:3])


def test_the_summary_carries_the_diagnostics_after_each_task():
    h = Hierarchy.of({10: [11, 12]}, standalone=[20])
    tasks = [TaskSpec(0, (10,), (10,)), TaskSpec(1, (11, 20), (10, 11, 20)), TaskSpec(2, (12,), (10, 11, 20, 12))]
    index = [10, 11, 12, 20]
    samples = np.array([11, 12, 20])
    members = task_members(samples, h, tasks)
    targets = [evaluation_targets(samples, h, t.seen_classes, index) for t in tasks]
    predictions = [multi_hot(p, index) for p in (
        [{10}, {10}, {10}],  # super 1 (the image of 20 is not evaluated yet); no subclass predicted
        [{11}, {10, 11}, {20}],  # super (0 + 1) / 2; with super (1 + 0) / 2; standalone 1
        [{10, 11}, {12}, set()],  # super (1 + 0) / 2; with super 1; standalone: none predicted
    )]
    out = im.summarize(predictions, targets, members, label_kinds(h, index))
    nan = float("nan")
    assert np.allclose(out["superclass_pw_js_t"], [1, 0.5, 0.5])
    assert np.allclose(out["subclass_precision_with_super_t"], [nan, 0.5, 1], equal_nan=True)
    assert np.allclose(out["subclass_precision_standalone_t"], [nan, 1, nan], equal_nan=True)
    assert out["superclass_pw_js"] == 0.5 and out["subclass_precision_with_super"] == 1
    assert math.isnan(out["subclass_precision_standalone"])
    assert set(im.METRIC_NAMES) <= set(out) and set(im.CURVE_METRICS) <= set(out)
    without = im.summarize(predictions, targets, members)  # no label kinds: the diagnostics are NaN
    assert math.isnan(without["superclass_pw_js"]) and out["pw_js_t"] == without["pw_js_t"]
