"""The tiny study that many tests read (tests/conftest.py's `tiny_study`): replay, 2 tasks of 3 classes, R=3 sets
over S=2 orderings, both phases through `gtep run` on Ray into a sqlite MLflow store; about 25 s on 2 cores."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

R, S, TASKS = 3, 2, 2
STUDY = "tiny"

CONFIG: dict[str, Any] = {
    "study": STUDY,
    "algorithm": "replay",
    "backbone": "resnet8",
    "scenario": {"increments": "3x2"},
    "datasets": {"split": {"dataset": "synthetic:classes=14,train=20,test=8", "classes_per_phase": 6, "seed": 1}},
    "search": {"trials": R, "orderings": S},
    "first_task": {"epochs": 3, "milestones": [2], "batch_size": 16},
    "training": {"memory_size": 12, "epoch_scale": 0.02},
    "compute": {"cpus_per_trial": 1, "max_concurrent": 2},
    "seed": 3,
}


def run_tiny_study(root: Path) -> dict[str, Any]:
    """`gtep run` of CONFIG under `root`; what it printed, its folders and its MLflow runs as they were at its end."""
    from mlflow.tracking import MlflowClient
    from typer.testing import CliRunner

    from gtep.cli import app

    config = root / "exp.yaml"
    config.write_text(yaml.safe_dump(CONFIG))
    result = CliRunner().invoke(app, ["run", "--config", str(config), "--output", str(root / "out")])
    assert result.exit_code == 0, result.output + str(result.exception)
    client = MlflowClient(tracking_uri=f"sqlite:///{root / 'out' / 'mlflow.db'}")
    experiment = client.get_experiment_by_name(f"gtep/{STUDY}")
    runs = client.search_runs([experiment.experiment_id], max_results=1000)
    return {"root": root, "out": root / "out", "folder": root / "out" / STUDY, "client": client, "runs": runs,
            "output": result.output}
