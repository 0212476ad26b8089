"""Scenario families and H*'s criteria: the generator F made pluggable (gtep/protocol/families/, criteria.py),
the experiment file's family sections, and FSCIL's few-shot sessions through the engine."""
import json
import math

import numpy as np
import pytest

from gtep.algorithms import ALGORITHMS
from gtep.config import ConfigError, ExperimentConfig, resolve
from gtep.data.shot_index import read_shot_index
from gtep.engine.runner import OrderingRun
from gtep.protocol.criteria import CRITERIA
from gtep.protocol.families import ACC, AVG_ACC, FAMILIES, ScenarioFamily, register_family
from gtep.protocol.families.fscil import check_shot_index, few_shot_indices
from gtep.protocol.scenarios import TaskSpec, build_scenario
from gtep.protocol.selection import OrderingResult, select_best
from tests.helpers import FSCIL, fscil_experiment, load, small_job

# ---------------------------------------------------------------- generators

@pytest.mark.parametrize("seed,ordering", [(0, 0), (0, 3), (7, 1)])
def test_class_incremental_family_gives_the_orderings_it_always_gave(seed, ordering):
    family = FAMILIES.get("class_incremental")
    assert family.tasks(range(30), {"increments": "C10xT1+C5xT4"}, seed, ordering) == \
        build_scenario(range(30), [10, 5, 5, 5, 5], seed, ordering)


def test_fscil_sessions_a_base_with_all_images_then_n_way_k_shot():
    tasks = FAMILIES.get("fscil").tasks(range(10), FSCIL, 0, 1)
    assert [len(t.new_classes) for t in tasks] == [6, 2, 2]
    assert [t.shots for t in tasks] == [None, 3, 3]
    assert tasks[-1].seen_classes == tuple(c for t in tasks for c in t.new_classes)
    assert sorted(tasks[-1].seen_classes) == list(range(10))
    other = FAMILIES.get("fscil").tasks(range(10), FSCIL, 0, 2)
    assert other[0].new_classes != tasks[0].new_classes  # orderings shuffle the classes
    fixed = FAMILIES.get("fscil").tasks(range(10), {**FSCIL, "fixed_order": True}, 0, 2)
    assert fixed[0].new_classes == tuple(range(6))  # the benchmarks' split: base = the first classes


def test_few_shot_draws_are_k_per_class_seeded_per_ordering_and_index_files_win():
    labels = np.repeat(np.arange(4), 20)
    task = TaskSpec(1, (2, 3), (0, 1, 2, 3), shots=5)
    first = few_shot_indices(labels, task, seed=0, ordering=0)
    assert len(first) == 10 and list(np.bincount(labels[first], minlength=4)) == [0, 0, 5, 5]
    assert np.array_equal(first, few_shot_indices(labels, task, seed=0, ordering=0))  # the same for every set
    assert not np.array_equal(first, few_shot_indices(labels, task, seed=0, ordering=1))
    given = {2: [40, 41, 42, 43, 44, 45]}
    picked = few_shot_indices(labels, task, 0, 0, given)
    assert set(picked[labels[picked] == 2]) == {40, 41, 42, 43, 44}  # the file's first K of class 2
    assert len(picked[labels[picked] == 3]) == 5  # a class the file leaves out is drawn
    all_images = few_shot_indices(labels, TaskSpec(0, (0, 1), (0, 1)), 0, 0)
    assert len(all_images) == 40  # a base session takes every image


def test_shot_index_files_are_read_and_checked(tmp_path):
    path = tmp_path / "shots.json"
    path.write_text(json.dumps({"2": [40, 41, 42], "3": [60, 5]}))
    given = read_shot_index(path)
    labels = np.repeat(np.arange(4), 20)
    assert given == {2: [40, 41, 42], 3: [60, 5]}
    assert "class 3: training images [5]" in check_shot_index(given, labels, [2, 3], 2)
    assert "fewer than 3" in check_shot_index({2: [40, 41]}, labels, [2], 3)
    assert check_shot_index({2: [40, 41, 42]}, labels, [2], 3) is None
    assert "classes [3]" in check_shot_index({2: [40, 41, 42]}, labels, [2, 3], 3)  # a class the file omits
    assert "draw_missing_shots" in check_shot_index({2: [40, 41, 42]}, labels, [2, 3], 3)
    assert check_shot_index({2: [40, 41, 42]}, labels, [2, 3], 3, draw_missing=True) is None
    assert "twice" in check_shot_index({2: [40, 40, 41]}, labels, [2], 2)
    assert "outside" in check_shot_index({2: [400]}, labels, [2], 1)


def test_shot_index_positions_are_the_datasets_not_the_phases():
    """A benchmark's index file indexes the dataset's training arrays; a phase keeps a subset of them, so the
    runner maps the file's positions onto the subset's (the old code used them as subset positions: the image
    at dataset position 45 is the phase's 5th image of class 2 when the phase keeps classes 2 and 3 only)."""
    from gtep.data import ImageSet
    from gtep.protocol.families.fscil import shots_at_phase_positions

    labels = np.repeat(np.arange(4), 20)
    x = np.arange(80, dtype=np.uint8).reshape(80, 1, 1, 1).repeat(3, axis=-1)
    phase = ImageSet("t", x, labels, x[:4], np.arange(4), ["a", "b", "c", "d"]).subset([2, 3])
    positions = shots_at_phase_positions({2: [45, 47], 3: [60]}, phase.dataset_train_index())
    assert positions == {2: [5, 7], 3: [20]}
    assert [int(phase.x_train[i, 0, 0, 0]) for i in positions[2]] == [45, 47]  # the very images the file names


# ---------------------------------------------------------------- criteria and selection

def result(set_index, ordering, acc, avg_acc, gacc):
    return OrderingResult(set_index, ordering, acc, avg_acc, metrics={"acc": acc, "avg_acc": avg_acc,
                                                                      "gacc_auc": gacc})


def test_the_criterion_decides_h_star_and_both_rules_agree_on_a_one_metric_criterion():
    # set 0 keeps the base classes (high Acc, AvgAcc) but learns no novel class (low gAcc AUC): the "Lazy"
    # model the FSCIL paper warns of; set 1 learns the novel classes at some cost in Acc
    results = [result(0, s, 0.60, 0.70, 0.30) for s in range(2)] + [result(1, s, 0.50, 0.60, 0.45) for s in range(2)]
    assert select_best(results, expected_orderings=2).best_index == 0
    by_gacc = select_best(results, expected_orderings=2, criterion=CRITERIA.get("gacc_auc"))
    assert by_gacc.best_index == 1
    assert by_gacc.best.hmean_of_means == pytest.approx(0.45) == by_gacc.best.mean_of_hmeans
    assert by_gacc.best.criterion == "gacc_auc"


def test_the_default_criterion_is_the_papers_harmonic_mean():
    results = [result(0, 0, 0.4, 0.6, math.nan), result(0, 1, 0.5, 0.7, math.nan)]
    score = select_best(results, expected_orderings=2).best
    assert score.hmean_of_means == pytest.approx(2 * 0.45 * 0.65 / (0.45 + 0.65))
    assert score.mean_of_hmeans == pytest.approx((2 * .4 * .6 / 1.0 + 2 * .5 * .7 / 1.2) / 2)


def test_a_criterion_missing_from_an_ordering_makes_no_set_eligible():
    results = [OrderingResult(0, 0, 0.5, 0.6)]
    with pytest.raises(Exception, match="diverged|finished"):
        select_best(results, expected_orderings=1, criterion=CRITERIA.get("gacc_auc"))


# ---------------------------------------------------------------- the experiment file



def test_an_fscil_experiment_resolves_with_its_family_and_criterion(tmp_path):
    resolved = resolve(ExperimentConfig(**fscil_experiment(tracking={"output": str(tmp_path)})))
    assert resolved.increments == (6, 2, 2)
    assert resolved.family.name == "fscil" and resolved.criterion.name == "gacc_auc"
    other = resolve(ExperimentConfig(**fscil_experiment(search={"criterion": "aacc"},
                                                        tracking={"output": str(tmp_path)})))
    assert other.criterion.name == "aacc"
    assert ExperimentConfig(**fscil_experiment()).scenario.describe() == "fscil 6+2x2-way 3-shot"


@pytest.mark.parametrize("changes,field,words", [
    ({"scenario": {"family": "open_world", "increments": "5x2"}}, "scenario", "choose from"),
    ({"scenario": {"family": "fscil"}}, "scenario", "needs its section"),
    ({"scenario": {"family": "fscil", "increments": "5x2", "fscil": FSCIL}}, "scenario", "remove increments"),
    ({"scenario": {"increments": "5x2", "fscil": FSCIL}}, "scenario", "needs family: fscil"),
    ({"scenario": {"family": "fscil", "fscil": {**FSCIL, "shots": 0}}}, "scenario.fscil.shots", "greater than"),
    ({"scenario": {"family": "fscil", "fscil": {**FSCIL, "shot_index": "/nowhere.json"}}}, "scenario.fscil.shot_index",
     "does not exist"),
])
def test_bad_family_sections_are_one_clear_error(changes, field, words):
    with pytest.raises(ConfigError) as err:
        from gtep.config import _validate

        _validate(fscil_experiment(**changes), "test")
    assert field in str(err.value) and words in str(err.value)


@pytest.mark.parametrize("changes,field,words", [
    ({"search": {"criterion": "best_vibes"}}, "search.criterion", "choose from"),
    ({"scenario": {"increments": "5x2"}, "search": {"criterion": "gacc_auc"},
      "datasets": {"split": {"dataset": "synthetic:classes=24,train=20,test=5", "classes_per_phase": 10}}},
     "search.criterion", "does not report"),
    ({"scenario": {"family": "fscil", "fscil": {**FSCIL, "sessions": 5}}}, "scenario.fscil", "take 16 classes"),
])
def test_criteria_and_sessions_are_checked_before_any_compute(tmp_path, changes, field, words):
    with pytest.raises(ConfigError) as err:
        resolve(ExperimentConfig(**fscil_experiment(**changes, tracking={"output": str(tmp_path)})))
    assert err.value.field == field and words in str(err.value)
    assert not any(tmp_path.iterdir())  # nothing written


def test_an_algorithm_without_the_familys_data_flow_is_refused_naming_who_can(tmp_path):
    @register_family
    class OpenWorld(ScenarioFamily):
        name = "test_open_world"
        description = "a family whose data no learner here can learn from"
        data_flow = "test_open_world_stream"
        Options = dict
        metrics = (ACC, AVG_ACC)
        default_criterion = "hmean_acc_avgacc"

        def increments(self, options):
            return [5, 5]

        def data_classes(self, options):
            return ()

        def check(self, phases, options):
            return []

        def describe(self, phase, options, seed):
            return []

        def example_options(self):
            return {}

    try:
        with pytest.raises(ConfigError) as err:
            resolve(ExperimentConfig(**fscil_experiment(scenario={"family": "test_open_world"},
                                                  tracking={"output": str(tmp_path)})))
        assert err.value.field == "algorithm"
        assert "replay cannot run the test_open_world family's data (test_open_world_stream)" in str(err.value)
        assert "algorithms that can: none" in str(err.value)
    finally:
        FAMILIES._entries.pop("test_open_world")


# ---------------------------------------------------------------- through the engine

def fscil_job(algorithm, **options):
    job, data = small_job(algorithm, dataset="synthetic:classes=10,train=40,test=20", increments=(6, 2, 2),
                          epochs=2, memory_size=30, **options)
    from dataclasses import replace

    return replace(job, family="fscil", family_options=tuple(sorted({**FSCIL, "shots": 3}.items()))), data


def test_few_shot_sessions_reach_the_learner_as_k_images_per_class():
    job, data = fscil_job("replay")
    run = OrderingRun(job, data)
    sizes = [len(run.task_data(t).y) for t in run.tasks]
    assert sizes == [6 * 40, 2 * 3, 2 * 3]
    again = OrderingRun(job, data)  # the same shots for every set of the study
    assert np.array_equal(run.task_data(run.tasks[1]).y.numpy(), again.task_data(again.tasks[1]).y.numpy())


RESNET_METHODS = ["replay", "icarl", "bic", "wa", "podnet", "der", "foster", "memo", "beef", "frozen_prototypes"]


@pytest.mark.parametrize("algorithm", RESNET_METHODS)
def test_the_resnet_methods_run_fscil_sessions_smaller_than_a_batch(algorithm):
    from gtep.engine import run_ordering

    job, data = fscil_job(algorithm)
    outcome = run_ordering(job, data)
    assert outcome.status == "finished", outcome.message
    assert len(outcome.acc_matrix) == 3
    assert {"gacc_auc", "aacc", "novel_acc", "gacc_alpha"} <= set(outcome.metrics)
    assert len(outcome.metrics["gacc_alpha"]) == 13
    assert 0 <= outcome.metrics["gacc_auc"] <= 1


def test_every_registered_algorithm_declares_its_data_flows():
    flows = {FAMILIES.get(name).data_flow for name in FAMILIES.names()}
    assert flows == {"class_incremental", "multi_label", "continual_few_shot", "stream"}
    assert all(ALGORITHMS.get(name).data_flows & flows for name in ALGORITHMS.names())
    assert load("synthetic:classes=10,train=40,test=20").num_classes == 10


def test_a_shot_index_reaches_the_learner_as_the_dataset_images_it_names():
    """The run holds the phase's subset of the dataset (here classes 2-11 of 12); the index file names positions
    in the dataset's own training arrays, and those very images are the session's shots."""
    from dataclasses import replace

    from gtep.data import resolve_dataset

    full = resolve_dataset("synthetic:classes=12,train=40,test=20").load()
    phase = full.subset(list(range(2, 12)))
    job, _ = small_job("replay", dataset="synthetic:classes=12,train=40,test=20", increments=(6, 2, 2), epochs=1)
    given = {str(c): [int(i) for i in np.flatnonzero(full.y_train == c)[-3:]] for c in range(2, 12)}
    options = {**FSCIL, "shots": 3, "fixed_order": True, "shots_given": given}
    job = replace(job, classes=tuple(range(2, 12)), family="fscil", family_options=tuple(sorted(options.items())))
    run = OrderingRun(job, phase)
    session = run.tasks[1]
    mask = np.zeros(len(phase.y_train), bool)
    mask[few_shot_indices(phase.y_train, session, job.seed, job.ordering, run.given_shots)] = True
    used = sorted(phase.dataset_train_index()[mask].tolist())
    assert used == sorted(i for c in session.new_classes for i in given[str(c)])
    assert np.array_equal(phase.x_train[mask], full.x_train[used])  # the pixels the file names, not others
