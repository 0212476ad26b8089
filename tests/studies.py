"""The tiny study that many tests read (tests/conftest.py's `tiny_study`): replay, 2 tasks of 3 classes, R=3 sets
over S=2 orderings, both phases through `gtep run` on Ray into a sqlite MLflow store; about 25 s on 2 cores."""
from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any, Iterator

import yaml

R, S, TASKS = 3, 2, 2
STUDY = "tiny"
# A test worker's Ray has one CPU: the groups run a worker per core, so each worker's studies run one trial at a
# time. A trial's process spends some 5 s importing (torch and its compiler, Ray Tune, gtep) before it trains a
# tiny unit in a tenth of that; a second trial at once doubled that cost on cores the other worker already keeps
# busy (three tiny studies on each of two workers at once: 85 s with two trials at a time, 50 s with one).
RAY_CPUS = 1
USUAL_UMASK = 0o022  # a user's default: group and others may read what is not made owner-only

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


def tiny_config(study: str, algorithm: str, root: Path, trials: int, orderings: int,
                **sections: Any) -> dict[str, Any]:
    """A tiny study's experiment file: `algorithm` on resnet8, `trials` sets x `orderings` orderings drawn from
    root/space.yaml (run_study's `space`), two trials at once on a CPU each; `sections` give the rest."""
    return {"study": study, "algorithm": algorithm, "backbone": "resnet8",
            "search": {"trials": trials, "orderings": orderings, "space": str(root / "space.yaml")},
            "compute": {"cpus_per_trial": 1, "max_concurrent": 2}, **sections}


def run_study(root: Path, config: dict[str, Any], space: dict[str, Any] | None = None,
              columns: int | None = None) -> dict[str, Any]:
    """`gtep run` of `config` under `root` (its search space, when given, written to root/space.yaml first, where
    the config names it), in this process on the Ray it finds or starts; what it printed (in a terminal `columns`
    wide), its folders and its MLflow runs as they were at its end. It runs under a user's usual umask, 022, whatever
    the test runner's: what it leaves shows the modes gtep gives a study's files (test_study_end_to_end.py)."""
    from mlflow.tracking import MlflowClient
    from typer.testing import CliRunner

    from gtep.cli import app

    if space is not None:
        (root / "space.yaml").write_text(yaml.safe_dump(space))
    path = root / "exp.yaml"
    path.write_text(yaml.safe_dump(config))
    umask = os.umask(USUAL_UMASK)
    try:
        result = CliRunner().invoke(app, ["run", "--config", str(path), "--output", str(root / "out")],
                                    env=None if columns is None else {"COLUMNS": str(columns)})
    finally:
        os.umask(umask)
    assert result.exit_code == 0, result.output + str(result.exception)
    client = MlflowClient(tracking_uri=f"sqlite:///{root / 'out' / 'mlflow.db'}")
    experiment = client.get_experiment_by_name(f"gtep/{config['study']}")
    runs = client.search_runs([experiment.experiment_id], max_results=1000)
    return {"root": root, "out": root / "out", "folder": root / "out" / config["study"], "client": client,
            "runs": runs, "output": result.output}


def run_tiny_study(root: Path) -> dict[str, Any]:
    """`gtep run` of CONFIG under `root`."""
    return run_study(root, CONFIG)


def start_ray(cpus: int = RAY_CPUS) -> None:
    """Ray on this machine for a test worker, `cpus` CPUs, no dashboard, workers' output not echoed. It starts as
    `gtep run` starts its own, under owner_only (gtep.api._ray): its workers then write a study's units, checkpoints
    and events owner-only, as a command's own Ray does."""
    import ray

    from gtep.config.private import owner_only

    with owner_only():
        ray.init(num_cpus=cpus, include_dashboard=False, log_to_driver=False)


@contextlib.contextmanager
def own_ray(cpus: int = RAY_CPUS) -> Iterator[None]:
    """A Ray of this module's own, started after any other this worker holds is shut down, and shut down at the
    end: for a study whose workers must inherit something (GTEP_PLUGINS), start clean, or need more CPUs."""
    import ray

    if ray.is_initialized():
        ray.shutdown()
    start_ray(cpus)
    try:
        yield
    finally:
        ray.shutdown()


def assert_best_set(folder: Path, family: str, criterion: str, column: str,
                                  columns: set[str]) -> tuple[dict[str, Any], Any]:
    """best.yaml names `criterion` and `family`, tune_results.csv has `columns`, and H* is the set whose mean of
    `column` over its orderings is the highest, with that mean as its score. Returns best.yaml and the units' frame."""
    import pandas as pd
    import pytest

    best = yaml.safe_load((folder / "best.yaml").read_text())
    assert best["criterion"] == criterion and best["family"] == family
    units = pd.read_csv(folder / "tune_results.csv")
    assert columns <= set(units.columns)
    means = units.groupby("set_index")[column].mean()
    assert best["set_index"] == int(means.idxmax())
    assert best["score"] == pytest.approx(means.max())
    return best, units


def assert_tagged(runs: list[Any], family: str, criterion: str) -> None:
    for run in runs:
        assert run.data.tags["gtep.family"] == family and run.data.tags["gtep.criterion"] == criterion


def accuracy_artifact(run: Any) -> dict[str, Any]:
    """An ordering run's accuracy.json (a file store's artifact)."""
    return json.loads(Path(run.info.artifact_uri[len("file://"):], "accuracy.json").read_text())
