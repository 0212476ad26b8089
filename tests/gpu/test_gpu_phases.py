"""Every algorithm through both phases on CUDA, and four trials sharing one GPU (`pytest -m gpu`).

One Ray cluster holds the GPU for the module. The studies run as `gtep run` processes joined to it
(--address), several at a time as a user's matrix cells would, each trial asking for a quarter of the GPU;
each test then reads its study's MLflow store.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import ray
import yaml
from mlflow.tracking import MlflowClient

from gtep.algorithms import ALGORITHMS
from tests.gpu.support import ON_CUDA, gpu_group
from tests.orchestration.test_phases import config

pytestmark = gpu_group

GPU_SHARE = 0.25 if ON_CUDA else 0
RESNET_METHODS = [a for a in ALGORITHMS.names() if not ALGORITHMS.get(a).uses_pretrained and a != "finetune"
                  and "class_incremental" in ALGORITHMS.get(a).data_flows]
VIT_METHODS = [a for a in ALGORITHMS.names() if ALGORITHMS.get(a).uses_pretrained and a != "simplecil"]
ROOT = Path(__file__).resolve().parents[2]


def study_doc(algorithm: str, tmp: Path) -> dict:
    doc = config(study=f"gpu-{algorithm}", algorithm=algorithm,
                 compute={"gpus_per_trial": GPU_SHARE, "cpus_per_trial": 1})
    if algorithm in VIT_METHODS:
        from gtep.spaces import load_space
        from tests.helpers import VIT, VIT_DATASET, pretrained_vit

        doc.update(backbone=VIT, weights=pretrained_vit(),
                   datasets={"split": {"dataset": VIT_DATASET, "classes": list(range(10)), "classes_per_phase": 5}},
                   scenario={"increments": "C3xT1+C2xT1"}, training={"memory_size": 0, "epoch_scale": 0.2})
        space = {k: list(v) for k, v in load_space(algorithm).space.sets.items()}
        space.update(epochs=[min(space["epochs"])], batch_size=[16])
        if "M" in space:
            space["M"] = [256]
        (tmp / f"{algorithm}-space.yaml").write_text(yaml.safe_dump({"algorithm": algorithm, "space": space}))
        doc["search"] = {"trials": 1, "orderings": 1, "space": str(tmp / f"{algorithm}-space.yaml")}
    return doc


def run_study(tmp: Path, doc: dict, address: str, *extra: str) -> subprocess.CompletedProcess:
    path = tmp / f"{doc['study']}.yaml"
    path.write_text(yaml.safe_dump(doc))
    command = [sys.executable, "-c", "from gtep.cli import app; app()", "run" if not extra else extra[0],
               "--config", str(path), "--output", str(tmp / doc["study"]), "--address", address, *extra[1:]]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(command, capture_output=True, text=True, timeout=900, env=env, cwd=tmp)


def store(tmp: Path, study: str) -> MlflowClient:
    return MlflowClient(tracking_uri=f"sqlite:///{tmp / study / 'mlflow.db'}")


def ordering_runs(tmp: Path, study: str) -> list:
    client = store(tmp, study)
    experiment = client.get_experiment_by_name(f"gtep/{study}")
    return client.search_runs([experiment.experiment_id], "tags.`gtep.level` = 'ordering'", max_results=100)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    ray.init(num_cpus=12, num_gpus=1 if ON_CUDA else 0, include_dashboard=False, log_to_driver=False)
    yield ray.get_runtime_context().gcs_address, tmp_path_factory.mktemp("gpu-studies")
    ray.shutdown()


@pytest.fixture(scope="module")
def shared_gpu(cluster):
    """Four trials of one set each, a quarter of the GPU apiece, long enough to overlap."""
    address, tmp = cluster
    doc = config(study="four-per-gpu", search={"trials": 4, "orderings": 1},
                 compute={"gpus_per_trial": GPU_SHARE, "cpus_per_trial": 1, "max_concurrent": 4},
                 training={"memory_size": 12, "epoch_scale": 0.2})
    done = run_study(tmp, doc, address, "tune")
    events = [json.loads(line)
              for line in (tmp / "four-per-gpu" / "four-per-gpu" / "events.jsonl").read_text().splitlines()]
    return done, events, ordering_runs(tmp, "four-per-gpu")


@pytest.fixture(scope="module")
def studies(cluster, shared_gpu):
    """Every algorithm's `gtep run`, six processes at a time on the shared cluster."""
    address, tmp = cluster
    docs = {a: study_doc(a, tmp) for a in RESNET_METHODS + VIT_METHODS}
    with ThreadPoolExecutor(6) as pool:
        done = dict(zip(docs, pool.map(lambda d: run_study(tmp, d, address), docs.values())))
    return tmp, done


@pytest.mark.parametrize("algorithm", RESNET_METHODS + VIT_METHODS)
def test_every_algorithm_runs_both_phases_on_the_gpu(studies, algorithm):
    tmp, done = studies
    result = done[algorithm]
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    runs = ordering_runs(tmp, f"gpu-{algorithm}")
    assert sorted(r.data.tags["gtep.phase"] for r in runs) == ["evaluate", "tune"]
    for run in runs:
        assert run.info.status == "FINISHED"
        device = run.data.tags["gtep.device"]
        assert device.startswith("cuda:") if ON_CUDA else device == "cpu"
        assert 0 <= run.data.metrics["acc"] <= 100 and run.data.metrics["params_total"] > 0


def test_four_trials_share_one_gpu_at_a_quarter_each(shared_gpu):
    done, events, runs = shared_gpu
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    started = [e for e in events if e["event"] == "unit_started"]
    first_done = min(e["time"] for e in events if e["event"] == "unit_trained")
    assert len(started) == 4 and len({e["pid"] for e in started}) == 4
    assert all(e["time"] < first_done for e in started), "the four trials did not train at the same time"
    assert len(runs) == 4
    devices = {r.data.tags["gtep.device"] for r in runs}
    assert len(devices) == 1 and (next(iter(devices)).startswith("cuda:0") if ON_CUDA else devices == {"cpu"})
