"""`gtep check --calibrate` bounds its own cost (issue 68, item 2): one calibration took 779 s on a loaded machine to
estimate a tuning phase of 1 min 42 s. The first sample's estimate sets a budget of min(60 s, a tenth of it); once
it is spent, sampling stops and the estimate extrapolates from what was timed; the output says what the calibration
cost beside its budget."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from gtep.cli import app
from gtep.config.files import preset_text
from gtep.engine.flows import Flow, TimedPart
from gtep.preflight import calibration
from gtep.preflight.calibration import BUDGET_CAP_S, CalibrationBudget

runner = CliRunner()


class Clock:
    """A fake clock the fake work advances: a loaded machine's late wake-ups cannot move it."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_budget_is_a_tenth_of_the_first_estimate_and_never_over_a_minute():
    clock = Clock()
    budget = CalibrationBudget(clock)
    assert not budget.spent("anything")  # no sample yet: the first one always runs
    budget.first_estimate(52.0)  # a tuning phase of 52 s
    assert budget.seconds == pytest.approx(5.2)
    budget.first_estimate(5000.0)  # the first sample's estimate sets it, once
    assert budget.seconds == pytest.approx(5.2)
    clock.now += 5.0
    assert not budget.spent("repeat 2 of 2")
    clock.now += 0.5
    assert budget.spent("repeat 2 of 2")
    budget.end()
    clock.now += 99.0  # what comes after the calibration is not its cost
    assert budget.describe() == "calibrated in 5.5 s (budget 5.2 s; spent, so left out: repeat 2 of 2)"
    long = CalibrationBudget(clock)
    long.first_estimate(3 * 3600.0)
    assert long.seconds == BUDGET_CAP_S
    assert long.describe() == "calibrated in 0.0 s (budget 60 s)"


class FakeRun:
    """Ten tasks of 5 s each on the fake clock."""

    def __init__(self, clock: Clock) -> None:
        self.clock, self.tasks, self.trained = clock, list(range(10)), 0

    def train_task(self, task: int) -> None:
        self.clock.now += 5.0
        self.trained += 1


class Tasks(Flow):
    def start(self, job, data, fit_mode=None):
        raise NotImplementedError

    def run(self, job, data, on_task_end=None, checkpoint=None, first_tasks=None, fit_mode=None):
        raise NotImplementedError


def test_a_flow_stops_its_part_once_the_budget_is_spent():
    """A part of ten 5 s tasks, an ordering of ten tasks, four of them a phase: the first task's estimate is 200 s,
    so the budget is 20 s and the part stops after four tasks (the whole part: 50 s)."""
    clock = Clock()
    budget = CalibrationBudget(clock)
    run = FakeRun(clock)

    def stop(units: int, seconds: float) -> bool:
        budget.first_estimate(5.0 * 10 * 4)
        return budget.spent(f"the tasks after the first {units}")

    part = Tasks().time_part(run, stop)
    assert run.trained == 4 and part.units == 4
    budget.end()
    assert budget.describe() == "calibrated in 20 s (budget 20 s; spent, so left out: the tasks after the first 4)"


def test_a_flow_whose_time_part_takes_no_stop_runs_its_part_whole():
    class Old(Tasks):
        def time_part(self, run) -> TimedPart:
            return TimedPart(1, 0.0)

    assert not calibration.takes_stop(Old()) and calibration.takes_stop(Tasks())


def default_study(tmp_path: Path) -> Path:
    path = tmp_path / "exp.yaml"
    path.write_text(preset_text("default"))
    return path


def iirc_study(tmp_path: Path) -> Path:
    text = yaml.safe_load(preset_text("omniglot-iirc"))
    text["scenario"]["iirc"]["classes_per_task"] = 25
    path = tmp_path / "iirc.yaml"
    path.write_text(yaml.safe_dump(text))
    return path


def check(tmp_path: Path, study: Path, *options: str) -> str:
    result = runner.invoke(app, ["check", "-c", str(study), "--trials", "1", "--orderings", "1", "--output",
                                 str(tmp_path / "runs"), "--calibrate", *options], env={"COLUMNS": "300"})
    assert result.exit_code == 0, result.output
    return " ".join(result.output.split())


def test_a_spent_budget_stops_the_repeats_and_the_output_says_the_cost(tmp_path, monkeypatch):
    """A budget of 0 s (spent by the first sample): the class-incremental calibration times its two tasks once, not
    CALIBRATION_REPEATS times, and says so beside the estimate."""
    monkeypatch.setattr(calibration, "BUDGET_CAP_S", 0.0)
    monkeypatch.setattr(calibration, "CALIBRATION_BATCHES", 1)
    repeats = []
    timed = calibration._two_tasks
    monkeypatch.setattr(calibration, "_two_tasks", lambda *a: repeats.append(1) or timed(*a))
    out = check(tmp_path, default_study(tmp_path), "--backbone", "resnet8")
    assert len(repeats) == 1
    assert "of training; calibrated in " in out and "(budget 0.0 s; spent, so left out: repeat 2 of 2)" in out


def test_a_spent_budget_cuts_a_flows_part_short(tmp_path, monkeypatch):
    """IIRC's calibration runs every task of tuning ordering 0; with its budget spent by the first task it runs that
    one and extrapolates."""
    monkeypatch.setattr(calibration, "BUDGET_CAP_S", 0.0)
    monkeypatch.setattr(calibration, "FLOW_FIT_BATCHES", 2)
    out = check(tmp_path, iirc_study(tmp_path))
    assert "compute: calibrated as a trial runs the multi_label flow" in out
    assert "1 task(s) of tuning ordering 0 run in" in out
    assert "(budget 0.0 s; spent, so left out: the tasks of the part after the first 1)" in out
