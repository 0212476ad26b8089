"""Every set evaluated (issue 49) on a copy of the session's tiny study: `gtep evaluate --resume STUDY --sets all`
trains the sets beside H* over the same orderings of D^E as runs of their own, leaves H*'s evaluation as it was,
and the report, `gtep replay --table` and protocol_regret.json give the same rank correlation, H* rank and regret,
computed here again from the study's results files."""
from __future__ import annotations

import io
import json
import shutil
import sqlite3
import time
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from mlflow.tracking import MlflowClient
from rich.console import Console
from typer.testing import CliRunner

import gtep
from gtep.cli import app
from gtep.protocol.metrics import kendall_tau_b
from gtep.protocol.regret import spearman_rho
from tests.studies import STUDY, R, S

PROTOCOLS = {"gtep (full)", "conventional", "asha", "optuna-median", "optuna-successive_halving", "optuna-hyperband",
             "first_task", "random"}


def copy_of(out: Path, copy: Path) -> Path:
    """The tiny study's output folder copied, its experiment's artifact folder pointed at the copy."""
    shutil.copytree(out, copy)
    with sqlite3.connect(copy / "mlflow.db") as db:
        db.execute("UPDATE experiments SET artifact_location = replace(artifact_location, ?, ?)",
                   (Path(out).resolve().as_uri(), copy.resolve().as_uri()))
    return copy


def manifest(folder: Path) -> dict[str, Any]:
    return json.loads((folder / "manifest.json").read_text())


def runs(out: Path, phase: str, level: str) -> list:
    client = MlflowClient(tracking_uri=f"sqlite:///{out / 'mlflow.db'}")
    experiment = client.get_experiment_by_name(f"gtep/{STUDY}")
    return client.search_runs([experiment.experiment_id], max_results=1000,
                              filter_string=f"tags.`gtep.phase` = '{phase}' and tags.`gtep.level` = '{level}'")


@pytest.fixture(scope="module")
def every(tiny_study: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = copy_of(tiny_study["out"], tmp_path_factory.mktemp("every-set") / "out")
    folder = out / STUDY
    before = manifest(folder)
    start = time.perf_counter()
    result = CliRunner().invoke(app, ["evaluate", "--resume", str(folder), "--sets", "all"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output + str(result.exception)
    return {"out": out, "folder": folder, "before": before, "after": manifest(folder), "output": result.output,
            "seconds": time.perf_counter() - start, "table": json.loads((folder / "protocol_regret.json").read_text())}


def test_every_other_set_is_evaluated_as_runs_of_its_own_and_h_stars_evaluation_is_unchanged(every):
    best = every["before"]["phases"]["tune"]["best_set_index"]
    others = sorted(set(range(R)) - {best})
    phase = every["after"]["phases"]["evaluate_sets"]
    assert phase["status"] == "finished" and phase["sets"] == others and phase["best_set_index"] == best
    units = {k for k in every["after"]["units"] if k.startswith("evaluate_sets/")}
    assert units == {f"evaluate_sets/{i}/{s}" for i in others for s in range(S)}
    # H*'s evaluation: the same phase record and units, no second evaluate phase run
    assert every["after"]["phases"]["evaluate"] == every["before"]["phases"]["evaluate"]
    assert {k: u for k, u in every["after"]["units"].items() if k.startswith("evaluate/")} == \
        {k: u for k, u in every["before"]["units"].items() if k.startswith("evaluate/")}
    assert len(runs(every["out"], "evaluate", "phase")) == 1
    (phase_run,) = runs(every["out"], "evaluate_sets", "phase")
    assert phase_run.info.status == "FINISHED" and phase_run.data.tags["gtep.best_set_index"] == str(best)
    trials = {int(r.data.tags["gtep.set_index"]): r for r in runs(every["out"], "evaluate_sets", "trial")}
    assert sorted(trials) == others
    assert all(trials[i].data.tags["mlflow.runName"] == f"evaluate_sets/set{i:03d}" for i in others)
    orderings = runs(every["out"], "evaluate_sets", "ordering")
    assert sorted((int(r.data.tags["gtep.set_index"]), int(r.data.tags["gtep.ordering"])) for r in orderings) == \
        [(i, s) for i in others for s in range(S)]
    assert all(r.data.tags["mlflow.parentRunId"] == trials[int(r.data.tags["gtep.set_index"])].info.run_id
               for r in orderings)
    assert "every set evaluated: Kendall's tau" in every["output"]


def expected_ranking(folder: Path) -> dict[str, Any]:
    """The rank correlation, H*'s rank and regret, from the study's results files (every set complete here)."""
    tuning = pd.read_csv(folder / "tune_results.csv").groupby("set_index")["set_score"].first()
    evaluated = pd.concat([pd.read_csv(folder / "evaluate_results.csv"),
                           pd.read_csv(folder / "evaluate_sets_results.csv")])
    evaluation = evaluated.groupby("set_index")["set_score"].first()
    sets = sorted(evaluation.index)
    best = int(manifest(folder)["phases"]["tune"]["best_set_index"])
    x, y = [tuning[i] for i in sets], [evaluation[i] for i in sets]
    return {"kendall_tau": kendall_tau_b(x, y), "spearman_rho": spearman_rho(x, y),
            "best_rank": 1 + sum(evaluation[i] > evaluation[best] for i in sets),
            "regret": max(y) - evaluation[best]}


def test_the_ranking_and_regret_match_the_results_files_in_the_file_the_report_and_replay(every, tiny_study):
    expected = expected_ranking(every["folder"])
    ranking = every["table"]["ranking"]
    assert ranking["sets"] == R and ranking["ranked"] == R and ranking["diverged"] == []
    for key in ("kendall_tau", "spearman_rho", "regret"):  # the file writes an undefined one as null (issue 60)
        value = float("nan") if ranking[key] is None else ranking[key]
        assert value == pytest.approx(expected[key], nan_ok=True), key
    assert ranking["best_rank"] == expected["best_rank"]

    report = gtep.report([STUDY], output=every["out"], formats=["csv"])
    (row,) = report.set_ranking.to_dict("records")
    assert row["study"] == STUDY and row["best_rank"] == expected["best_rank"]
    assert row["regret_points"] == pytest.approx(100 * expected["regret"])
    assert row["kendall_tau"] == pytest.approx(expected["kendall_tau"], nan_ok=True)
    assert set(report.protocol_regret["protocol"]) == PROTOCOLS
    full = report.protocol_regret[report.protocol_regret["protocol"] == "gtep (full)"].iloc[0]
    assert full["compute"] == 1.0 and full["regret_points"] == pytest.approx(100 * expected["regret"])
    # the headline is H*'s as before; a study without every set evaluated shows none of these tables
    plain = gtep.report([STUDY], output=tiny_study["out"], formats=["csv"])
    assert plain.set_ranking.empty and plain.protocol_regret.empty
    columns = ["phase", "acc", "avg_acc", "hmean"]
    pd.testing.assert_frame_equal(report.summary[columns], plain.summary[columns])

    printed = CliRunner().invoke(app, ["replay", str(every["folder"]), "--table", "--json", "-"])
    assert printed.exit_code == 0, printed.output
    assert json.loads(printed.output)["protocols"] == every["table"]["protocols"]


def test_a_resumed_every_set_evaluation_trains_nothing_again(every):
    console = Console(file=io.StringIO(), width=200)
    gtep.evaluate(resume=every["folder"], sets="all", console=console)
    assert len(runs(every["out"], "evaluate_sets", "phase")) == 1
    assert manifest(every["folder"])["phases"]["evaluate_sets"]["attempt"] == \
        every["after"]["phases"]["evaluate_sets"]["attempt"]
    assert "every set evaluated" in console.file.getvalue()


def test_the_regret_table_of_a_study_without_every_set_evaluated_says_what_to_run(tiny_study):
    result = CliRunner().invoke(app, ["replay", str(tiny_study["folder"]), "--table"])
    assert result.exit_code == 2, result.output
    assert "no evaluation of set" in result.output and "--sets all" in result.output
