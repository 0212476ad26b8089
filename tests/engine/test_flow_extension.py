"""Adding a data flow (docs/extending.md, "Adding a flow"): a flow defined and registered here, outside gtep, and a
family that names it, run end to end with nothing else changed: `run_ordering` runs an ordering on it, and
`gtep check --calibrate` asks it for its unit, its units of work and the part of an ordering to time (no flow's name
is branched on in gtep/preflight/calibration.py). CPU, tiny data: seconds."""
from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Iterator

import pytest
import yaml
from typer.testing import CliRunner

from gtep import api
from gtep.algorithms import ALGORITHMS
from gtep.cli import app
from gtep.config.files import preset_text
from gtep.data import ImageSet
from gtep.engine import OrderingJob, OrderingOutcome, run_ordering
from gtep.engine.first_task import FirstTaskStore
from gtep.engine.flows import FLOWS, Flow, TaskHook, TimedPart
from gtep.engine.runner import OrderingRun
from gtep.preflight.calibration import calibrate_flow, compute_flow_estimate, no_estimate_reason
from gtep.preflight.checks import preflight
from gtep.protocol.families import FAMILIES
from gtep.protocol.families.class_incremental import ClassIncremental
from tests.helpers import small_job

TOY_FLOW, TOY_FAMILY = "toy_tasks", "toy_family"


class ToyFlow(Flow):
    """Tasks of classes trained one by one on the engine's OrderingRun (no checkpoints, no shared first task); its
    unit is a "toy task", and its calibration times task 1 alone. It counts what it was asked, for the test."""

    unit = "toy task"

    def __init__(self) -> None:
        self.calls = {"run": 0, "units": 0, "time_part": 0}

    def start(self, job: OrderingJob, data: ImageSet) -> OrderingRun:
        return OrderingRun(job, data)

    def run(self, job: OrderingJob, data: ImageSet, on_task_end: TaskHook | None = None,
            checkpoint: Path | None = None, first_tasks: FirstTaskStore | None = None) -> OrderingOutcome:
        self.calls["run"] += 1
        run = self.start(job, data)
        for task in run.tasks:
            run.train_task(task)
            if run.outcome.diverged:
                break
            if on_task_end is not None:
                on_task_end(task.index, run.outcome)
        return run.finish()

    def units(self, run: OrderingRun) -> int:
        self.calls["units"] += 1
        return len(run.tasks)

    def time_part(self, run: OrderingRun) -> TimedPart:
        self.calls["time_part"] += 1
        tic = time.perf_counter()
        run.train_task(run.tasks[0])
        return TimedPart(1, time.perf_counter() - tic)


class ToyFamily(ClassIncremental):
    """The class-incremental family's tasks and metrics, run on the toy flow."""

    name = TOY_FAMILY
    data_flow = TOY_FLOW


@pytest.fixture
def toy_flow(monkeypatch: pytest.MonkeyPatch) -> Iterator[ToyFlow]:
    """The toy flow and family registered (their one registration each), and replay able to run the flow; all
    undone after the test, so no other test sees them."""
    flow = FLOWS.register(TOY_FLOW)(ToyFlow())
    FAMILIES.register(TOY_FAMILY)(ToyFamily())
    replay = ALGORITHMS.get("replay")
    monkeypatch.setattr(replay, "data_flows", replay.data_flows | {TOY_FLOW})
    try:
        yield flow
    finally:
        FLOWS._entries.pop(TOY_FLOW, None)  # noqa: SLF001 - the test's own registrations, undone
        FAMILIES._entries.pop(TOY_FAMILY, None)  # noqa: SLF001


def test_run_ordering_runs_a_registered_toy_flow(toy_flow):
    """A job of the toy family goes to the toy flow: its every task trained and reported, an accuracy matrix."""
    job, data = small_job("replay", epochs=1, increments=(2, 2), memory_size=8)
    reported: list[int] = []
    outcome = run_ordering(replace(job, family=TOY_FAMILY), data, on_task_end=lambda t, _: reported.append(t))
    assert toy_flow.calls["run"] == 1
    assert outcome.status == "finished" and reported == [0, 1]
    assert len(outcome.acc_matrix) == 2 and all(0.0 <= a <= 1.0 for a in outcome.acc_matrix[-1])


def test_check_calibrates_a_toy_flow_by_asking_it(toy_flow, tmp_path):
    """`gtep check --calibrate` on a study of the toy family: the estimate is the toy flow's (its unit, its part
    timed, its units counted), printed as for any flow timed in part; nothing is written."""
    study = yaml.safe_load(preset_text("default"))
    study["scenario"]["family"] = TOY_FAMILY
    path = tmp_path / "toy.yaml"
    path.write_text(yaml.safe_dump(study))
    plan = preflight(api.experiment(path, trials=1, orderings=1, backbone="resnet8", output=tmp_path / "runs"))
    assert plan.resolved.family.data_flow == TOY_FLOW and no_estimate_reason(plan) is None
    calibration = calibrate_flow(plan)
    assert toy_flow.calls["time_part"] == 1
    assert calibration.unit == "toy task" and calibration.timed_units == 1 and calibration.fit_power == 1
    estimate = compute_flow_estimate(plan, calibration)
    assert toy_flow.calls["units"] == 2  # one ordering of each phase, counted by the flow
    assert estimate["units"] == {"tune": 3, "evaluate": 3}  # C10xT1+C5xT2: three tasks an ordering
    assert estimate["unit_seconds"] == pytest.approx(calibration.seconds(3))

    result = CliRunner().invoke(app, ["check", "-c", str(path), "--trials", "1", "--orderings", "1", "--backbone",
                                      "resnet8", "--output", str(tmp_path / "runs"), "--calibrate"],
                                env={"COLUMNS": "300"})
    assert result.exit_code == 0, result.output
    out = " ".join(result.output.split())
    assert f"data flow {TOY_FLOW}" in out and "no estimate" not in out
    assert f"compute: calibrated as a trial runs the {TOY_FLOW} flow, on cpu" in out
    assert "1 toy task(s) of tuning ordering 0 run in" in out
    assert "scaled to an ordering's 3 (tuning) and 3 (evaluation) toy tasks" in out
    assert toy_flow.calls["time_part"] == 2
    assert not (tmp_path / "runs").exists()
