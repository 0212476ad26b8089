"""Cheaper tuning (issue 24), the quick parts: scheduler and protocol options, the stopped set state, and the
replay of recorded results under ASHA and the first-task protocol (gtep/protocol/replay.py)."""
from __future__ import annotations

import math

import numpy as np
import pytest

from gtep.config import ConfigError, resolve, validate_config
from gtep.protocol.replay import asha_rungs, asha_stopped, first_task_unit, replay, spent_seconds
from gtep.protocol.selection import OrderingResult, score_set, select_best
from tests.orchestration.test_phases import config


def unit(set_index: int, ordering: int, acc: float, finished_at: int, seconds: float = 10.0) -> dict:
    """A recorded unit of a 3-task ordering whose Acc and AvgAcc are `acc` (a flat accuracy matrix)."""
    matrix = [[acc, None, None], [acc, acc, None], [acc, acc, acc]]
    return {"set_index": set_index, "ordering": ordering, "status": "finished", "acc": acc, "avg_acc": acc,
            "hmean": acc, "acc_matrix": matrix, "test_counts": [10, 10, 10], "task_seconds": [seconds / 3] * 3,
            "train_seconds": seconds, "finished_at": finished_at}


def study(scores: dict[int, list[float]]) -> list[dict]:
    """Units of sets trained one after another in set order (set i's orderings finish before set i+1's)."""
    units, clock = [], 0
    for i, accs in scores.items():
        for s, acc in enumerate(accs):
            clock += 1
            units.append(unit(i, s, acc, clock))
    return units


# ---------------------------------------------------------------- options, before any compute

@pytest.mark.parametrize("search, field", [
    ({"scheduler": "median"}, "search.scheduler"),
    ({"scheduler": "asha", "scheduler_options": {"grace_period": 0}}, "search.scheduler_options.grace_period"),
    ({"scheduler": "asha", "scheduler_options": {"reduction_factor": 1}},
     "search.scheduler_options.reduction_factor"),
    ({"scheduler": "asha", "scheduler_options": {"grace": 1}}, "search.scheduler_options.grace"),
    ({"scheduler": "asha", "orderings": 3, "scheduler_options": {"grace_period": 3}}, "search"),
    ({"protocol": "first_tasks"}, "search.protocol"),
])
def test_bad_scheduler_or_protocol_options_are_one_config_error_naming_the_field(search, field):
    with pytest.raises(ConfigError) as err:
        validate_config(config(search=search), "test")
    assert err.value.field == field, err.value


def test_first_task_protocol_needs_fewer_tasks_than_the_scenario(tmp_path):
    doc = config(search={"protocol": "first_task", "protocol_tasks": 2}, tracking={"output": str(tmp_path)})
    with pytest.raises(ConfigError) as err:
        resolve(validate_config(doc, "test"))  # the scenario 3x2 has 2 tasks
    assert err.value.field == "search.protocol_tasks"
    ok = config(search={"protocol": "first_task", "protocol_tasks": 1}, tracking={"output": str(tmp_path)})
    assert resolve(validate_config(ok, "test")).config.search.protocol_tasks == 1


def test_first_task_at_k_1_is_refused_when_nothing_sampled_reaches_task_1(tmp_path):
    """With a fixed first-task scheduler, Replay's task 1 depends on no value of its space: all sets would tie."""
    space = tmp_path / "space.yaml"
    space.write_text("algorithm: replay\nspace: {lr: [0.01, 0.1], epochs: [2], scheduler: [steplr, cosine]}\n")
    doc = config(search={"protocol": "first_task", "protocol_tasks": 1, "space": str(space)},
                 first_task={"epochs": 2, "milestones": [1], "batch_size": 16, "scheduler": "steplr"},
                 tracking={"output": str(tmp_path)})
    with pytest.raises(ConfigError) as err:
        resolve(validate_config(doc, "test"))
    assert err.value.field == "search.protocol_tasks" and "every set would score the same" in str(err.value)
    # the reference code's `sampled` first-task scheduler lets the set's scheduler (two values) reach task 1
    doc["first_task"]["scheduler"] = "sampled"
    assert resolve(validate_config(doc, "test")).config.search.protocol_tasks == 1


def test_the_first_task_protocol_trains_only_the_first_k_tasks_in_tuning(tmp_path):
    from gtep.data import resolve_dataset
    from gtep.engine import run_ordering
    from gtep.orchestration.trial_job import trial_job

    doc = config(search={"protocol": "first_task", "protocol_tasks": 1}, tracking={"output": str(tmp_path)})
    resolved = resolve(validate_config(doc, "test"))
    tune_job, evaluate_job = trial_job(resolved, "tune"), trial_job(resolved, "evaluate")
    assert tune_job.scenario.max_tasks == 1 and evaluate_job.scenario.max_tasks is None  # H* runs the whole scenario
    hparams = {"epochs": 1, "lr": 0.01, "batch_size": 16, "scheduler": "constant"}
    spec = tune_job.ordering(hparams, 0)
    assert len(spec.tasks()) == 1 and len(evaluate_job.ordering(hparams, 0).tasks()) == 2
    data = resolve_dataset(tune_job.scenario.dataset).load().subset(sorted(tune_job.scenario.classes))
    outcome = run_ordering(spec, data)
    assert outcome.status == "finished"
    assert len(outcome.acc_matrix) == 1 and len(outcome.task_seconds) == 1  # the learner saw one task


# ---------------------------------------------------------------- the stopped state

def test_a_stopped_set_is_never_h_star_whatever_it_scored():
    results = [OrderingResult(0, 0, 0.9, 0.9), OrderingResult(1, 0, 0.5, 0.5), OrderingResult(1, 1, 0.5, 0.5)]
    assert score_set(0, results[:1], 2, stopped=True).status == "stopped"
    assert score_set(0, results[:1], 2).status == "incomplete"
    chosen = select_best(results, expected_orderings=2, sets=[0, 1], stopped=[0])
    assert chosen.best_index == 1
    assert {s.set_index: s.status for s in chosen.scores} == {0: "stopped", 1: "complete"}


# ---------------------------------------------------------------- replay

def test_replay_without_a_scheduler_reproduces_the_study_h_star():
    units = study({0: [0.4, 0.5, 0.45], 1: [0.6, 0.2, 0.3], 2: [0.5, 0.55, 0.5], 3: [0.1, 0.9, 0.9]})
    outcome = replay(units, 3, [0, 1, 2, 3], "none")
    expected = select_best([OrderingResult(u["set_index"], u["ordering"], u["acc"], u["avg_acc"]) for u in units],
                           expected_orderings=3, sets=[0, 1, 2, 3]).best_index
    assert outcome.best_index == expected == 3
    assert outcome.fraction == 1.0 and outcome.stopped == ()


def test_asha_replay_stops_hopeless_sets_and_never_selects_one():
    # set 3 is best over all orderings but starts worst: ASHA stops it at the first rung, so it cannot be H*
    units = study({0: [0.5, 0.5, 0.5], 1: [0.6, 0.6, 0.6], 2: [0.2, 0.2, 0.2], 3: [0.1, 0.95, 0.95]})
    outcome = replay(units, 3, [0, 1, 2, 3], "asha", grace_period=1, reduction_factor=2)
    assert 3 in outcome.stopped and 2 in outcome.stopped
    assert outcome.best_index == 1
    assert outcome.best_index not in outcome.stopped and math.isnan(outcome.scores[3])
    # set 2 and set 3 ran one ordering of three each: 8 of 12 units trained
    assert outcome.seconds == pytest.approx(80.0) and outcome.fraction == pytest.approx(8 / 12)


def test_asha_replay_makes_ray_s_decisions():
    """The re-implemented rung rule against Ray Tune's own ASHA bracket over the same arrival order."""
    from ray.tune.schedulers.async_hyperband import _Bracket

    rng = np.random.default_rng(0)
    S, grace, rf = 5, 1, 2.0
    units = [unit(i, s, float(rng.uniform(0.1, 0.9)), int(rng.integers(1000))) for i in range(12) for s in range(S)]
    stopped, _ = asha_stopped(units, S, grace, rf)

    class Trial:
        def __init__(self, i):
            self.trial_id = str(i)

    bracket = _Bracket(grace, S, rf, 0)
    assert [m for m, _ in bracket._rungs] == asha_rungs(S, grace, rf)
    ray_stopped: set[int] = set()
    done: dict[int, list[float]] = {}
    for u in sorted(units, key=lambda u: (u["finished_at"], u["set_index"], u["ordering"])):
        i = u["set_index"]
        if i in ray_stopped:
            continue
        done.setdefault(i, []).append(u["acc"])
        if len(done[i]) >= S:
            continue
        if bracket.on_result(Trial(i), len(done[i]), float(np.mean(done[i]))) == "STOP":
            ray_stopped.add(i)
    assert stopped == ray_stopped and stopped


def test_first_task_replay_compares_sets_on_the_first_tasks_and_costs_their_seconds():
    units = study({0: [0.5, 0.5], 1: [0.6, 0.6]})
    units[0]["acc_matrix"] = [[0.9, None, None], [0.1, 0.1, None], [0.1, 0.1, 0.1]]  # set 0: best first task
    cut = first_task_unit(units[0], 1)
    assert cut["acc_matrix"] == [[0.9]] and cut["acc"] == pytest.approx(0.9) and len(cut["task_seconds"]) == 1
    outcome = replay(units, 2, [0, 1], "first_task", protocol_tasks=1)
    assert outcome.best_index == 0  # (0.9 + 0.5) / 2 on task 1 beats 0.6
    assert outcome.fraction == pytest.approx(1 / 3)


def test_a_reused_first_task_counts_once_where_it_was_trained():
    trained = {**unit(0, 0, 0.5, 1, seconds=30.0), "first_task": "trained"}  # 10 s per task
    reused = {**unit(1, 0, 0.5, 2, seconds=30.0), "first_task": "reused"}  # carries task 1's 10 s, spent 20
    assert spent_seconds([trained, reused]) == pytest.approx(50.0)
    # without the unit that trained it, the first task is trained once by another
    assert spent_seconds([reused]) == pytest.approx(30.0)


def test_a_study_recorded_before_the_scheduler_fields_still_resumes(tmp_path):
    import json

    from gtep.config import ADDED_SEARCH_FIELDS
    from gtep.orchestration.phases import check_resumable
    from gtep.orchestration.study import Manifest

    resolved = resolve(validate_config(config(tracking={"output": str(tmp_path)}), "test"))
    stored = json.loads(resolved.config.model_dump_json())
    for name in ADDED_SEARCH_FIELDS:
        stored["search"].pop(name)
    check_resumable(resolved, Manifest(tmp_path / "manifest.json", {"config": stored}))
    stored["search"]["scheduler"] = "asha"  # another scheduler is another study
    with pytest.raises(ConfigError):
        check_resumable(resolved, Manifest(tmp_path / "manifest.json", {"config": stored}))
