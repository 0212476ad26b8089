"""Ctrl-C on `gtep run`, as a terminal sends it (SIGINT to the driver's whole process group, Ray included).

The first Ctrl-C lands mid-tune: the phase must end `interrupted`, exit 130, print gtep's resume command and
leave no best.yaml. The resume is interrupted again in its evaluation phase by two Ctrl-C in a row (stop at
once). A second resume finishes the study, and everything it reports equals an uninterrupted twin's: H*,
every unit's metrics, the results tables, and MLflow's runs (one per phase, trial and ordering; none left
RUNNING).
"""
from __future__ import annotations

import json
import os
import signal
import time
from collections import Counter

import pandas as pd
import pytest
import yaml
from mlflow.tracking import MlflowClient

from tests.cluster.support import count, events, finish, gtep, tiny_study, wait_for, write_config

# real processes signalled and resumed, as the cluster group's other fault tests (a minute of drivers and Ray starts)
pytestmark = pytest.mark.cluster

CONFIG = tiny_study("sigint", trials=2, orderings=2, epochs=20, training={"memory_size": 18, "epoch_scale": 0.3})
# units of a few seconds: long enough for a Ctrl-C to land inside a phase
SPACE = {"algorithm": "replay", "space": {"epochs": [20], "batch_size": [16], "lr": [0.05, 0.1],
                                          "scheduler": ["cosine"]}}


def stop_with_ctrl_c(process, times: int = 1) -> tuple[int, float]:
    """SIGINT to the process group, as a terminal's Ctrl-C; returns the exit code and the seconds it took."""
    start = time.monotonic()
    for _ in range(times):
        os.killpg(process.pid, signal.SIGINT)
        time.sleep(0.3)
    code = process.wait(timeout=120)
    return code, time.monotonic() - start


def runs(output, study="sigint"):
    client = MlflowClient(tracking_uri=f"sqlite:///{output / 'mlflow.db'}")
    experiment = client.get_experiment_by_name(f"gtep/{study}")
    return client.search_runs([experiment.experiment_id], max_results=1000)


def manifest(study_dir):
    return json.loads((study_dir / "manifest.json").read_text())


@pytest.fixture(scope="module")
def studies(tmp_path_factory):
    root = tmp_path_factory.mktemp("sigint")
    (root / "space.yaml").write_text(yaml.safe_dump(SPACE))
    config = write_config(root, {**CONFIG, "search": {**CONFIG["search"], "space": str(root / "space.yaml")}})
    stopped, whole = root / "stopped", root / "whole"
    study_dir = stopped / "sigint"
    seen = {}

    first = gtep("run", "--config", str(config), "--output", str(stopped), log=root / "first.log")
    wait_for(lambda: count(study_dir, "unit_trained") >= 1, 300, "a first tuning unit")
    seen["first"] = (*stop_with_ctrl_c(first), (root / "first.log").read_text(), manifest(study_dir), runs(stopped))
    seen["best_after_first"] = (study_dir / "best.yaml").exists()

    twin = gtep("run", "--config", str(config), "--output", str(whole), log=root / "whole.log")
    second = gtep("run", "--resume", str(study_dir), log=root / "second.log")
    wait_for(lambda: any(e["event"] == "unit_started" and e["phase"] == "evaluate" for e in events(study_dir)),
             300, "the evaluation phase to start")
    seen["second"] = (*stop_with_ctrl_c(second, times=2), (root / "second.log").read_text(), manifest(study_dir),
                      runs(stopped))

    third = gtep("run", "--resume", str(study_dir), log=root / "third.log")
    seen["third"] = finish(third, root / "third.log")
    finish(twin, root / "whole.log")
    return {"stopped": stopped, "whole": whole, "seen": seen}


def test_ctrl_c_marks_the_phase_interrupted_and_prints_gteps_resume_command(studies):
    code, seconds, output, state, tracked = studies["seen"]["first"]
    study_dir = studies["stopped"] / "sigint"
    assert code == 130, output[-3000:]
    assert state["phases"]["tune"]["status"] == "interrupted"
    assert "evaluate" not in state["phases"], "the evaluation must not start after an interrupted tuning phase"
    assert not studies["seen"]["best_after_first"], "no H* may be selected from an interrupted phase"
    assert f"gtep run --resume {study_dir}" in output
    assert "Tuner.restore" not in output
    assert seconds < 60, f"the first Ctrl-C took {seconds:.0f} s to stop the study"
    phase_run, = [r for r in tracked if r.data.tags.get("gtep.level") == "phase"]
    assert phase_run.info.status == "KILLED" and phase_run.data.tags["gtep.status"] == "interrupted"
    assert not [r.info.run_name for r in tracked if r.info.status == "RUNNING"]


def test_a_second_ctrl_c_stops_at_once_with_the_same_guarantees(studies):
    code, seconds, output, state, tracked = studies["seen"]["second"]
    assert code == 130, output[-3000:]
    assert state["phases"]["tune"]["status"] == "finished"
    assert state["phases"]["evaluate"]["status"] == "interrupted"
    assert "gtep run --resume" in output
    evaluate_run, = [r for r in tracked if r.data.tags.get("gtep.level") == "phase"
                     and r.data.tags.get("gtep.phase") == "evaluate"]
    assert evaluate_run.info.status == "KILLED"
    assert not [r.info.run_name for r in tracked if r.info.status == "RUNNING"]


def test_the_resumed_study_reports_what_the_uninterrupted_one_does(studies):
    stopped, whole = studies["stopped"] / "sigint", studies["whole"] / "sigint"
    best = [yaml.safe_load((folder / "best.yaml").read_text()) for folder in (stopped, whole)]
    assert best[0]["set_index"] == best[1]["set_index"] and best[0]["hparams"] == best[1]["hparams"]
    units = [{k: (u["status"], u["acc"], u["avg_acc"], tuple(u["acc_t"])) for k, u in manifest(f)["units"].items()}
             for f in (stopped, whole)]
    assert units[0] == units[1] and len(units[0]) == 2 * 2 + 2
    for phase in ("tune", "evaluate"):
        pd.testing.assert_frame_equal(*(pd.read_csv(f / f"{phase}_results.csv").drop(columns="train_seconds")
                                        for f in (stopped, whole)))
    assert all(manifest(f)["phases"][p]["status"] == "finished" for f in (stopped, whole) for p in ("tune", "evaluate"))
    assert "HM (%)" in studies["seen"]["third"]


def test_the_resumed_study_has_each_mlflow_run_once_and_none_running(studies):
    tracked, twin = runs(studies["stopped"]), runs(studies["whole"])
    names = Counter((r.data.tags.get("gtep.phase"), r.data.tags.get("gtep.level"), r.info.run_name) for r in tracked)
    assert names == Counter((r.data.tags.get("gtep.phase"), r.data.tags.get("gtep.level"), r.info.run_name)
                            for r in twin)
    assert max(names.values()) == 1
    assert {r.info.status for r in tracked} == {"FINISHED"}
    metrics = {(r.data.tags.get("gtep.phase"), r.info.run_name): r.data.metrics.get("hmean") for r in tracked}
    assert metrics == {(r.data.tags.get("gtep.phase"), r.info.run_name): r.data.metrics.get("hmean") for r in twin}

