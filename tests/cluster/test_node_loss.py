"""A Ray worker node lost mid-study (issue 57, item 6): every process of the worker node SIGKILLed while it trains a
unit, as a preempted machine goes. The study finishes on the head node: exit 0, every unit of both phases trained
and tracked once (no duplicate run), H* and every unit's metrics those of the same study without the fault; the
terminal says the loss in one line (which node, how many units are trained again) and Ray's own dump of it goes to
the study's log, not the terminal."""
from __future__ import annotations

import json
import re
from collections import Counter

import pytest
import yaml
from mlflow.tracking import MlflowClient

from tests.cluster.support import ENV, RayCluster, events, finish, gtep, tiny_study, wait_for, write_config

pytestmark = pytest.mark.cluster

CONFIG = tiny_study("lost", trials=3, orderings=1, epochs=20, training={"memory_size": 18, "epoch_scale": 0.25},
                    compute={"cpus_per_trial": 1, "max_concurrent": 2, "max_failures": 2})


# a line of a raylet's log, as the lost node's agents send its last 20 to the driver with "Raylet is terminated"
RAYLET_LOG_LINE = re.compile(r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} [DIWEF] \d+ \d+\]")


def unit_metrics(study_dir):
    manifest = json.loads((study_dir / "manifest.json").read_text())
    return {key: (u["status"], u["acc"], u["avg_acc"], tuple(u["acc_t"])) for key, u in manifest["units"].items()}


def running_on(study_dir, node: str):
    """A unit_started on `node` with no unit_trained after it yet (a unit the node is training now)."""
    log = events(study_dir)
    done = {(e["phase"], e["set_index"], e["ordering"]) for e in log if e["event"] == "unit_trained"}
    return next((e for e in log if e["event"] == "unit_started" and e.get("node") == node
                 and (e["phase"], e["set_index"], e["ordering"]) not in done), None)


@pytest.fixture(scope="module")
def studies(tmp_path_factory):
    root = tmp_path_factory.mktemp("node-loss")
    config = write_config(root, CONFIG)
    cluster = RayCluster(env=ENV)
    try:
        cluster.start()
        worker = cluster.worker_node_id()
        study_dir = root / "lost" / "lost"
        driver = gtep("run", "--config", str(config), "--output", str(root / "lost"), "--address", cluster.address,
                      log=root / "lost.log")

        lost_unit = wait_for(lambda: running_on(study_dir, worker), 300, "a unit training on the worker node")
        cluster.kill_worker()
        output = finish(driver, root / "lost.log")
    finally:
        cluster.stop()
    finish(gtep("run", "--config", str(config), "--output", str(root / "whole"), log=root / "whole.log"),
           root / "whole.log")
    return {"root": root, "output": output, "worker": worker, "lost_unit": lost_unit}


def test_the_loss_is_one_line_naming_the_node_and_the_units_trained_again(studies):
    output = studies["output"]
    lines = [line for line in output.splitlines() if studies["worker"][:8] in line and "lost" in line.lower()]
    assert len(lines) == 1, output[-6000:]
    assert "trained again" in lines[0]
    assert "Traceback" not in output and "ActorDiedError" not in output and "NodeDiedError" not in output, \
        output[-6000:]
    # the lost node's agents publish "Raylet is terminated" and the raylet log's last 20 lines when they outlive their
    # raylet (a race with the node's SIGKILL): never on the terminal; to the study's log
    # (tests/orchestration/test_node_loss.py checks that part without a cluster)
    assert "Raylet is terminated" not in output and not RAYLET_LOG_LINE.search(output), output[-6000:]
    log = studies["root"] / "lost" / "lost" / "ray-errors.log"
    assert log.exists() and studies["worker"][:8] in log.read_text()  # the rest: in the study's log


def test_every_unit_of_both_phases_is_trained_and_tracked_once(studies):
    study_dir = studies["root"] / "lost" / "lost"
    trained = Counter((e["phase"], e["set_index"], e["ordering"]) for e in events(study_dir)
                      if e["event"] == "unit_trained")
    assert set(trained.values()) == {1} and len(trained) == 3 + 1  # 3 sets x 1 ordering, then H* on D^E
    lost = studies["lost_unit"]
    assert trained[(lost["phase"], lost["set_index"], lost["ordering"])] == 1
    client = MlflowClient(tracking_uri=f"sqlite:///{studies['root'] / 'lost' / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("gtep/lost")
    runs = client.search_runs([experiment.experiment_id], max_results=1000)
    keys = Counter((r.data.tags.get("gtep.phase"), r.data.tags.get("gtep.level"), r.data.tags.get("gtep.set_index"),
                    r.data.tags.get("gtep.ordering")) for r in runs)
    assert set(keys.values()) == {1}, keys  # no duplicate run
    assert Counter(r.data.tags["gtep.level"] for r in runs) == {"phase": 2, "trial": 4, "ordering": 4}
    assert all(r.info.status == "FINISHED" for r in runs)


def test_h_star_and_every_unit_are_those_without_the_fault(studies):
    lost = yaml.safe_load((studies["root"] / "lost" / "lost" / "best.yaml").read_text())
    whole = yaml.safe_load((studies["root"] / "whole" / "lost" / "best.yaml").read_text())
    assert (lost["set_index"], lost["hparams"], lost["score"]) == (whole["set_index"], whole["hparams"],
                                                                   whole["score"])
    assert unit_metrics(studies["root"] / "lost" / "lost") == unit_metrics(studies["root"] / "whole" / "lost")
