"""Cheaper tuning on real (tiny) studies on Ray: ASHA stops sets during the tuning phase, a stopped set is shown
as such and never H*, gtep replay reproduces the study's H* without a scheduler, and the first-task protocol
trains each set on the first k tasks only."""
from __future__ import annotations

import json

import pandas as pd
import pytest
import yaml

from gtep.cli import app
from tests.orchestration.test_phases import config, gtep, runner, runs_of, store

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("local_ray")]  # this worker's Ray (tests/conftest.py)

# learning rates far apart, so the sets' running scores differ and ASHA has something to stop
SPACE = {"algorithm": "replay", "space": {"lr": [0.0001, 0.001, 0.05, 0.2], "epochs": [40], "batch_size": [16],
                                          "scheduler": ["constant"]}}




def cheap_config(tmp_path, study: str, **search):
    (tmp_path / "space.yaml").write_text(yaml.safe_dump(SPACE))
    return config(study=study, search={"trials": 6, "orderings": 3, "space": str(tmp_path / "space.yaml"), **search},
                  compute={"max_concurrent": 1}, training={"memory_size": 12, "epoch_scale": 0.05})


def tuned(tmp_path, doc):
    """`gtep tune` of `doc`, which must succeed: its result, its study folder, the sets it stopped and H*'s index."""
    result = gtep(tmp_path, "tune", doc)
    assert result.exit_code == 0, result.output + repr(result.exception)
    root = tmp_path / "out" / doc["study"]
    tune_phase = json.loads((root / "manifest.json").read_text())["phases"]["tune"]
    return result, root, tune_phase["stopped_sets"], tune_phase["best_set_index"]


def test_asha_stops_sets_that_are_never_h_star_and_replay_reproduces_h_star(tmp_path):
    result, root, stopped, best = tuned(tmp_path, cheap_config(
        tmp_path, "asha", scheduler="asha", scheduler_options={"grace_period": 1, "reduction_factor": 2}))
    assert stopped, "sets with lr 1e-4 and 0.2 against 0.05 should fall below the first rung's cutoff"
    assert best not in stopped
    rows = pd.read_csv(root / "tune_results.csv")
    for i in stopped:
        mine = rows[rows["set_index"] == i]
        assert set(mine.set_status) == {"stopped"} and len(mine) < 3
        assert mine.train_seconds.notna().all()  # what it cost stays visible
    assert set(rows[rows["set_index"] == best].set_status) == {"complete"}
    assert "stopped early by asha" in result.output
    statuses = [r.data.tags.get("gtep.status") for r in runs_of(store(tmp_path), "asha", level="trial")]
    assert statuses.count("stopped") == len(stopped), statuses

    replayed = runner.invoke(app, ["replay", str(root), "--scheduler", "none"])
    assert replayed.exit_code == 0, replayed.output
    assert f"H* = set{best:03d} (the full study's: set{best:03d})" in replayed.output
    assert "100.0% of the full study" in replayed.output


def test_first_task_protocol_trains_each_set_on_the_first_task_only(tmp_path):
    doc = cheap_config(tmp_path, "first", protocol="first_task", protocol_tasks=1)
    # task 1 must depend on something sampled (else every set ties and the config is refused): the scheduler,
    # which the `sampled` first-task recipe lets reach it
    (tmp_path / "space.yaml").write_text(yaml.safe_dump({**SPACE, "space": {**SPACE["space"],
                                                                           "scheduler": ["constant", "cosine"]}}))
    result = gtep(tmp_path, "tune", doc)
    assert result.exit_code == 0, result.output + repr(result.exception)
    units = list((tmp_path / "out" / "first" / "units").glob("tune-*/set*-o*.json"))
    assert len(units) == 6 * 3
    for path in units:
        record = json.loads(path.read_text())
        assert len(record["acc_matrix"]) == 1 and len(record["task_seconds"]) == 1


def test_hyperband_runs_the_tuning_phase_and_h_star_is_a_complete_set(tmp_path):
    _, root, stopped, best = tuned(tmp_path, cheap_config(tmp_path, "hyperband", trials=4, scheduler="hyperband",
                                                          scheduler_options={"reduction_factor": 3}))
    assert best not in stopped
    rows = pd.read_csv(root / "tune_results.csv")
    assert set(rows[rows["set_index"] == best].set_status) == {"complete"}


def test_report_puts_each_protocols_h_star_evaluation_score_and_compute_side_by_side(tmp_path):
    """Three studies of one algorithm and scenario: the full gtep search, the first-task protocol and gtep with
    ASHA, each through both phases (`gtep run`), then `gtep report` over the three."""
    protocols = {"full": [], "first": ["--protocol", "first_task", "--protocol-tasks", "2"],
                 "asha": ["--scheduler", "asha"]}
    for study, options in protocols.items():
        # three tasks; the first task's fixed recipe is trained once per ordering and reused by every set, so
        # k = 2 (sets differ from the second task on) and the later tasks carry most of the compute
        doc = {**cheap_config(tmp_path, study, trials=4, orderings=2), "scenario": {"increments": "2x3"}}
        doc["training"] = {**doc["training"], "epoch_scale": 0.5}
        result = gtep(tmp_path, "run", doc, *options)
        assert result.exit_code == 0, result.output + repr(result.exception)
    out = tmp_path / "report"
    shown = runner.invoke(app, ["report", *protocols, "--output", str(tmp_path / "out"), "--out", str(out),
                                "--format", "table,csv", "--no-log"])
    assert shown.exit_code == 0, shown.output + repr(shown.exception)
    assert "Tuning protocols" in shown.output and "first_task (k=2)" in shown.output

    rows = pd.read_csv(out / "protocols.csv").set_index("study")
    assert dict(rows["protocol"]) == {"full": "gtep", "first": "first_task (k=2)", "asha": "gtep + asha"}
    assert rows.at["full", "compute_ratio"] == 1.0
    # every set trains the second task of three only (the first is shared): about 0.55 of the full study's
    assert rows.at["first", "compute_ratio"] < 0.8, rows.to_dict()
    client = store(tmp_path)
    for study in protocols:
        manifest = json.loads((tmp_path / "out" / study / "manifest.json").read_text())
        assert rows.at[study, "best_set_index"] == manifest["phases"]["tune"]["best_set_index"]
        units = [json.loads(p.read_text()) for p in (tmp_path / "out" / study / "units").glob("tune-*/*.json")]
        spent = sum(sum(u["task_seconds"][u["first_task"] == "reused":]) for u in units)  # a reused task: once
        assert rows.at[study, "compute_seconds"] == pytest.approx(spent)
        evaluated = runs_of(client, study, level="phase", phase="evaluate")[0]
        assert 100 * rows.at[study, "evaluation_score"] == pytest.approx(evaluated.data.metrics["hmean"], abs=1e-3)
        assert 100 * rows.at[study, "reported_score"] == pytest.approx(evaluated.data.metrics["hmean"], abs=1e-3)
        assert evaluated.data.params["gtep.protocol"] == ("first_task" if study == "first" else "gtep")


def test_an_optuna_pruner_stops_sets_live_and_a_replay_with_it_makes_the_same_decisions(tmp_path):
    """search.pruner median under the Optuna TPE searcher: pruned sets are stopped, shown as stopped and never
    H*; one trial at a time, so `gtep replay --pruner median` sees the live arrival order and agrees."""
    doc = cheap_config(tmp_path, "median", searcher="optuna-tpe", pruner="median",
                       pruner_options={"n_startup_trials": 1})
    result, root, stopped, best = tuned(tmp_path, doc)
    assert stopped, "lr 1e-4 or 0.2 against 0.05 should fall below the median after one ordering"
    assert best not in stopped and "stopped early by the median pruner" in result.output
    rows = pd.read_csv(root / "tune_results.csv")
    assert set(rows[rows["set_index"].isin(stopped)].set_status) == {"stopped"}
    phase = runs_of(store(tmp_path), "median", level="phase", phase="tune")[0]
    assert phase.data.params["gtep.scheduler"] == "optuna-median"
    # the sets as Optuna suggested them, recorded (was test_phases.py's test_optuna_searcher_records_sets_as_suggested)
    manifest = json.loads((root / "manifest.json").read_text())
    assert len(manifest["sets"]) == 6 and len(runs_of(store(tmp_path), "median", level="trial")) == 6
    assert {u["set_index"] for u in manifest["units"].values()} == {s["index"] for s in manifest["sets"]}

    replayed = runner.invoke(app, ["replay", str(root), "--pruner", "median", "--pruner-option",
                                   "n_startup_trials=1"])
    assert replayed.exit_code == 0, replayed.output
    assert f"H* = set{best:03d} (the full study's: set{best:03d})" in replayed.output
    assert "stopped early: " + f"{len(stopped)} of 6 sets (" + ", ".join(f"set{i:03d}" for i in sorted(stopped)) \
        in replayed.output


def test_with_task_fidelity_asha_stops_sets_inside_their_first_ordering(tmp_path):
    """search.fidelity tasks, ASHA's first rung after two tasks of three (task 1 follows the fixed first-task
    recipe, the same for every set): hopeless sets stop inside their first ordering, are shown as stopped (0 of 2
    orderings) and never H*, and what they trained counts in the phase's compute."""
    doc = {**cheap_config(tmp_path, "pertask", trials=6, orderings=2, scheduler="asha", fidelity="tasks",
                          scheduler_options={"grace_period": 0.6, "reduction_factor": 2}),
           "scenario": {"increments": "2x3"}}
    doc["training"] = {**doc["training"], "reuse_first_task": False, "epoch_scale": 0.5}
    # a set that cannot learn (lr 1e-5) against one that does (0.05), long enough for the difference to show
    (tmp_path / "space.yaml").write_text(yaml.safe_dump({**SPACE, "space": {**SPACE["space"], "lr": [0.00001, 0.05]}}))
    result = gtep(tmp_path, "tune", doc)
    assert result.exit_code == 0, result.output + repr(result.exception)
    root = tmp_path / "out" / "pertask"
    tune_phase = json.loads((root / "manifest.json").read_text())["phases"]["tune"]
    stopped, best = tune_phase["stopped_sets"], tune_phase["best_set_index"]
    units = json.loads((root / "manifest.json").read_text())["units"]
    inside_first = [i for i in stopped if not any(k.startswith(f"tune/{i}/") for k in units)]
    assert inside_first, (stopped, sorted(units))  # stopped before any ordering finished
    assert best not in stopped and f"set{inside_first[0]:03d} 0/2" in result.output
    statuses = {int(r.data.tags["gtep.set_index"]): r.data.tags.get("gtep.status")
                for r in runs_of(store(tmp_path), "pertask", level="trial")}
    assert all(statuses[i] == "stopped" for i in stopped), statuses
    phase = runs_of(store(tmp_path), "pertask", level="phase", phase="tune")[0]
    trained = sum(sum(json.loads(p.read_text())["task_seconds"]) for p in (root / "units").glob("tune-*/*.json"))
    assert phase.data.metrics["compute_seconds"] > trained  # plus the stopped sets' unfinished orderings
