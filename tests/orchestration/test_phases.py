"""Learners of every kind through `gtep run`, diverged sets, Optuna, evaluate from a run id or a preset, the UI.

Ray is started once per test worker (tests/conftest.py: local_ray); the CLI joins it instead of starting its own.
"""
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml
from mlflow.tracking import MlflowClient
from typer.testing import CliRunner

from gtep.cli import app

runner = CliRunner()


def config(**changes) -> dict:
    doc = {
        "study": "phases",
        "algorithm": "replay",
        "backbone": "resnet8",
        "scenario": {"increments": "3x2"},
        "datasets": {"split": {"dataset": "synthetic:classes=12,train=16,test=6", "classes_per_phase": 6}},
        "search": {"trials": 1, "orderings": 1},
        "first_task": {"epochs": 2, "milestones": [1], "batch_size": 16},
        "training": {"memory_size": 12, "epoch_scale": 0.01},
        "seed": 0,
    }
    for key, value in changes.items():
        doc[key] = {**doc[key], **value} if isinstance(value, dict) and key in doc else value
    return doc


pytestmark = pytest.mark.usefixtures("local_ray")  # this worker's Ray (tests/conftest.py)


def gtep(tmp_path: Path, command: str, doc: dict, *extra: str):
    path = tmp_path / f"{doc['study']}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return runner.invoke(app, [command, "--config", str(path), "--output", str(tmp_path / "out"), *extra])


def store(tmp_path: Path) -> MlflowClient:
    return MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'out' / 'mlflow.db'}")


def runs_of(client: MlflowClient, study: str, **tags):
    experiment = client.get_experiment_by_name(f"gtep/{study}")
    runs = client.search_runs([experiment.experiment_id], max_results=500)
    return [r for r in runs if all(r.data.tags.get(f"gtep.{k}") == v for k, v in tags.items())]


# Every learner's training is the golden record's (tests/algorithms/test_contract_regression.py, registry-driven,
# without Ray: its accuracy matrix, status and parameter counts), every shipped search space's values are checked by
# tests/preflight/test_param_ranges.py, and the default group's tiny study runs replay through Ray. Through Ray and
# both phases here, in the `slow` group, only the learners whose state differs in kind from replay's: iCaRL carries
# the previous network for distillation from task to task (the old-model copy a trial's process holds), DER grows
# its network every task (the parameter counts a trial logs change). The logging below is the trainable's, the same
# for every learner.
THROUGH_RAY = ("icarl", "der")


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", THROUGH_RAY)
def test_learners_of_every_kind_run_both_phases(tmp_path, algorithm):
    result = gtep(tmp_path, "run", config(study=f"all-{algorithm}", algorithm=algorithm))
    assert result.exit_code == 0, result.output + repr(result.exception)
    assert "gap" in result.output
    orderings = runs_of(store(tmp_path), f"all-{algorithm}", level="ordering")
    assert len(orderings) == 2
    for run in orderings:
        assert run.data.params["gtep.algorithm"] == algorithm
        assert {"params_total", "params_trainable", "train_seconds"} <= set(run.data.metrics)


def test_diverged_sets_are_tracked_excluded_and_the_study_goes_on(tmp_path):
    space = tmp_path / "space.yaml"
    space.write_text("algorithm: replay\nspace:\n  lr: [1000000.0, 0.05]\n  epochs: [200]\n  batch_size: [16]\n")
    doc = config(study="diverging", search={"trials": 4, "orderings": 2, "space": str(space)})
    result = gtep(tmp_path, "tune", doc)
    assert result.exit_code == 0, result.output
    manifest = json.loads((tmp_path / "out" / "diverging" / "manifest.json").read_text())
    lrs = {s["index"]: s["hparams"]["lr"] for s in manifest["sets"]}
    assert set(lrs.values()) == {1000000.0, 0.05}, "the seed should draw both values"
    diverged = {u["set_index"] for u in manifest["units"].values() if u["status"] == "diverged"}
    assert diverged == {i for i, lr in lrs.items() if lr > 1}
    best = yaml.safe_load((tmp_path / "out" / "diverging" / "best.yaml").read_text())
    assert best["hparams"]["lr"] == 0.05
    client = store(tmp_path)
    failed = runs_of(client, "diverging", level="ordering", status="diverged")
    assert len(failed) == 2 * len(diverged) and all(r.info.status == "FAILED" for r in failed)

    space.write_text("algorithm: replay\nspace:\n  lr: [1000000.0]\n  epochs: [200]\n  batch_size: [16]\n")
    result = gtep(tmp_path, "tune",
                  config(study="all-diverge", search={"trials": 2, "orderings": 1, "space": str(space)}))
    assert result.exit_code == 2
    assert "all 2 hyperparameter sets diverged" in result.stderr


@pytest.mark.slow  # three phases through Ray; `evaluate --hparams original` is also report_store's (default group)
def test_evaluate_from_a_tuning_run_and_from_the_original_preset(tmp_path):
    doc = config(study="two-step", search={"trials": 2, "orderings": 1})
    assert gtep(tmp_path, "tune", doc).exit_code == 0
    client = store(tmp_path)
    tune_run, = runs_of(client, "two-step", level="phase", phase="tune")
    result = gtep(tmp_path, "evaluate", doc, "--tuning-run", tune_run.info.run_id)
    assert result.exit_code == 0, result.output
    best = yaml.safe_load((tmp_path / "out" / "two-step" / "best.yaml").read_text())
    evaluated, = runs_of(client, "two-step", level="phase", phase="evaluate")
    assert evaluated.data.tags["gtep.tuning_run_id"] == tune_run.info.run_id
    ordering, = runs_of(client, "two-step", level="ordering", phase="evaluate")
    assert ordering.data.params["lr"] == str(best["hparams"]["lr"])

    result = gtep(tmp_path, "evaluate", doc, "--hparams", "original")
    assert result.exit_code == 0, result.output
    latest = [r for r in runs_of(client, "two-step", level="phase", phase="evaluate")
              if r.data.tags.get("gtep.hparams_source") == "preset:original"]
    assert len(latest) == 1
    bad = gtep(tmp_path, "evaluate", doc, "--tuning-run", "0" * 32)
    assert bad.exit_code == 2 and "--tuning-run" in bad.stderr


def test_ui_serves_the_store_on_loopback(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    MlflowClient(tracking_uri=f"sqlite:///{out / 'mlflow.db'}").search_experiments()  # creates the store
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    proc = subprocess.Popen([sys.executable, "-m", "gtep.cli", "ui", "--output", str(out), "--port", str(port)],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline, body = time.time() + 90, None
        while time.time() < deadline and body is None:
            try:
                body = urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2).read()
            except OSError:
                time.sleep(1)
        assert body is not None and b"OK" in body
        listening = subprocess.run(["ss", "-ltn"], capture_output=True, text=True).stdout
        assert f"127.0.0.1:{port}" in listening and f"0.0.0.0:{port}" not in listening
        workers = subprocess.run(["pgrep", "-f", "--", f"--port {port} --workers 1"], capture_output=True, text=True)
        assert workers.stdout.split(), "gtep ui runs MLflow with one worker"
        proc.terminate()  # SIGTERM to gtep ui alone: it passes it on to the server and its workers
        assert proc.wait(timeout=60) == 0
        def serving() -> bool:
            return subprocess.run(["pgrep", "-f", "--", f"--port {port} "], stdout=subprocess.DEVNULL).returncode == 0

        deadline = time.time() + 30
        while time.time() < deadline and serving():
            time.sleep(0.5)
        assert not serving(), "a server process outlived gtep ui"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 15)
            proc.wait(timeout=30)


# Every pretrained learner's training on the test ViT is the golden record's, which also holds that each trains
# fewer parameters than it holds (test_contract_regression.py: test_the_golden_records_hold_what_a_study_logs); the
# local weights' path through Ray to a trial, both phases and MLflow is the same for every one of them: one learner
# here, APER's adapter (it trains on the first task only, then merges: the pretrained path with the most steps).
@pytest.mark.slow
@pytest.mark.parametrize("algorithm", ["aper_adapter"])
def test_a_pretrained_method_runs_both_phases_on_local_weights(tmp_path, algorithm):
    from tests.helpers import VIT, VIT_DATASET, pretrained_vit

    doc = config(study=f"vit-{algorithm}", algorithm=algorithm, backbone=VIT)
    doc["weights"] = pretrained_vit()
    doc["datasets"] = {"split": {"dataset": VIT_DATASET, "classes": list(range(10)), "classes_per_phase": 5}}
    doc["scenario"] = {"increments": "C3xT1+C2xT1"}
    doc["training"] = {"memory_size": 0, "epoch_scale": 0.2}
    doc["search"] = {"trials": 1, "orderings": 1, "space": str(tmp_path / "space.yaml")}
    # the method's own sets, but the smallest epochs and batch so the run stays a smoke test
    from gtep.spaces import load_space

    space = {k: list(v) for k, v in load_space(algorithm).space.sets.items()}
    space.update(epochs=[min(space["epochs"])], batch_size=[16])
    for key, values in space.items():
        if key in ("M",):
            space[key] = [256]
    (tmp_path / "space.yaml").write_text(yaml.safe_dump({"algorithm": algorithm, "space": space}))
    result = gtep(tmp_path, "run", doc)
    assert result.exit_code == 0, result.output + repr(result.exception)
    orderings = runs_of(store(tmp_path), f"vit-{algorithm}", level="ordering")
    assert len(orderings) == 2
    for run in orderings:
        assert run.data.params["gtep.weights"] == doc["weights"]
        assert run.data.metrics["params_trainable"] < run.data.metrics["params_total"]
