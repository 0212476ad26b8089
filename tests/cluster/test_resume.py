"""A study whose driver is killed (SIGKILL) mid-study and resumed with `gtep tune --resume`:
finished units are not trained again, MLflow runs are not duplicated, and H* and every unit's metrics
equal those of an uninterrupted study with the same config."""
from __future__ import annotations

import json
import os
import signal
from collections import Counter

import pytest
import yaml
from mlflow.tracking import MlflowClient

from tests.cluster.support import count, events, finish, gtep, kill_group, tiny_study, wait_for, write_config

pytestmark = pytest.mark.cluster

CONFIG = tiny_study("crash", trials=3, orderings=2, epochs=40, training={"memory_size": 18, "epoch_scale": 0.3})


def tune_runs(output, study="crash"):
    client = MlflowClient(tracking_uri=f"sqlite:///{output / 'mlflow.db'}")
    experiment = client.get_experiment_by_name(f"gtep/{study}")
    return [r for r in client.search_runs([experiment.experiment_id], max_results=1000)
            if r.data.tags.get("gtep.phase") == "tune"]


def unit_metrics(study_dir):
    manifest = json.loads((study_dir / "manifest.json").read_text())
    return {key: (u["status"], u["acc"], u["avg_acc"], tuple(u["acc_t"])) for key, u in manifest["units"].items()}


def running_unit_with_checkpoint(study_dir):
    """The unit_started event of a unit that has a task checkpoint and no unit_trained event yet."""
    log = events(study_dir)
    finished = {(e["set_index"], e["ordering"]) for e in log if e["event"] == "unit_trained"}
    checkpoints = {p.stem for p in (study_dir / "checkpoints").rglob("*.pt")}
    for e in log:
        if e["event"] == "unit_started" and (e["set_index"], e["ordering"]) not in finished \
                and f"set{e['set_index']:03d}-o{e['ordering']}" in checkpoints:
            return e
    return None


def kill_pid(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    wait_for(lambda: not os.path.exists(f"/proc/{pid}") or "zombie" in open(f"/proc/{pid}/status").read().lower(),
             30, f"process {pid} to end")


@pytest.fixture(scope="module")
def studies(tmp_path_factory):
    root = tmp_path_factory.mktemp("resume")
    config = write_config(root, CONFIG)
    crashed, whole = root / "crashed", root / "whole"
    study_dir = crashed / "crash"

    driver = gtep("tune", "--config", str(config), "--output", str(crashed), log=root / "first.log")
    # kill once two units are finished and a running one has checkpointed a task: the driver's process
    # group, and the Ray worker running that unit (it would otherwise finish it before Ray reaps it)
    victim = wait_for(lambda: count(study_dir, "unit_trained") >= 2 and running_unit_with_checkpoint(study_dir),
                      300, "two finished units and a checkpoint")
    kill_group(driver)
    kill_pid(victim["pid"])
    killed_after = {(e["set_index"], e["ordering"]) for e in events(study_dir) if e["event"] == "unit_trained"}
    assert (victim["set_index"], victim["ordering"]) not in killed_after

    resumed = gtep("tune", "--resume", str(study_dir), log=root / "resume.log")
    resume_output = finish(resumed, root / "resume.log")
    finish(gtep("tune", "--config", str(config), "--output", str(whole), log=root / "whole.log"), root / "whole.log")
    return {"crashed": crashed, "whole": whole, "killed_after": killed_after, "resume_output": resume_output,
            "victim": (victim["set_index"], victim["ordering"])}


def test_finished_units_are_not_trained_again(studies):
    log = events(studies["crashed"] / "crash")
    trained = Counter((e["set_index"], e["ordering"]) for e in log if e["event"] == "unit_trained")
    assert len(trained) == CONFIG["search"]["trials"] * CONFIG["search"]["orderings"]
    assert set(trained.values()) == {1}, trained  # every unit trained exactly once over both drivers
    assert studies["killed_after"] <= {(e["set_index"], e["ordering"]) for e in log if e["event"] == "unit_reused"}
    # the unit that was running when the driver died continued from its checkpoint
    victim, = [e for e in log if e["event"] == "unit_trained" and (e["set_index"], e["ordering"]) == studies["victim"]]
    assert victim["resumed_tasks"] > 0


def test_mlflow_runs_are_reopened_not_duplicated(studies):
    runs = tune_runs(studies["crashed"])
    by_level = Counter(r.data.tags["gtep.level"] for r in runs)
    assert by_level == {"phase": 1, "trial": 3, "ordering": 6}
    keys = Counter((r.data.tags.get("gtep.set_index"), r.data.tags.get("gtep.ordering")) for r in runs
                   if r.data.tags["gtep.level"] == "ordering")
    assert set(keys.values()) == {1}
    assert all(r.info.status == "FINISHED" for r in runs)


def test_resumed_study_selects_the_same_best_set_with_the_same_metrics(studies):
    crashed = yaml.safe_load((studies["crashed"] / "crash" / "best.yaml").read_text())
    whole = yaml.safe_load((studies["whole"] / "crash" / "best.yaml").read_text())
    assert crashed["set_index"] == whole["set_index"] and crashed["hparams"] == whole["hparams"]
    assert crashed["score"] == whole["score"]
    assert unit_metrics(studies["crashed"] / "crash") == unit_metrics(studies["whole"] / "crash")


def test_a_trial_whose_worker_dies_is_retried_from_its_last_task(tmp_path):
    """SIGKILL to the Ray worker running a trial: Ray retries the trial (compute.max_failures), which
    reports its finished orderings from disk and continues the running one from its checkpoint."""
    config = write_config(tmp_path, {**CONFIG, "study": "worker"})
    study_dir = tmp_path / "out" / "worker"
    driver = gtep("tune", "--config", str(config), "--output", str(tmp_path / "out"), log=tmp_path / "tune.log")
    victim = wait_for(lambda: count(study_dir, "unit_trained") >= 1 and running_unit_with_checkpoint(study_dir), 300,
                      "a running unit with a checkpoint")
    kill_pid(victim["pid"])
    finish(driver, tmp_path / "tune.log")

    log = events(study_dir)
    trained = Counter((e["set_index"], e["ordering"]) for e in log if e["event"] == "unit_trained")
    assert set(trained.values()) == {1} and len(trained) == 6
    retried = [e for e in log if e["event"] == "unit_trained"
               and (e["set_index"], e["ordering"]) == (victim["set_index"], victim["ordering"])]
    assert retried[0]["resumed_tasks"] > 0 and retried[0]["pid"] != victim["pid"]
    runs = tune_runs(tmp_path / "out", "worker")
    assert Counter(r.data.tags["gtep.level"] for r in runs) == {"phase": 1, "trial": 3, "ordering": 6}
