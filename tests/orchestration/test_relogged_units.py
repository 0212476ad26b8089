"""A unit logged to MLflow before its driver was killed, and logged again by the resume (its manifest entry was not
saved yet, so the resumed trial reuses its unit file and reports it again), must not leave two points per metric:
the reused record carries the time it was trained (`trained_at`), and MLflow keeps identical points once."""
from __future__ import annotations

import json
import shutil
import time

from mlflow.tracking import MlflowClient

from gtep.orchestration import trainable
from gtep.orchestration.journal import TrackingJournal
from gtep.orchestration.study import Manifest
from gtep.orchestration.tracking import MlflowWriter
from gtep.orchestration.trainable import run_unit
from gtep.orchestration.trial_job import StudyFolders
from gtep.protocol.phases import TUNE


def writer(study, uri: str, experiment: str) -> MlflowWriter:
    journal = TrackingJournal.open(study, uri, experiment)
    journal.create_run("tune", "tune")
    manifest = Manifest.create(study / "manifest.json", {"study": "s"})
    return MlflowWriter(journal, "tune", TUNE, 2, manifest, set_index_of=lambda trial: 0,
                        hparams_of=lambda i: {"lr": 0.1}, common_params={})


class Job:
    """What run_unit reads of a TrialJob for a unit whose file exists."""

    phase = "tune"

    def __init__(self, folders: StudyFolders) -> None:
        self.folders = folders


def test_a_unit_logged_again_after_a_kill_keeps_one_point_per_metric(tmp_path, monkeypatch):
    monkeypatch.setattr(trainable, "_node_id", lambda: "node")  # no Ray here
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    experiment = client.create_experiment("relog", artifact_location=(tmp_path / "art").as_uri())
    study = tmp_path / "study"
    folders = StudyFolders(unit_dir=study / "units" / "tune-a", events=study / "events.jsonl", attempt="a")
    folders.unit_dir.mkdir(parents=True)
    trained = {"status": "finished", "acc": 0.5, "avg_acc": 0.6, "acc_t": [0.7, 0.5], "set_index": 0, "ordering": 1,
               "started_at": 1_700_000_000_000, "finished_at": 1_700_000_002_000, "train_seconds": 2.0}
    (folders.unit_dir / "set000-o1.json").write_text(json.dumps(trained))

    first = writer(study, uri, experiment)
    first.log_ordering(0, {**trained, "unit_file": "set000-o1"})  # as the trial reported it when it trained
    assert first.journal.flush(force=True) == 0
    shutil.rmtree(study / "tracking" / "files", ignore_errors=True)

    time.sleep(0.01)
    reused = run_unit(0, {"lr": 0.1}, 1, None, Job(folders))  # the resume: the unit file is there, not trained again
    assert reused["trained_at"] == trained["finished_at"] < reused["finished_at"]
    again = writer(study, uri, experiment)  # a fresh manifest: the first one's unit entry was never saved
    again.log_ordering(0, reused)
    assert again.journal.flush(force=True) == 0

    run = client.search_runs([experiment], "tags.`gtep.level` = 'ordering'")
    assert len(run) == 1, "the same run, found by its key"
    for metric in ("acc", "avg_acc", "acc_t"):
        points = client.get_metric_history(run[0].info.run_id, metric)
        assert len(points) == (2 if metric == "acc_t" else 1), (metric, points)
        assert {p.timestamp for p in points} == {trained["finished_at"]}
    assert again.manifest.data["units"]["tune/0/1"]["finished_at"] == reused["finished_at"], "arrival order kept"
