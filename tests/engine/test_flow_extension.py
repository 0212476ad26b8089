"""Adding a data flow (docs/extending.md, "Adding a flow"): the page's example, run here as written, defines and
registers a flow and a family that names it, outside gtep and with nothing else changed; `run_ordering` runs an
ordering on it, and `gtep check --calibrate` asks it for its unit, its units of work and the part of an ordering to
time (no flow's name is branched on in gtep/preflight/calibration.py). CPU, tiny data: seconds."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
import yaml
from typer.testing import CliRunner

from gtep import api
from gtep.algorithms import ALGORITHMS
from gtep.cli import app
from gtep.config.files import preset_text
from gtep.engine import run_ordering
from gtep.engine.flows import FLOWS, Flow
from gtep.preflight.calibration import calibrate_flow, compute_flow_estimate, no_estimate_reason
from gtep.preflight.checks import preflight
from gtep.protocol.families import FAMILIES
from tests.helpers import small_job

PAGE = Path(__file__).resolve().parents[2] / "docs" / "extending.md"
MARKER = "<!-- runs: tests/engine/test_flow_extension.py -->"
TOY_FLOW, TOY_FAMILY = "toy_tasks", "toy_family"


def page_example() -> str:
    """The python block that follows this file's marker on docs/extending.md."""
    after = PAGE.read_text().split(MARKER, 1)[1]
    return after.split("```python\n", 1)[1].split("```", 1)[0]


def counted(calls: dict[str, int], name: str, method: Callable[..., Any]) -> Callable[..., Any]:
    def count(*args: Any, **kwargs: Any) -> Any:
        calls[name] += 1
        return method(*args, **kwargs)
    return count


@pytest.fixture
def toy_flow(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Flow, dict[str, int]]]:
    """The page's flow and family registered (its one registration each), replay able to run the flow, and the
    flow's methods counted; all undone after the test, so no other test sees them."""
    exec(compile(page_example(), f"{PAGE}:Adding a flow", "exec"), {"__name__": "toy_flow_example"})
    try:
        flow = FLOWS.get(TOY_FLOW)
        calls = dict.fromkeys(("run", "units", "time_part"), 0)
        for name in calls:
            monkeypatch.setattr(flow, name, counted(calls, name, getattr(flow, name)))
        replay = ALGORITHMS.get("replay")
        monkeypatch.setattr(replay, "data_flows", replay.data_flows | {TOY_FLOW})
        yield flow, calls
    finally:
        FLOWS._entries.pop(TOY_FLOW, None)  # noqa: SLF001 - the test's own registrations, undone
        FAMILIES._entries.pop(TOY_FAMILY, None)  # noqa: SLF001


def test_run_ordering_runs_a_registered_toy_flow(toy_flow):
    """A job of the toy family goes to the toy flow: its every task trained and reported, an accuracy matrix."""
    _, calls = toy_flow
    job, data = small_job("replay", epochs=1, increments=(2, 2), memory_size=8)
    reported: list[int] = []
    outcome = run_ordering(replace(job, family=TOY_FAMILY), data, on_task_end=lambda t, _: reported.append(t))
    assert calls["run"] == 1
    assert outcome.status == "finished" and reported == [0, 1]
    assert len(outcome.acc_matrix) == 2 and all(0.0 <= a <= 1.0 for a in outcome.acc_matrix[-1])


def test_check_calibrates_a_toy_flow_by_asking_it(toy_flow, tmp_path):
    """`gtep check --calibrate` on a study of the toy family: the estimate is the toy flow's (its unit, its part
    timed, its units counted), printed as for any flow timed in part; nothing is written."""
    _, calls = toy_flow
    study = yaml.safe_load(preset_text("default"))
    study["scenario"]["family"] = TOY_FAMILY
    path = tmp_path / "toy.yaml"
    path.write_text(yaml.safe_dump(study))
    plan = preflight(api.experiment(path, trials=1, orderings=1, backbone="resnet8", output=tmp_path / "runs"))
    assert plan.resolved.family.data_flow == TOY_FLOW and no_estimate_reason(plan) is None
    calibration = calibrate_flow(plan)
    assert calls["time_part"] == 1
    assert calibration.unit == "toy task" and calibration.timed_units == 1 and calibration.fit_power == 1
    estimate = compute_flow_estimate(plan, calibration)
    assert calls["units"] == 2  # one ordering of each phase, counted by the flow
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
    assert calls["time_part"] == 2
    assert not (tmp_path / "runs").exists()
