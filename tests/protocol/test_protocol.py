"""The protocol core against hand-computed values."""
import math

import numpy as np
import pytest

from gtep.protocol import metrics, sampling, scenarios, selection


def test_parse_increments_forms():
    assert scenarios.parse_increments("10x10") == [10] * 10
    assert scenarios.parse_increments("C50xT1+C10xT5") == [50, 10, 10, 10, 10, 10]
    assert scenarios.parse_increments([5, 3]) == [5, 3]
    with pytest.raises(ValueError, match="cannot read"):
        scenarios.parse_increments("ten by ten")
    with pytest.raises(ValueError):
        scenarios.parse_increments([])


def test_orderings_are_seeded_and_distinct():
    classes = list(range(20))
    a = scenarios.class_ordering(classes, seed=0, ordering=0)
    assert a == scenarios.class_ordering(classes, seed=0, ordering=0)
    assert sorted(a) == classes
    assert a != scenarios.class_ordering(classes, seed=0, ordering=1)
    assert a != scenarios.class_ordering(classes, seed=1, ordering=0)


def test_split_tasks_seen_and_old():
    tasks = scenarios.split_tasks([4, 2, 9, 7, 1], [3, 2])
    assert tasks[0].new_classes == (4, 2, 9) and tasks[0].old_classes == ()
    assert tasks[1].new_classes == (7, 1)
    assert tasks[1].seen_classes == (4, 2, 9, 7, 1)
    assert tasks[1].old_classes == (4, 2, 9)
    with pytest.raises(ValueError, match="sum to 6"):
        scenarios.split_tasks([1, 2, 3, 4, 5], [3, 3])


def test_phase_split_disjoint_and_groups():
    a, b = scenarios.split_classes_in_two(range(10), seed=3, first=4, second=5)
    assert len(a) == 4 and len(b) == 5 and not set(a) & set(b)
    groups = ["x", "x", "y", "y", "y", "z"]
    t, e = scenarios.split_groups_in_two(groups, seed=0, tuning_groups=["y"])
    assert t == [2, 3, 4] and e == [0, 1, 5]
    t2, e2 = scenarios.split_groups_in_two(groups, seed=0)
    assert sorted(t2 + e2) == list(range(6)) and not set(t2) & set(e2)
    assert scenarios.shared_classes([1, 2], [2, 3]) == [2]


def test_groups_in_neither_phase_are_kept_out():
    groups = ["x", "x", "y", "y", "y", "z", "w"]
    t, e = scenarios.split_groups_in_two(groups, seed=0, tuning_groups=["y"], evaluation_groups=["w", "x"])
    assert t == [2, 3, 4] and e == [0, 1, 6]  # z (class 5) is in neither phase
    with pytest.raises(ValueError, match=r"\['y'\] are in both phases"):
        scenarios.split_groups_in_two(groups, seed=0, tuning_groups=["y"], evaluation_groups=["y", "z"])
    with pytest.raises(ValueError, match="unknown groups"):
        scenarios.split_groups_in_two(groups, seed=0, tuning_groups=["y"], evaluation_groups=["v"])


def test_milestone_rule_matches_appendix():
    assert sampling.steplr_milestones(100, 2) == [40, 80]
    assert sampling.steplr_milestones(70, 3) == [20, 40, 60]
    assert sampling.steplr_milestones(90, 4) == [20, 40, 60, 80]


def test_sampling_is_seeded_and_from_the_sets():
    space = sampling.SearchSpace({"lr": (0.1, 0.2, 0.3), "scheduler": ("steplr", "cosine")})
    a = sampling.sample_sets(space, 30, seed=7)
    assert a == sampling.sample_sets(space, 30, seed=7)
    assert a != sampling.sample_sets(space, 30, seed=8)
    assert all(s["lr"] in (0.1, 0.2, 0.3) and s["scheduler"] in ("steplr", "cosine") for s in a)
    assert {s["lr"] for s in a} == {0.1, 0.2, 0.3}
    with pytest.raises(ValueError):
        sampling.SearchSpace({})
    with pytest.raises(ValueError, match="empty value set"):
        sampling.SearchSpace({"lr": ()})
    with pytest.raises(ValueError):
        sampling.sample_sets(space, 0, seed=0)


def test_milestones_unused_under_cosine():
    h = {"epochs": 10, "milestone_num": 2, "lr_decay": 0.1, "scheduler": "cosine"}
    assert sampling.effective_hyperparameters(h) == {"epochs": 10, "scheduler": "cosine"}
    assert sampling.effective_hyperparameters({**h, "scheduler": "steplr"})["milestone_num"] == 2


def test_metrics_hand_computed():
    # two tasks; task 0 has 10 test images, task 1 has 30
    matrix = np.array([[0.8, np.nan], [0.5, 0.9]])
    acc_t = metrics.accuracy_after_each_task(matrix, [10, 30])
    assert acc_t == pytest.approx([0.8, (0.5 * 10 + 0.9 * 30) / 40])
    s = metrics.summarize(matrix, [10, 30])
    assert s["acc"] == pytest.approx(0.8)
    assert s["avg_acc"] == pytest.approx(0.8)
    assert s["hmean"] == pytest.approx(0.8)
    assert s["forgetting"] == pytest.approx(0.3)
    assert s["old_acc"] == pytest.approx(0.5) and s["new_acc"] == pytest.approx(0.9)
    assert metrics.harmonic_mean(0.6, 0.3) == pytest.approx(0.4)
    assert metrics.harmonic_mean(0, 0) == 0
    assert math.isnan(metrics.harmonic_mean(float("nan"), 0.5))


def test_selection_rule_diverged_and_ties():
    R = selection.OrderingResult
    results = [
        R(0, 0, 0.5, 0.7), R(0, 1, 0.3, 0.5),          # means 0.4 / 0.6 -> hm 0.48
        R(1, 0, 0.6, 0.9), R(1, 1, 0.6, 0.9, True),    # diverged -> excluded
        R(2, 0, 0.45, 0.55), R(2, 1, 0.45, 0.55),      # hm 0.495
    ]
    chosen = selection.select_best(results)
    assert chosen.best_index == 2
    by_index = {s.set_index: s for s in chosen.scores}
    assert by_index[0].hmean_of_means == pytest.approx(0.48)
    assert by_index[0].mean_of_hmeans == pytest.approx((2 * .5 * .7 / 1.2 + 2 * .3 * .5 / .8) / 2)
    assert math.isnan(by_index[1].hmean_of_means) and by_index[1].diverged_orderings == 1
    tie = selection.select_best([R(3, 0, 0.5, 0.5), R(1, 0, 0.5, 0.5)])
    assert tie.best_index == 1
    with pytest.raises(selection.AllSetsDivergedError, match="all 1"):
        selection.select_best([R(0, 0, 0.1, 0.1, True)])


def test_an_incomplete_set_never_wins_whatever_its_finished_orderings_scored():
    R = selection.OrderingResult
    results = [R(0, 0, 0.9, 0.9), R(1, 0, 0.4, 0.5), R(1, 1, 0.5, 0.4), R(2, 0, 0.3, 0.3), R(2, 1, 0.3, 0.3)]
    chosen = selection.select_best(results, expected_orderings=2, sets=[0, 1, 2, 3])
    assert chosen.best_index == 1
    status = {s.set_index: (s.status, s.finished_orderings) for s in chosen.scores}
    assert status == {0: ("incomplete", 1), 1: ("complete", 2), 2: ("complete", 2), 3: ("incomplete", 0)}
    # without S, a set's orderings are all there is (the old behaviour, used only where S is unknown)
    assert selection.select_best(results).best_index == 0


def test_no_eligible_set_says_how_many_were_incomplete_or_diverged():
    R = selection.OrderingResult
    results = [R(0, 0, 0.9, 0.9), R(1, 0, 0.4, 0.5, True), R(1, 1, 0.5, 0.4)]
    with pytest.raises(selection.NoEligibleSetError) as err:
        selection.select_best(results, expected_orderings=3, sets=[0, 1, 2])
    message = str(err.value)
    assert "2 of 3 sets are incomplete (set 0: 1/3, set 2: 0/3) and 1 diverged" in message
    assert "--resume" in message and "add trials" in message
