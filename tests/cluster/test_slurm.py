"""gtep on SLURM for real: clusters/slurm/gtep.sbatch submitted with `sbatch` to the one-machine SLURM cluster of
tests/with-slurm.sh, asking for GPUs the SLURM way (--gpus-per-node) that the study simulates on the CPU.

The job is requeued (`scontrol requeue`) once a unit of its study has finished and while others run: SLURM kills
it and starts it again under the same id, and the script resumes the study by itself (SLURM_RESTART_COUNT), nobody
types --resume. Then: no unit trained twice over both starts, no MLflow run duplicated, and H* and every unit's
metrics are those of the same study run locally with `gtep run`.

Run it through the wrapper: bash tests/with-slurm.sh .venv/bin/python -m pytest -m cluster tests/cluster/test_slurm.py
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import yaml
from mlflow.tracking import MlflowClient

from tests.cluster.support import ENV, events, finish, gtep, tiny_study, wait_for, write_config

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).resolve().parents[2]
SBATCH = ROOT / "clusters" / "slurm" / "gtep.sbatch"
R, S = 2, 2
# Two simulated GPUs from SLURM, half a GPU a trial: Ray packs two trials on a GPU, as on a GPU node.
GPU_COMPUTE = {"cpus_per_trial": 1, "gpus_per_trial": 0.5, "simulate_gpus": True, "max_concurrent": 2}
CONFIG = tiny_study("slurm", trials=R, orderings=S, epochs=6, training={"memory_size": 18, "epoch_scale": 0.05},
                    compute=GPU_COMPUTE)


def scontrol_job(job: str) -> dict[str, str]:
    out = subprocess.run(["scontrol", "show", "job", "-o", job], capture_output=True, text=True, check=True).stdout
    return dict(re.findall(r"(\w+)=(\S*)", out))


def units_trained(study_dir: Path) -> Counter:
    return Counter((e["phase"], e["set_index"], e["ordering"]) for e in events(study_dir)
                   if e["event"] == "unit_trained")


def unit_metrics(study_dir: Path) -> dict:
    manifest = json.loads((study_dir / "manifest.json").read_text())
    return {key: (u["status"], u["acc"], u["avg_acc"], tuple(u["acc_t"])) for key, u in manifest["units"].items()}


@pytest.fixture(scope="module")
def slurm_study(tmp_path_factory):
    if not os.environ.get("GTEP_TEST_SLURM"):
        if os.environ.get("CI"):
            pytest.fail("GTEP_TEST_SLURM is not set: run the tests through tests/with-slurm.sh")
        pytest.skip("no SLURM cluster: run through tests/with-slurm.sh")
    root = tmp_path_factory.mktemp("slurm")
    config = write_config(root, CONFIG)
    output = root / "slurm-out"
    study_dir = output / "slurm"

    # the sbatch script's settings come from the environment it is called in (sbatch passes it on); the job's
    # own Ray uses token auth, which the script turns on whatever the tests set
    env = {**ENV, "GTEP_CONFIG": str(config), "GTEP_OUTPUT": str(output),
           "GTEP_VENV": str(Path(sys.executable).parent.parent), "GTEP_JOIN_TIMEOUT": "180"}
    env.pop("RAY_TMPDIR", None)
    submitted = subprocess.run(["sbatch", "--parsable", "--nodes=1", "--cpus-per-task=2", "--gpus-per-node=2",
                                "--time=20", str(SBATCH)], cwd=root, env=env, capture_output=True, text=True)
    assert submitted.returncode == 0, submitted.stderr
    job = submitted.stdout.strip().split(";")[0]
    log = root / f"gtep-{job}.log"
    try:
        # requeue once a unit has finished, while the job still runs the rest
        wait_for(lambda: sum(units_trained(study_dir).values()) >= 1, 600, f"a finished unit (job log {log})")
        assert scontrol_job(job)["JobState"] == "RUNNING", log.read_text()[-3000:]
        subprocess.run(["scontrol", "requeue", job], check=True)
        wait_for(lambda: scontrol_job(job)["JobState"] == "PENDING", 120, "SLURM to stop the job and queue it again")
        before_requeue = units_trained(study_dir)
        # SLURM holds a requeued job for two minutes (its BeginTime) once the old one is cleaned up; no need here
        subprocess.run(["scontrol", "update", f"JobId={job}", "StartTime=now"], check=True)
        wait_for(lambda: scontrol_job(job)["JobState"] in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"), 900,
                 f"the requeued job to finish (job log {log})")
        state = scontrol_job(job)
    finally:
        if scontrol_job(job)["JobState"] not in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"):
            subprocess.run(["scancel", job], check=False)
    assert state["JobState"] == "COMPLETED", f"{state}\n{log.read_text()[-4000:]}"

    local = root / "local.yaml"
    local.write_text(yaml.safe_dump({**CONFIG, "compute": {"cpus_per_trial": 1, "max_concurrent": 2}}))
    finish(gtep("run", "--config", str(local), "--output", str(root / "local"), log=root / "local.log"),
           root / "local.log")
    return {"job": job, "state": state, "log": log.read_text(), "study": study_dir, "output": output,
            "before_requeue": before_requeue, "local": root / "local" / "slurm"}


def test_the_requeued_job_ran_twice_and_resumed_by_itself(slurm_study):
    assert slurm_study["state"]["Restarts"] == "1"
    log = slurm_study["log"]
    # the first start ran the config, the second resumed the study folder: the script chose, nobody typed it
    assert log.count("DUE TO JOB REQUEUE") >= 1
    assert log.count(f"gtep.sbatch: resuming {slurm_study['study']} (restart 1)") == 1
    assert 1 <= sum(slurm_study["before_requeue"].values()) < R * S + S


def test_no_finished_unit_is_trained_again(slurm_study):
    trained = units_trained(slurm_study["study"])
    assert len(trained) == R * S + S  # every (phase, set, ordering) of both phases
    assert set(trained.values()) == {1}, trained
    reused = {(e["phase"], e["set_index"], e["ordering"]) for e in events(slurm_study["study"])
              if e["event"] == "unit_reused"}
    assert set(slurm_study["before_requeue"]) <= reused


def test_mlflow_runs_are_not_duplicated(slurm_study):
    client = MlflowClient(tracking_uri=f"sqlite:///{slurm_study['output'] / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("gtep/slurm")
    runs = client.search_runs([experiment.experiment_id], max_results=1000)
    levels = Counter((r.data.tags.get("gtep.phase"), r.data.tags.get("gtep.level")) for r in runs)
    assert levels[("tune", "phase")] == 1 and levels[("tune", "trial")] == R and levels[("tune", "ordering")] == R * S
    keys = Counter((r.data.tags.get("gtep.phase"), r.data.tags.get("gtep.level"), r.data.tags.get("gtep.set_index"),
                    r.data.tags.get("gtep.ordering")) for r in runs)
    assert set(keys.values()) == {1}, keys
    assert all(r.info.status == "FINISHED" for r in runs)


def test_the_gpus_slurm_allocated_reach_ray(slurm_study):
    started = [e for e in events(slurm_study["study"]) if e["event"] == "unit_started"]
    assert started and all(e.get("gpu_ids") for e in started)
    assert {g for e in started for g in e["gpu_ids"]} <= {"0", "1"}


def test_slurm_selects_the_same_best_set_as_a_local_run(slurm_study):
    on_slurm = yaml.safe_load((slurm_study["study"] / "best.yaml").read_text())
    local = yaml.safe_load((slurm_study["local"] / "best.yaml").read_text())
    assert (on_slurm["set_index"], on_slurm["hparams"], on_slurm["score"]) == \
        (local["set_index"], local["hparams"], local["score"])
    assert unit_metrics(slurm_study["study"]) == unit_metrics(slurm_study["local"])
