"""A tiny `gtep run` through real Ray Tune and a real sqlite MLflow store (the session's shared study), then the
store read back."""
import json
from pathlib import Path

import pandas as pd
import pytest
import yaml
from typer.testing import CliRunner

from gtep.cli import app
from tests.studies import CONFIG, TASKS, R, S


@pytest.fixture(scope="module")
def study(tiny_study):  # shared with tests/api/test_api.py (tests/conftest.py: SHARED_SCOPES)
    return tiny_study


def runs_where(runs, **tags):
    return [r for r in runs if all(r.data.tags.get(f"gtep.{k}") == v for k, v in tags.items())]


def test_run_tree(study):
    runs = study["runs"]
    tune_phase, = runs_where(runs, level="phase", phase="tune")
    eval_phase, = runs_where(runs, level="phase", phase="evaluate")
    trials = runs_where(runs, level="trial", phase="tune")
    assert len(trials) == R
    assert all(t.data.tags["mlflow.parentRunId"] == tune_phase.info.run_id for t in trials)
    for trial in trials:
        children = [r for r in runs_where(runs, level="ordering")
                    if r.data.tags["mlflow.parentRunId"] == trial.info.run_id]
        assert sorted(int(c.data.tags["gtep.ordering"]) for c in children) == list(range(S))
        for child in children:
            assert {"acc", "avg_acc", "hmean"} <= set(child.data.metrics)
            history = study["client"].get_metric_history(child.info.run_id, "acc_t")
            assert sorted(m.step for m in history) == list(range(1, TASKS + 1))
            assert child.data.params["epochs"] == trial.data.params["epochs"]
    eval_trials = runs_where(runs, level="trial", phase="evaluate")
    assert len(eval_trials) == 1 and eval_trials[0].data.tags["mlflow.parentRunId"] == eval_phase.info.run_id
    assert len(runs_where(runs, level="ordering", phase="evaluate")) == S
    assert eval_phase.data.tags["gtep.tuning_run_id"] == tune_phase.info.run_id
    artifacts = {a.path for a in study["client"].list_artifacts(tune_phase.info.run_id)}
    assert {"classes.json", "manifest.json", "best.yaml", "tune_results.csv"} <= artifacts


def test_best_has_the_highest_harmonic_mean(study):
    trials = runs_where(study["runs"], level="trial", phase="tune")
    best = yaml.safe_load((study["out"] / "tiny" / "best.yaml").read_text())
    scores = {int(t.data.tags["gtep.set_index"]): t.data.metrics["hmean"] for t in trials}
    assert best["set_index"] == max(scores, key=lambda i: (scores[i], -i))
    assert 100 * best["score"] == pytest.approx(max(scores.values()), abs=1e-4)  # MLflow: percent, 4 decimals


def test_phase_runs_compare_in_the_ui(study):
    """Issue 18: the phase runs share metric names and units, carry H* as params and tell their data apart;
    runs are named by phase; ordering runs span the time their ordering trained."""
    client, runs = study["client"], study["runs"]
    folder = study["out"] / "tiny"
    best = yaml.safe_load((folder / "best.yaml").read_text())
    manifest = json.loads((folder / "manifest.json").read_text())
    tune_phase, = runs_where(runs, level="phase", phase="tune")
    eval_phase, = runs_where(runs, level="phase", phase="evaluate")
    assert (tune_phase.info.run_name, eval_phase.info.run_name) == ("tune", "evaluate")
    assert set(tune_phase.data.metrics) == set(eval_phase.data.metrics)
    assert {"acc", "acc_std", "avg_acc", "avg_acc_std", "hmean", "hmean_std"} <= set(tune_phase.data.metrics)
    assert tune_phase.data.metrics["acc"] == pytest.approx(100 * best["acc"], abs=1e-4)
    assert tune_phase.data.metrics["hmean"] == pytest.approx(100 * best["score"], abs=1e-3)
    for key, value in best["hparams"].items():
        assert tune_phase.data.params[key] == eval_phase.data.params[key] == str(value)
    assert (tune_phase.data.params["gtep.trials"], eval_phase.data.params["gtep.trials"]) == (str(R), "1")
    for tag in ("gtep.dataset", "gtep.classes_digest", "gtep.data_role"):
        assert tune_phase.data.tags[tag] != eval_phase.data.tags[tag]
    assert tune_phase.data.tags["gtep.similarity"] == "high"
    for run in (tune_phase, eval_phase):
        note = run.data.tags["mlflow.note.content"]
        assert "| Acc | AvgAcc | HM |" in note and f"{run.data.metrics['acc']:.2f}" in note
    assert all(r.data.tags["gtep.units"] == "percent" for r in runs)
    names = {r.info.run_name for r in runs}
    assert {f"tune/set{i:03d}" for i in range(R)} | {f"tune/set{i:03d}/o{s}" for i in range(R) for s in range(S)} \
        <= names
    assert {"evaluate/H*"} | {f"evaluate/o{s}" for s in range(S)} <= names
    for run in runs_where(runs, level="ordering"):
        phase, index, s = (run.data.tags[f"gtep.{k}"] for k in ("phase", "set_index", "ordering"))
        unit = manifest["units"][f"{phase}/{index}/{s}"]
        assert run.data.metrics["acc"] == round(100 * unit["acc"], 4)
        assert [m.value for m in client.get_metric_history(run.info.run_id, "acc_t")] == \
            [round(100 * v, 4) for v in unit["acc_t"]]
        assert (run.info.start_time, run.info.end_time) == (unit["started_at"], unit["finished_at"])
        assert run.info.end_time > run.info.start_time  # (train_seconds counts a reused first task's training too)
        parent = client.get_run(run.data.tags["mlflow.parentRunId"])
        # the trial run starts when Tune starts its trial (journal time on the driver), its first ordering when
        # the worker starts training: the same moment, give or take the driver's callback delay
        assert parent.info.start_time <= run.info.start_time + 2000
    experiment = client.get_experiment(tune_phase.info.experiment_id)
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"
    assert json.loads(experiment.tags["mlflow.sharedViewState.gtep-runs"])["selectedColumns"]


def test_evaluation_used_h_star_and_only_its_classes(study):
    client, runs = study["client"], study["runs"]
    best = yaml.safe_load((study["out"] / "tiny" / "best.yaml").read_text())
    tune_phase, = runs_where(runs, level="phase", phase="tune")
    eval_phase, = runs_where(runs, level="phase", phase="evaluate")
    tune_classes = json.loads(client.download_artifacts(tune_phase.info.run_id, "classes.json", str(study["root"])) and
                              Path(study["root"], "classes.json").read_text())["classes"]
    eval_classes = json.loads(Path(client.download_artifacts(eval_phase.info.run_id, "classes.json",
                                                             str(study["root"] / "ev"))).read_text())["classes"]
    assert len(eval_classes) == 6 and not set(tune_classes) & set(eval_classes)
    for run in runs_where(runs, level="ordering", phase="evaluate"):
        for key, value in best["hparams"].items():
            assert run.data.params[key] == str(value)
        scratch = str(study["root"] / run.info.run_id)
        acc = json.loads(Path(client.download_artifacts(run.info.run_id, "accuracy.json", scratch)).read_text())
        assert set(acc["class_order"]) == set(eval_classes)


def test_manifest_csv_and_table(study):
    folder = study["out"] / "tiny"
    manifest = json.loads((folder / "manifest.json").read_text())
    assert len(manifest["sets"]) == R
    assert len([k for k in manifest["units"] if k.startswith("tune/")]) == R * S
    frame = pd.read_csv(folder / "tune_results.csv")
    assert len(frame) == R * S and {"acc", "avg_acc", "h.lr"} <= set(frame.columns)
    assert "gap" in study["output"] and "gtep ui" in study["output"]


def test_a_study_is_its_owners_only(study):
    """`gtep run` under umask 022 (tests/studies.py's run_study) leaves nothing others may read or enter: the output
    folder, the study folder and everything in it (units, checkpoints, first tasks, Ray's storage, the results
    CSVs, events.jsonl, the manifest, logs, the MLflow store) are 0700 folders and 0600 files."""
    import os
    import stat

    folder = study["folder"]
    made = [study["out"], *(Path(d) / n for d, dirs, files in os.walk(study["out"]) for n in (*dirs, *files))]
    assert {"events.jsonl", "tune_results.csv", "evaluate_results.csv", "manifest.json", "units", "ray"} <= \
        {p.name for p in folder.iterdir()}
    open_to_others = sorted(f"{oct(stat.S_IMODE(p.lstat().st_mode))} {p.relative_to(study['out'])}"
                            for p in made if not p.is_symlink() and p.lstat().st_mode & 0o077)
    assert not open_to_others, f"group or others may read these: {open_to_others}"


def test_same_seed_same_sets_and_metrics(study, tmp_path):
    """Same config and seed: same drawn sets, same orderings, same metrics (CPU)."""
    config = tmp_path / "exp.yaml"
    config.write_text(yaml.safe_dump({**CONFIG, "search": {"trials": R, "orderings": S}}))
    result = CliRunner().invoke(app, ["tune", "--config", str(config), "--output", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    first = json.loads((study["out"] / "tiny" / "manifest.json").read_text())
    second = json.loads((tmp_path / "out" / "tiny" / "manifest.json").read_text())
    assert first["sets"] == second["sets"]
    for key, unit in first["units"].items():
        if key.startswith("tune/"):
            assert second["units"][key]["acc_t"] == unit["acc_t"]


def test_the_driver_marks_each_phase_in_the_events_around_its_units(study):
    """events.jsonl holds the driver's phase events beside the workers' unit events, in the order a phase passes
    them, so that where a study's time goes between its units can be told apart (paper_scale.py's breakdown)."""
    events = [json.loads(line) for line in (study["out"] / "tiny" / "events.jsonl").read_text().splitlines()]
    for phase in ("tune", "evaluate"):
        marks = {e["event"]: e["time"] for e in events if e["phase"] == phase and e["event"].startswith("phase_")}
        assert list(marks) == ["phase_started", "phase_trials_done", "phase_writes_done", "phase_finished"]
        units = [e["time"] for e in events if e["phase"] == phase and e["event"].startswith("unit_")]
        assert marks["phase_started"] < min(units) and max(units) <= marks["phase_trials_done"]
        assert marks["phase_trials_done"] <= marks["phase_writes_done"] <= marks["phase_finished"]
        # each trial says when it began and when its worker process did (a phase's start, taken apart)
        trials = [e for e in events if e["phase"] == phase and e["event"] == "trial_started"]
        assert trials and all(e["process_started"] <= e["time"] for e in trials)
        assert marks["phase_started"] <= min(e["time"] for e in trials) <= min(units)
    tune_end = next(e["time"] for e in events if e["phase"] == "tune" and e["event"] == "phase_finished")
    assert tune_end <= next(e["time"] for e in events if e["phase"] == "evaluate" and e["event"] == "phase_started")
