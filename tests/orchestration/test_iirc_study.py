"""A tiny IIRC study through `gtep run` on Ray, with a test-only multi-label learner the workers import from
GTEP_PLUGINS: H* chosen by mean pw-JS, every run tagged with the iirc family, pw-JS metrics in MLflow."""
import importlib
import json
import sys
from pathlib import Path

import pandas as pd
import pytest
import ray
import yaml
from mlflow.tracking import MlflowClient
from typer.testing import CliRunner

from gtep.cli import app

# a Ray study of its own (~80 s): in the `slow` group, which .ci/run runs after the default one
pytestmark = pytest.mark.slow

PLUGIN = "tests.engine.multilabel_learner"
R, S = 2, 2
SPACE = {"algorithm": "tiny_multilabel", "space": {"lr": [0.05, 0.01], "epochs": [2], "batch_size": [16],
                                                    "scheduler": ["constant"]}}


def study_config(root: Path) -> dict:
    return {
        "study": "iirc-tiny",
        "algorithm": "tiny_multilabel",
        "backbone": "resnet8",
        # groups group0..group3 of 4 classes; each phase: 2 superclasses + 8 subclasses, tasks of 1, 3, 3, 3
        "scenario": {"family": "iirc", "iirc": {"first_task_superclasses": 1, "classes_per_task": 3}},
        "datasets": {"split": {"dataset": "synthetic:classes=16,train=10,test=4", "by": "group",
                               "tuning_groups": ["group0", "group1"]}},
        "search": {"trials": R, "orderings": S, "space": str(root / "space.yaml")},
        "first_task": {"epochs": 2, "milestones": [1], "batch_size": 16},
        "training": {"memory_size": 0},
        "compute": {"cpus_per_trial": 1, "max_concurrent": 2},
        "seed": 2,
    }


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    """Ray's workers import the learner from GTEP_PLUGINS, which they inherit when Ray starts here; the driver
    imports it too, and it leaves the registry afterwards."""
    learners = importlib.import_module(PLUGIN)
    patch = pytest.MonkeyPatch()
    patch.setenv("GTEP_PLUGINS", PLUGIN)
    if ray.is_initialized():
        ray.shutdown()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    root = tmp_path_factory.mktemp("iirc")
    try:
        (root / "space.yaml").write_text(yaml.safe_dump(SPACE))
        config = root / "exp.yaml"
        config.write_text(yaml.safe_dump(study_config(root)))
        result = CliRunner().invoke(app, ["run", "--config", str(config), "--output", str(root / "out")],
                                    env={"COLUMNS": "200"})
        assert result.exit_code == 0, result.output + str(result.exception)
        client = MlflowClient(tracking_uri=f"sqlite:///{root / 'out' / 'mlflow.db'}")
        experiment = client.get_experiment_by_name("gtep/iirc-tiny")
        runs = client.search_runs([experiment.experiment_id], max_results=1000)
        yield {"folder": root / "out" / "iirc-tiny", "client": client, "runs": runs, "output": result.output}
    finally:
        ray.shutdown()
        patch.undo()
        learners.unregister()
        sys.modules.pop(PLUGIN, None)


def test_h_star_is_the_set_with_the_best_mean_pw_js(study):
    best = yaml.safe_load((study["folder"] / "best.yaml").read_text())
    assert best["criterion"] == "mean_pw_js" and best["family"] == "iirc"
    units = pd.read_csv(study["folder"] / "tune_results.csv")
    assert {"pw_js", "mean_pw_js", "js", "exact_match", "set_score"} <= set(units.columns)
    means = units.groupby("set_index")["mean_pw_js"].mean()
    assert best["set_index"] == int(means.idxmax())
    assert best["score"] == pytest.approx(means.max())


def test_every_run_is_tagged_iirc_and_logs_pw_js(study):
    runs = study["runs"]
    assert len(runs) == 1 + R + R * S + 1 + 1 + S
    for run in runs:
        assert run.data.tags["gtep.family"] == "iirc" and run.data.tags["gtep.criterion"] == "mean_pw_js"
    orderings = [r for r in runs if r.data.tags["gtep.level"] == "ordering"]
    for run in orderings:
        assert {"pw_js", "mean_pw_js", "js", "exact_match", "acc", "avg_acc"} <= set(run.data.metrics)
        assert 0 <= run.data.metrics["mean_pw_js"] <= 100
        accuracy = json.loads(Path(run.info.artifact_uri[len("file://"):], "accuracy.json").read_text())
        assert len(accuracy["acc_matrix"]) == 4
    phases = {r.data.tags["gtep.phase"]: r for r in runs if r.data.tags["gtep.level"] == "phase"}
    assert set(phases) == {"tune", "evaluate"}
    for run in phases.values():
        assert {"pw_js", "mean_pw_js", "mean_pw_js_std", "score"} <= set(run.data.metrics)
        assert run.data.metrics["score"] == pytest.approx(run.data.metrics["mean_pw_js"], abs=1e-3)


def test_the_terminal_names_the_scenario_and_criterion(study):
    assert "iirc 1 superclasses+3/task (groups)" in study["output"]
    assert "H* by mean_pw_js" in study["output"]
