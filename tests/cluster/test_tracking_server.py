"""gtep against a real MLflow tracking server: PostgreSQL-backed lineage, and a server that goes away.

The PostgreSQL server comes from tests/with-postgres.sh (README's test command and .ci/run use it)."""
from __future__ import annotations

import json
import os
import subprocess
import tempfile
from collections import Counter
from pathlib import Path

import pytest
import yaml
from mlflow.tracking import MlflowClient

from tests.cluster.support import ENV, MlflowServer, count, finish, gtep, tiny_study, wait_for, write_config

pytestmark = pytest.mark.cluster

QUICK = {"epoch_scale": 0.05, "memory_size": 18}


def lineage(uri: str, study: str) -> list:
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name(f"gtep/{study}")
    return client.search_runs([experiment.experiment_id], max_results=1000)


def pending(study_dir: Path) -> int:
    state = json.loads((study_dir / "tracking" / "state.json").read_text())
    ops = [json.loads(line) for line in (study_dir / "tracking" / "journal.jsonl").read_text().splitlines()]
    return sum(1 for op in ops if op["seq"] > state["applied"])


def assert_complete(runs, trials: int, orderings: int, client: MlflowClient) -> None:
    tune_runs = [r for r in runs if r.data.tags.get("gtep.phase") == "tune"]
    assert Counter(r.data.tags["gtep.level"] for r in tune_runs) == {"phase": 1, "trial": trials,
                                                                     "ordering": trials * orderings}
    for run in tune_runs:
        assert run.info.status == "FINISHED", run.data.tags
        if run.data.tags["gtep.level"] == "ordering":
            assert {"acc", "avg_acc", "hmean", "train_seconds"} <= set(run.data.metrics)
            assert [m.step for m in client.get_metric_history(run.info.run_id, "acc_t")] == [1, 2, 3]


@pytest.fixture
def postgres_uri():
    uri = os.environ.get("GTEP_TEST_POSTGRES_URI")
    if not uri:
        if os.environ.get("CI"):
            pytest.fail("GTEP_TEST_POSTGRES_URI is not set: run the tests through tests/with-postgres.sh")
        pytest.skip("no PostgreSQL: run through tests/with-postgres.sh")
    return uri


def test_a_study_logs_its_lineage_to_a_postgresql_backed_server(tmp_path, postgres_uri):
    server = MlflowServer(tmp_path, backend_store_uri=postgres_uri, env=ENV).start()
    try:
        config = write_config(tmp_path, tiny_study("pg", trials=2, orderings=2, epochs=20, training=QUICK))
        output = finish(gtep("run", "--config", str(config), "--output", str(tmp_path / "out"),
                             "--tracking-uri", server.uri, log=tmp_path / "run.log"), tmp_path / "run.log")
        assert "evaluation" in output
        client = MlflowClient(tracking_uri=server.uri)
        runs = lineage(server.uri, "pg")
        assert_complete(runs, 2, 2, client)
        tune_phase, = [r for r in runs if r.data.tags["gtep.level"] == "phase" and r.data.tags["gtep.phase"] == "tune"]
        evaluate_phase, = [r for r in runs
                           if r.data.tags["gtep.level"] == "phase" and r.data.tags["gtep.phase"] == "evaluate"]
        assert evaluate_phase.data.tags["gtep.tuning_run_id"] == tune_phase.info.run_id
        trials = {r.info.run_id for r in runs
                  if r.data.tags["gtep.level"] == "trial" and r.data.tags["gtep.phase"] == "tune"}
        assert all(r.data.tags["mlflow.parentRunId"] in trials for r in runs
                   if r.data.tags["gtep.level"] == "ordering" and r.data.tags["gtep.phase"] == "tune")
        with tempfile.TemporaryDirectory() as scratch:  # artifacts go through the server to its destination
            best = yaml.safe_load(
                Path(client.download_artifacts(tune_phase.info.run_id, "best.yaml", scratch)).read_text())
        assert best["tuning_run_id"] == tune_phase.info.run_id
        assert best == yaml.safe_load((tmp_path / "out" / "pg" / "best.yaml").read_text())
    finally:
        server.stop()


@pytest.fixture
def server(tmp_path):
    """A server on sqlite in the test's folder, stopped at the end whatever the test left it as."""
    server = MlflowServer(tmp_path, env=ENV).start()
    yield server
    server.stop()


def tune_until_a_unit_is_trained(root: Path, server: MlflowServer, study: str, **options) -> subprocess.Popen:
    """`gtep tune` of tiny_study(study, **options) under root/out, tracked by `server`, once its first unit is
    trained; then the server goes away."""
    config = write_config(root, tiny_study(study, **options))
    driver = gtep("tune", "--config", str(config), "--output", str(root / "out"), "--tracking-uri", server.uri,
                  log=root / "tune.log")
    wait_for(lambda: count(root / "out" / study, "unit_trained") >= 1, 300, "a first unit")
    server.stop()
    return driver


def test_a_server_outage_mid_study_costs_no_metric(tmp_path, server):
    study_dir = tmp_path / "out" / "outage"
    # units of several seconds, so that the study is still running when the server is back (trials reuse their Ray
    # workers, so nothing but the units themselves keeps the study going that long)
    driver = tune_until_a_unit_is_trained(tmp_path, server, "outage", trials=4, orderings=2, epochs=20,
                                          training={**QUICK, "epoch_scale": 0.3})
    down_at = count(study_dir, "unit_trained")
    wait_for(lambda: count(study_dir, "unit_trained") >= down_at + 1, 300, "training to go on without the server")
    assert pending(study_dir) > 0  # writes are waiting, not lost
    server.start()
    assert driver.poll() is None, "the study ended before the server was back; make its units longer"
    output = finish(driver, tmp_path / "tune.log")
    assert "gtep sync" not in output and pending(study_dir) == 0
    assert_complete(lineage(server.uri, "outage"), 4, 2, MlflowClient(tracking_uri=server.uri))


def test_gtep_sync_writes_what_a_study_could_not(tmp_path, server):
    study_dir = tmp_path / "out" / "later"
    driver = tune_until_a_unit_is_trained(tmp_path, server, "later", trials=2, orderings=2, epochs=20,
                                          training=QUICK)
    output = finish(driver, tmp_path / "tune.log")  # the study ends normally while the server is away
    assert "gtep sync" in output and pending(study_dir) > 0
    server.start()
    finish(gtep("sync", str(study_dir), log=tmp_path / "sync.log"), tmp_path / "sync.log")
    assert pending(study_dir) == 0
    assert_complete(lineage(server.uri, "later"), 2, 2, MlflowClient(tracking_uri=server.uri))
