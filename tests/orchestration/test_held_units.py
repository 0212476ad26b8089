"""A trial holds units that finish within a second of its last report and reports them together (HeldUnits):
a function trainable's `tune.report` waits for the driver to take the result, a round trip per unit that was a
third of a trial's time with units of a tenth of a second. Every unit still reaches MLflow and the manifest once,
and a scheduler or pruner, which decides after every ordering, still gets every ordering alone."""
from __future__ import annotations

import dataclasses
import json

import pytest

from gtep.config import ExperimentConfig
from gtep.config.resolution import resolve
from gtep.orchestration import trainable
from gtep.orchestration.trainable import HeldUnits
from gtep.orchestration.trial_job import report_every_seconds
from gtep.protocol.phases import EVALUATE, TUNE
from tests.orchestration.test_phases import config, gtep, runs_of, store


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_units_within_the_window_are_held_and_the_last_one_always_goes(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(trainable.time, "monotonic", clock)
    held = HeldUnits(1.0)
    assert held.take({"ordering": 0}, last=False) == []
    clock.now += 0.4
    assert held.take({"ordering": 1}, last=False) == []
    clock.now += 0.7  # 1.1 s since the trial began: these go now, together
    assert held.take({"ordering": 2}, last=False) == [{"ordering": 0}, {"ordering": 1}, {"ordering": 2}]
    clock.now += 0.1
    assert held.take({"ordering": 3}, last=True) == [{"ordering": 3}], "a trial's last unit is never held"

    alone = HeldUnits(0.0)
    assert [alone.take({"ordering": s}, last=False) for s in range(2)] == [[{"ordering": 0}], [{"ordering": 1}]]


def test_a_trial_whose_ordering_raises_reports_what_it_held_first(monkeypatch):
    """Held units of a trial that then fails must still reach the driver: the study counts a set's finished
    orderings (its status says 1/2, never complete) and logs them; only a trial killed outright leaves them to
    a retry or resume."""
    job = trainable.trial_job(resolved_with(), "tune", None)
    job = dataclasses.replace(job, report_every_seconds=600.0)  # everything held until the last unit
    sent: list[dict] = []
    monkeypatch.setattr(trainable.tune, "report", sent.append)

    def unit(set_index, hparams, s, data, job, per_task=None):
        if s == 2:
            raise RuntimeError("the third ordering crashes")
        return {"status": "finished", "ordering": s, "hmean": 0.5, "acc": 0.5, "avg_acc": 0.5}

    monkeypatch.setattr(trainable, "run_unit", unit)
    with pytest.raises(RuntimeError, match="third ordering"):
        trainable.train_set({"trial": {"set_index": 0, "hparams": {}}, "orderings": [0, 1, 2]}, None, job)
    assert len(sent) == 1, "one report, with what the trial held"
    report, = sent
    assert [u["ordering"] for u in [*report["earlier_units"], report]] == [0, 1]
    assert report["orderings_done"] == 2


def resolved_with(**search):
    doc = config(search={"trials": 2, "orderings": 3, **search})
    return resolve(ExperimentConfig.model_validate(doc))


@pytest.mark.parametrize("search", [{"scheduler": "asha", "scheduler_options": {"grace_period": 1}},
                                    {"pruner": "median", "searcher": "optuna-tpe"},
                                    {"fidelity": "tasks", "scheduler": "asha"}])
def test_a_scheduler_or_pruner_gets_every_ordering_alone_in_tuning(search):
    resolved = resolved_with(**search)
    assert report_every_seconds(resolved, TUNE) == 0.0
    assert report_every_seconds(resolved, EVALUATE) == 1.0, "the evaluation phase has no scheduler"


def test_the_window_is_a_second_unless_set(monkeypatch):
    resolved = resolved_with()
    assert report_every_seconds(resolved, TUNE) == 1.0
    monkeypatch.setenv("GTEP_REPORT_EVERY_SECONDS", "0")
    assert report_every_seconds(resolved, TUNE) == 0.0


@pytest.fixture(scope="module")
def shared_ray(local_ray):
    """This worker's Ray (tests/conftest.py)."""


@pytest.mark.slow  # a real study on Ray; every default-group study holds units too (the 1-second window)
def test_held_units_reach_mlflow_and_the_manifest_once_each(tmp_path, monkeypatch, shared_ray):
    monkeypatch.setenv("GTEP_REPORT_EVERY_SECONDS", "600")  # every unit of a set held until the set's last
    doc = config(study="held", search={"trials": 2, "orderings": 3}, compute={"max_concurrent": 1})
    result = gtep(tmp_path, "run", doc)
    assert result.exit_code == 0, result.output + repr(result.exception)

    root = tmp_path / "out" / "held"
    def reports(phase: str) -> list[dict]:
        return [json.loads(line) for path in sorted((root / "ray").glob(f"{phase}-*/*/result.json"))
                for line in path.read_text().splitlines() if line.strip()]

    tuning = reports("tune")
    assert len(tuning) == 2, "one report per tuning trial (a set and its 3 orderings)"
    assert all(len(r["earlier_units"]) == 2 and r["orderings_done"] == 3 for r in tuning)
    evaluation = reports("evaluate")
    assert len(evaluation) == 3 and all(r["earlier_units"] == [] for r in evaluation), "a trial per ordering"

    manifest = json.loads((root / "manifest.json").read_text())
    assert sorted(manifest["units"]) == sorted([f"tune/{i}/{s}" for i in range(2) for s in range(3)]
                                               + [f"evaluate/0/{s}" for s in range(3)])
    orderings = runs_of(store(tmp_path), "held", level="ordering")
    keys = [(r.data.tags["gtep.phase"], r.data.tags["gtep.set_index"], r.data.tags["gtep.ordering"]) for r in orderings]
    assert len(keys) == len(set(keys)) == 2 * 3 + 3, "every unit logged, none twice"
    assert all(r.info.status == "FINISHED" and "acc" in r.data.metrics for r in orderings)
