"""gtep on an existing Ray cluster of two nodes (a head and a worker on 127.0.0.1, separate resources and
temp dirs): trials on both nodes, results complete in the study's shared storage; the resource check;
`gtep submit` / `gtep jobs` through the head's Jobs API."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from tests.cluster.support import ENV, RayCluster, finish, gtep, tiny_study, write_config

pytestmark = pytest.mark.cluster

QUICK = {"epoch_scale": 0.05, "memory_size": 18}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    cluster = RayCluster(env=ENV, dashboard=True).start()
    yield cluster
    cluster.stop()


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gtep.cli", *args], env=ENV, capture_output=True, text=True,
                          timeout=600)


def test_trials_run_on_both_nodes_into_one_study(cluster, tmp_path):
    # trials of several seconds: Ray Tune runs sub-second trials one after another in one reused actor, on one node
    config = write_config(tmp_path, tiny_study("spread", trials=4, orderings=1, epochs=20,
                                               training={**QUICK, "epoch_scale": 0.25},
                                               compute={"cpus_per_trial": 1, "max_concurrent": 2}))
    finish(gtep("tune", "--config", str(config), "--output", str(tmp_path / "out"), "--address", cluster.address,
                log=tmp_path / "tune.log"), tmp_path / "tune.log")
    study = tmp_path / "out" / "spread"
    units = json.loads((study / "manifest.json").read_text())["units"]
    assert len(units) == 4 and all(u["status"] == "finished" for u in units.values())
    assert {u["node"] for u in units.values()} == set(cluster.node_ids())  # both nodes trained
    assert len(list((study / "units").rglob("*.json"))) == 4  # every node wrote into the same study folder
    assert (study / "best.yaml").exists()


def test_a_ray_client_address_drives_the_cluster_from_outside(cluster, tmp_path):
    config = write_config(tmp_path, tiny_study("client", trials=2, orderings=1, epochs=20, training=QUICK))
    done = cli("tune", "--config", str(config), "--output", str(tmp_path / "out"),
               "--address", f"ray://127.0.0.1:{cluster.client_port}")
    logs = "".join(p.read_text()[-1500:]
                   for p in cluster.temp_dirs[0].glob("session_latest/logs/ray_client_server*.err"))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:] + logs
    assert "best.yaml" in done.stdout
    units = json.loads((tmp_path / "out" / "client" / "manifest.json").read_text())["units"]
    assert len(units) == 2 and {u["node"] for u in units.values()} <= set(cluster.node_ids())


def test_a_trial_that_no_node_can_hold_is_refused_before_training(cluster, tmp_path):
    # the cluster has 2 CPUs in all, but no single node has 2
    config = write_config(tmp_path, tiny_study("toolarge", compute={"cpus_per_trial": 2}))
    done = cli("tune", "--config", str(config), "--output", str(tmp_path / "out"), "--address", cluster.address)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "compute.cpus_per_trial" in done.stderr and "largest" in done.stderr
    assert not (tmp_path / "out" / "toolarge").exists()


def test_submit_runs_the_study_as_a_ray_job(cluster, tmp_path):
    config = write_config(tmp_path, tiny_study("job", trials=2, orderings=1, epochs=20, training=QUICK))
    sent = cli("submit", "--address", cluster.dashboard, "--config", str(config), "--phase", "tune",
               "--output", str(tmp_path / "out"))
    assert sent.returncode == 0, sent.stdout + sent.stderr
    job_id = sent.stdout.strip().splitlines()[-1]
    waited = cli("jobs", "status", job_id, "--wait", "--address", cluster.dashboard)
    logs = cli("jobs", "logs", job_id, "--address", cluster.dashboard).stdout
    assert waited.returncode == 0 and "SUCCEEDED" in waited.stdout, waited.stdout + logs[-3000:]
    assert "best.yaml" in logs and "H*" in logs
    best = yaml.safe_load((tmp_path / "out" / "job" / "best.yaml").read_text())
    assert best["algorithm"] == "replay"
    assert job_id in cli("jobs", "list", "--address", cluster.dashboard).stdout


def test_a_submitted_job_can_be_stopped(cluster, tmp_path):
    config = write_config(tmp_path, tiny_study("long", trials=30, orderings=5, epochs=200))
    sent = cli("submit", "--address", cluster.dashboard, "--config", str(config), "--output", str(tmp_path / "out"))
    job_id = sent.stdout.strip().splitlines()[-1]
    assert cli("jobs", "stop", job_id, "--address", cluster.dashboard).returncode == 0
    waited = cli("jobs", "status", job_id, "--wait", "--address", cluster.dashboard)
    assert waited.returncode == 1 and "STOPPED" in waited.stdout


def test_submit_refuses_a_bad_config_before_contacting_the_cluster(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("study: x\nalgorithm: nope\n")
    done = cli("submit", "--address", "http://127.0.0.1:9", "--config", str(bad))
    assert done.returncode == 2 and "scenario" in done.stderr
