"""search.fidelity tasks: a trial reports its running score after each task of an ordering too (not only after
each ordering), so a scheduler can stop a hopeless set inside its first ordering. The reports of a real (tiny)
trial, read without Ray: their times, their scores against the units' accuracy matrices, their costs."""
from __future__ import annotations

import pytest

from gtep.config import ConfigError, resolve, validate_config
from gtep.data import resolve_dataset
from gtep.orchestration import trainable
from gtep.orchestration.ray_search import trial_scheduler
from gtep.orchestration.trial_job import trial_job
from gtep.protocol.metrics import harmonic_mean
from gtep.protocol.replay import first_task_unit
from tests.orchestration.test_phases import config

HPARAMS = {"epochs": 1, "lr": 0.01, "batch_size": 16, "scheduler": "constant"}


def trial_reports(tmp_path, monkeypatch, fidelity: str) -> list[dict]:
    doc = config(scenario={"increments": "2x3"}, search={"fidelity": fidelity, "orderings": 2, "trials": 1,
                                                         "scheduler": "asha"}, tracking={"output": str(tmp_path)})
    job = trial_job(resolve(validate_config(doc, "test")), "tune")
    reports: list[dict] = []
    monkeypatch.setattr(trainable.tune, "report", lambda result: reports.append(dict(result)))
    monkeypatch.setattr(trainable, "_node_id", lambda: "")  # asking Ray for the node would start a local Ray
    data = resolve_dataset(job.scenario.dataset).load().subset(sorted(job.scenario.classes))
    trainable.train_set({"trial": {"set_index": 0, "hparams": HPARAMS}, "orderings": [0, 1]}, data, job)
    return reports


def test_a_trial_reports_after_every_task_with_its_progress(tmp_path, monkeypatch):
    reports = trial_reports(tmp_path, monkeypatch, "tasks")
    assert [r["progress"] for r in reports] == pytest.approx([1 / 3, 2 / 3, 1, 4 / 3, 5 / 3, 2])
    assert [r["tasks_done"] for r in reports] == [1, 2, 3, 4, 5, 6]
    assert [bool(r.get("interim")) for r in reports] == [True, True, False, True, True, False]
    assert all("ordering" not in r for r in reports if r.get("interim"))  # never logged as a unit


def test_an_interim_score_is_the_criterion_over_the_orderings_so_far_and_the_first_tasks_of_this_one(
        tmp_path, monkeypatch):
    reports = trial_reports(tmp_path, monkeypatch, "tasks")
    first, second = reports[2], reports[5]  # the two units, each with its whole accuracy matrix
    for t, report in ((1, reports[0]), (2, reports[1])):
        cut = first_task_unit(first, t)
        assert report["score"] == pytest.approx(harmonic_mean(cut["acc"], cut["avg_acc"]))
        assert report["partial_seconds"] == pytest.approx(sum(first["task_seconds"][:t]))
        assert report["orderings_done"] == 0
    cut = first_task_unit(second, 1)
    expected = harmonic_mean((first["acc"] + cut["acc"]) / 2, (first["avg_acc"] + cut["avg_acc"]) / 2)
    assert reports[3]["score"] == pytest.approx(expected) and reports[3]["orderings_done"] == 1
    assert reports[5]["score"] == pytest.approx(harmonic_mean((first["acc"] + second["acc"]) / 2,
                                                             (first["avg_acc"] + second["avg_acc"]) / 2))


def test_by_default_a_trial_reports_after_each_ordering_only(tmp_path, monkeypatch):
    reports = trial_reports(tmp_path, monkeypatch, "orderings")
    assert [r["progress"] for r in reports] == [1.0, 2.0] and not any(r.get("interim") for r in reports)


def test_the_schedulers_count_time_in_progress_and_a_pruner_in_tasks(tmp_path):
    def scheduler(**search):
        doc = config(scenario={"increments": "2x3"}, search={"orderings": 2, **search},
                     tracking={"output": str(tmp_path)})
        return trial_scheduler(resolve(validate_config(doc, "test")))
    asha = scheduler(fidelity="tasks", scheduler="asha", scheduler_options={"grace_period": 0.34})
    assert asha._time_attr == "progress"
    assert scheduler(scheduler="asha")._time_attr == "orderings_done"
    pruner = scheduler(fidelity="tasks", searcher="optuna-tpe", pruner="median")
    assert pruner.step_key == "tasks_done" and pruner.book.orderings == 2 * 3


def test_task_fidelity_is_for_class_incremental_scenarios(tmp_path):
    doc = config(scenario={"family": "fscil", "increments": None,
                           "fscil": {"base_classes": 4, "ways": 1, "shots": 1, "sessions": 2}},
                 search={"fidelity": "tasks"}, tracking={"output": str(tmp_path)})
    with pytest.raises(ConfigError) as err:
        resolve(validate_config(doc, "test"))
    assert err.value.field == "search.fidelity"
