"""A tiny FSCIL study through `gtep run`: H* chosen by the gAcc AUC, every run tagged with its family and
criterion, FSCIL's metrics in MLflow, the results CSVs and the terminal table."""
import json
from pathlib import Path

import pandas as pd
import pytest
import yaml
from mlflow.tracking import MlflowClient
from typer.testing import CliRunner

from gtep.cli import app

R, S = 3, 2
CONFIG = {
    "study": "fscil-tiny",
    "algorithm": "replay",
    "backbone": "resnet8",
    "scenario": {"family": "fscil", "fscil": {"base_classes": 4, "ways": 2, "shots": 3, "sessions": 2}},
    "datasets": {"split": {"dataset": "synthetic:classes=18,train=20,test=6", "classes_per_phase": 8, "seed": 1}},
    "search": {"trials": R, "orderings": S},
    "first_task": {"epochs": 3, "milestones": [2], "batch_size": 16},
    "training": {"memory_size": 16, "epoch_scale": 0.02},
    "compute": {"cpus_per_trial": 1, "max_concurrent": 2},
    "seed": 2,
}


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    root = tmp_path_factory.mktemp("fscil")
    config = root / "exp.yaml"
    config.write_text(yaml.safe_dump(CONFIG))
    result = CliRunner().invoke(app, ["run", "--config", str(config), "--output", str(root / "out")],
                                env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output + str(result.exception)
    client = MlflowClient(tracking_uri=f"sqlite:///{root / 'out' / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("gtep/fscil-tiny")
    runs = client.search_runs([experiment.experiment_id], max_results=1000)
    return {"folder": root / "out" / "fscil-tiny", "client": client, "runs": runs, "output": result.output}


def test_h_star_is_the_set_with_the_best_gacc_auc(study):
    best = yaml.safe_load((study["folder"] / "best.yaml").read_text())
    assert best["criterion"] == "gacc_auc" and best["family"] == "fscil"
    units = pd.read_csv(study["folder"] / "tune_results.csv")
    assert {"gacc_auc", "aacc", "novel_acc", "set_score", "criterion"} <= set(units.columns)
    means = units.groupby("set_index")["gacc_auc"].mean()
    assert best["set_index"] == int(means.idxmax())
    assert best["score"] == pytest.approx(means.max())
    assert set(units["criterion"]) == {"gacc_auc"}


def test_every_run_is_tagged_and_logs_fscils_metrics_in_percent(study):
    runs = study["runs"]
    assert len(runs) == 1 + R + R * S + 1 + 1 + S  # tune, its trials and orderings; evaluate, its trial, orderings
    for run in runs:
        assert run.data.tags["gtep.family"] == "fscil" and run.data.tags["gtep.criterion"] == "gacc_auc"
    orderings = [r for r in runs if r.data.tags["gtep.level"] == "ordering"]
    for run in orderings:
        accuracy = json.loads(Path(run.info.artifact_uri[len("file://"):], "accuracy.json").read_text())
        assert {"gacc_auc", "aacc", "novel_acc", "kr"} <= set(run.data.metrics)
        assert 0 <= run.data.metrics["gacc_auc"] <= 100
        assert len(accuracy["acc_matrix"]) == 3
        history = study["client"].get_metric_history(run.info.run_id, "gacc_alpha")
        assert sorted(m.step for m in history) == list(range(13))
    for trial in [r for r in runs if r.data.tags["gtep.level"] == "trial"]:
        m = trial.data.metrics  # hmean keeps its meaning (Acc, AvgAcc); score is the criterion, gAcc AUC
        assert m["hmean"] == pytest.approx(2 * m["acc"] * m["avg_acc"] / (m["acc"] + m["avg_acc"]), abs=1e-3)
        assert m["score"] == pytest.approx(m["gacc_auc"], abs=1e-3)
    phases = {r.data.tags["gtep.phase"]: r for r in runs if r.data.tags["gtep.level"] == "phase"}
    assert set(phases) == {"tune", "evaluate"}
    for run in phases.values():
        assert {"gacc_auc", "gacc_auc_std", "aacc", "score"} <= set(run.data.metrics)
        assert run.data.metrics["score"] == pytest.approx(run.data.metrics["gacc_auc"], abs=1e-3)
        assert len(study["client"].get_metric_history(run.info.run_id, "gacc_alpha")) == 13


def test_the_terminal_shows_the_familys_metrics_beside_acc(study):
    output = study["output"]
    assert "fscil 4+2x2-way 3-shot" in output
    assert "gAcc AUC (%)" in output and "aAcc (%)" in output
    assert "H* by gacc_auc" in output
