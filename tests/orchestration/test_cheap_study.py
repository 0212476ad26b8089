"""Cheaper tuning on real (tiny) studies on Ray: ASHA stops sets during the tuning phase, a stopped set is shown
as such and never H*, gtep replay reproduces the study's H* without a scheduler, and the first-task protocol
trains each set on the first k tasks only."""
from __future__ import annotations

import json

import pandas as pd
import pytest
import ray
import yaml

from gtep.cli import app
from tests.orchestration.test_phases import config, gtep, runner, runs_of, store

pytestmark = pytest.mark.slow

# learning rates far apart, so the sets' running scores differ and ASHA has something to stop
SPACE = {"algorithm": "replay", "space": {"lr": [0.0001, 0.001, 0.05, 0.2], "epochs": [40], "batch_size": [16],
                                          "scheduler": ["constant"]}}


@pytest.fixture(scope="module", autouse=True)
def shared_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def cheap_config(tmp_path, study: str, **search):
    (tmp_path / "space.yaml").write_text(yaml.safe_dump(SPACE))
    return config(study=study, search={"trials": 6, "orderings": 3, "space": str(tmp_path / "space.yaml"), **search},
                  compute={"max_concurrent": 1}, training={"memory_size": 12, "epoch_scale": 0.05})


def test_asha_stops_sets_that_are_never_h_star_and_replay_reproduces_h_star(tmp_path):
    result = gtep(tmp_path, "tune", cheap_config(tmp_path, "asha", scheduler="asha",
                                                 scheduler_options={"grace_period": 1, "reduction_factor": 2}))
    assert result.exit_code == 0, result.output + repr(result.exception)
    root = tmp_path / "out" / "asha"
    manifest = json.loads((root / "manifest.json").read_text())
    stopped = manifest["phases"]["tune"]["stopped_sets"]
    best = manifest["phases"]["tune"]["best_set_index"]
    assert stopped, "sets with lr 1e-4 and 0.2 against 0.05 should fall below the first rung's cutoff"
    assert best not in stopped
    rows = pd.read_csv(root / "tune_results.csv")
    for i in stopped:
        mine = rows[rows["set_index"] == i]
        assert set(mine.set_status) == {"stopped"} and len(mine) < 3
        assert mine.train_seconds.notna().all()  # what it cost stays visible
    assert set(rows[rows["set_index"] == best].set_status) == {"complete"}
    assert "stopped early by asha" in result.output
    statuses = [r.data.tags.get("gtep.status") for r in runs_of(store(tmp_path), "asha", level="trial")]
    assert statuses.count("stopped") == len(stopped), statuses

    replayed = runner.invoke(app, ["replay", str(root), "--scheduler", "none"])
    assert replayed.exit_code == 0, replayed.output
    assert f"H* = set{best:03d} (the full study's: set{best:03d})" in replayed.output
    assert "100.0% of the full study" in replayed.output


def test_first_task_protocol_trains_each_set_on_the_first_task_only(tmp_path):
    result = gtep(tmp_path, "tune", cheap_config(tmp_path, "first", protocol="first_task", protocol_tasks=1))
    assert result.exit_code == 0, result.output + repr(result.exception)
    units = list((tmp_path / "out" / "first" / "units").glob("tune-*/set*-o*.json"))
    assert len(units) == 6 * 3
    for path in units:
        record = json.loads(path.read_text())
        assert len(record["acc_matrix"]) == 1 and len(record["task_seconds"]) == 1


def test_hyperband_runs_the_tuning_phase_and_h_star_is_a_complete_set(tmp_path):
    result = gtep(tmp_path, "tune", cheap_config(tmp_path, "hyperband", trials=4, scheduler="hyperband",
                                                 scheduler_options={"reduction_factor": 3}))
    assert result.exit_code == 0, result.output + repr(result.exception)
    manifest = json.loads((tmp_path / "out" / "hyperband" / "manifest.json").read_text())
    best = manifest["phases"]["tune"]["best_set_index"]
    assert best not in manifest["phases"]["tune"]["stopped_sets"]
    rows = pd.read_csv(tmp_path / "out" / "hyperband" / "tune_results.csv")
    assert set(rows[rows["set_index"] == best].set_status) == {"complete"}
