"""`gtep matrix` end to end on real Ray and a sqlite MLflow store: every cell a study with the matrix tags, the
original and conventional phases beside tune and evaluate, the state file, a rerun that only runs the cell marked
pending, and a failed cell that does not stop the matrix.

Ray is started once for the module; the command joins it instead of starting its own.
"""
import json
from pathlib import Path

import pytest
import yaml
from mlflow.tracking import MlflowClient
from typer.testing import CliRunner

from gtep.cli import app
from gtep.spaces import load_space

runner = CliRunner()
PHASES = ("tune", "evaluate", "conventional", "original")  # the study plan's order, as `gtep run` runs them
MATRIX_TAGS = ("matrix", "cell", "scenario", "pairing", "similarity")
FIRST_TASK = {"epochs": 2, "milestones": [1], "batch_size": 16}
TINY = {"backbone": "resnet8", "search": {"trials": 2, "orderings": 2}, "first_task": FIRST_TASK,
        "training": {"memory_size": 12, "epoch_scale": 0.005}, "compute": {"max_concurrent": 2}}
MATRIX = {
    "matrix": "mx",
    "algorithms": ["replay", "icarl"],
    "scenarios": {"2tasks": "3x2"},
    "pairings": {
        "split": {"similarity": "high",
                  "datasets": {"split": {"dataset": "synthetic:classes=14,train=12,test=4", "classes_per_phase": 6}}},
        "low": {"similarity": "low",
                "datasets": {"tuning": {"dataset": "synthetic:classes=6,train=12,test=4,seed=1"},
                             "evaluation": {"dataset": "synthetic:classes=6,train=12,test=4,seed=2"}}},
    },
    "base": TINY,
    "original": True,
    "protocol": "conventional",
}
CELLS = ["mx-replay-2tasks-split", "mx-icarl-2tasks-split", "mx-replay-2tasks-low", "mx-icarl-2tasks-low"]
# The matrix trained on Ray: one algorithm over both pairings (a cell of the same data with each similarity) keeps
# every phase and tag of the 2 x 2 matrix in half the time; the state-machine tests below use all four cells.
# Matrices of many algorithms through Ray: tests/cluster/test_paper_scale.py.
TRAINED = {**MATRIX, "algorithms": ["replay"]}
TRAINED_CELLS = ["mx-replay-2tasks-split", "mx-replay-2tasks-low"]


pytestmark = pytest.mark.usefixtures("local_ray")  # this worker's Ray (tests/conftest.py)


def gtep_matrix(folder: Path, doc: dict, *extra: str):
    path = folder / f"{doc['matrix']}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))  # the file's order is the cells' order
    return runner.invoke(app, ["matrix", "--config", str(path), "--output", str(folder / "out"), *extra],
                         env={"COLUMNS": "200"})


def runs(client: MlflowClient, cell: str, **tags):
    experiment = client.get_experiment_by_name(f"gtep/{cell}")
    found = client.search_runs([experiment.experiment_id], max_results=1000)
    return [r for r in found if all(r.data.tags.get(f"gtep.{k}") == v for k, v in tags.items())]


@pytest.fixture(scope="module")
def matrix(tmp_path_factory):
    folder = tmp_path_factory.mktemp("matrix")
    result = gtep_matrix(folder, TRAINED)
    assert result.exit_code == 0, result.output + repr(result.exception)
    root = folder / "out" / "mx"
    return {"folder": folder, "root": root, "output": result.output,
            "client": MlflowClient(tracking_uri=f"sqlite:///{root.resolve()}/mlflow.db")}


def manifest(root: Path, cell: str) -> dict:
    return json.loads((root / cell / "manifest.json").read_text())


def test_every_cell_ran_every_phase_as_a_tagged_study(matrix):
    state = json.loads((matrix["root"] / "matrix.json").read_text())
    assert set(state["cells"]) == set(TRAINED_CELLS)
    for cell in TRAINED_CELLS:
        record = state["cells"][cell]
        assert record["status"] == "finished" and record["phases"] == list(PHASES)
        assert set(record["hmean"]) == set(PHASES) and record["wall_seconds"] > 0
        pairing = cell.rsplit("-", 1)[1]
        for phase in PHASES:
            run, = runs(matrix["client"], cell, level="phase", phase=phase)
            assert run.info.status == "FINISHED"
            assert {t: run.data.tags[f"gtep.{t}"] for t in MATRIX_TAGS} == {
                "matrix": "mx", "cell": cell, "scenario": "2tasks", "pairing": pairing,
                "similarity": "high" if pairing == "split" else "low"}
            orderings = runs(matrix["client"], cell, level="ordering", phase=phase)
            assert len(orderings) == (4 if phase == "tune" else 2)
            assert all(len(matrix["client"].get_metric_history(r.info.run_id, "acc_t")) == 2 for r in orderings)
    for cell in TRAINED_CELLS:  # a phase label's units live in its own folder
        units = {p.name.split("-")[0] for p in (matrix["root"] / cell / "units").iterdir()}
        assert units == set(PHASES)


def test_conventional_reran_h_star_on_the_tuning_classes_over_fresh_orderings(matrix):
    for cell in TRAINED_CELLS:
        m = manifest(matrix["root"], cell)
        best = yaml.safe_load((matrix["root"] / cell / "best.yaml").read_text())
        conventional, tuned, evaluated = (m["phases"][p] for p in ("conventional", "tune", "evaluate"))
        assert conventional["classes"] == tuned["classes"] and conventional["dataset"] == tuned["dataset"]
        assert conventional["hparams"] == best["hparams"] == evaluated["hparams"]
        assert evaluated["classes"] != tuned["classes"] or evaluated["dataset"] != tuned["dataset"]
        assert conventional["orderings"] == [2, 3]
        assert {u["ordering"] for k, u in m["units"].items() if k.startswith("conventional/")} == {2, 3}
        run, = runs(matrix["client"], cell, level="phase", phase="conventional")
        assert run.data.tags["gtep.tuning_run_id"] == best["tuning_run_id"]
        for ordering in runs(matrix["client"], cell, level="ordering", phase="conventional"):
            assert ordering.data.tags["gtep.ordering"] in {"2", "3"}
            assert ordering.data.params["gtep.dataset"] == tuned["dataset"]


def test_original_trained_the_presets_values_beside_h_star(matrix):
    for cell in TRAINED_CELLS:
        algorithm = cell.split("-")[1]
        preset = load_space(algorithm).presets["original"]
        m = manifest(matrix["root"], cell)
        assert m["phases"]["original"]["hparams"] == preset
        assert m["phases"]["original"]["classes"] == m["phases"]["evaluate"]["classes"]
        run, = runs(matrix["client"], cell, level="phase", phase="original")
        assert run.data.tags["gtep.hparams_source"] == "preset:original"
        for ordering in runs(matrix["client"], cell, level="ordering", phase="original"):
            assert ordering.data.params["lr"] == str(preset["lr"])
            assert ordering.data.params["epochs"] == str(preset["epochs"])


def test_the_cells_table_and_the_report_over_the_matrix(matrix):
    output = matrix["output"]
    assert "matrix mx" in output and "conventional HM" in output and "original HM" in output
    assert all(cell in output for cell in TRAINED_CELLS)
    report = matrix["root"] / "report"
    assert report.is_dir() and any(report.rglob("*.md")) and any(report.rglob("*.csv")), output
    client = matrix["client"]  # one row per phase run: the cells wrote theirs, the report found none missing
    assert sorted(phase_row_ids(client)) == sorted(r.info.run_id for cell in TRAINED_CELLS
                                                   for r in runs(client, cell, level="phase"))


def phase_row_ids(client: MlflowClient, matrix: str = "mx") -> list[str]:
    """The phase runs the matrix's phase rows in gtep/reports copy, one entry per row."""
    reports = client.get_experiment_by_name("gtep/reports")
    rows = client.search_runs([reports.experiment_id],
                              f"tags.`gtep.level` = 'phase_row' and tags.`gtep.matrix` = '{matrix}'")
    return [r.data.tags["gtep.phase_run"] for r in rows]


def test_a_rerun_resumes_only_the_unfinished_cell(matrix):
    """A cell left `running` with one phase missing (its conventional phase's records lost) resumes:
    its finished phases are kept (no new run), the missing one runs; the finished cells are not touched."""
    root, client, again = matrix["root"], matrix["client"], "mx-replay-2tasks-low"
    state = json.loads((root / "matrix.json").read_text())
    state["cells"][again]["status"] = "running"
    (root / "matrix.json").write_text(json.dumps(state))
    m = manifest(root, again)
    m["phases"].pop("conventional")
    m["units"] = {k: u for k, u in m["units"].items() if not k.startswith("conventional/")}
    (root / again / "manifest.json").write_text(json.dumps(m))
    before = {cell: sorted(r.info.run_id for r in runs(client, cell)) for cell in TRAINED_CELLS}
    events = {cell: (root / cell / "events.jsonl").read_text() for cell in TRAINED_CELLS}
    kept = {p: runs(client, again, level="phase", phase=p)[0].info.run_id for p in PHASES if p != "conventional"}

    result = gtep_matrix(matrix["folder"], TRAINED, "--no-report")
    assert result.exit_code == 0, result.output + repr(result.exception)
    assert "(1 to run, 1 finished" in result.output and "resuming" in result.output
    after = {cell: sorted(r.info.run_id for r in runs(client, cell)) for cell in TRAINED_CELLS}
    for cell in set(TRAINED_CELLS) - {again}:
        assert after[cell] == before[cell], f"{cell} was run again"
        assert (root / cell / "events.jsonl").read_text() == events[cell]
    assert {p: [r.info.run_id for r in runs(client, again, level="phase", phase=p)] for p in kept} == \
        {p: [run_id] for p, run_id in kept.items()}, "finished phases are reused, not re-run"
    rerun = [r for r in runs(client, again, level="phase", phase="conventional") if r.info.run_id not in before[again]]
    assert len(rerun) == 1 and rerun[0].info.status == "FINISHED"
    trained = [json.loads(line) for line in (root / again / "events.jsonl").read_text().splitlines()
               [len(events[again].splitlines()):]]
    assert {e["phase"] for e in trained} == {"conventional"}
    assert json.loads((root / "matrix.json").read_text())["cells"][again]["status"] == "finished"


@pytest.mark.slow  # two cells through Ray twice, in parallel and one after the other: the slow group's
def test_parallel_cells_share_the_cluster_and_give_the_sequential_results(tmp_path):
    """--parallel-cells 2: two cells run at once, each a driver process of its own on the test worker's Ray (one
    trial each at a time, their trials sharing its CPU), and they select and score exactly what the sequential run
    of the same cells does (tune and evaluate only: the matrix fixture's other phases are not what is compared)."""
    split = TRAINED_CELLS
    doc = {**TRAINED, "original": False, "protocol": "gtep", "base": {**TINY, "compute": {"max_concurrent": 1}}}
    (tmp_path / "parallel").mkdir()
    (tmp_path / "sequential").mkdir()
    result = gtep_matrix(tmp_path / "parallel", doc, "--parallel-cells", "2", "--no-report")
    assert result.exit_code == 0, result.output + repr(result.exception)
    assert "2 cells at a time" in result.output
    reference = gtep_matrix(tmp_path / "sequential", doc, "--no-report")
    assert reference.exit_code == 0, reference.output + repr(reference.exception)
    assert "cells at a time" not in reference.output
    root, sequential_root = tmp_path / "parallel" / "out" / "mx", tmp_path / "sequential" / "out" / "mx"
    cells = json.loads((root / "matrix.json").read_text())["cells"]
    first, second = (cells[name] for name in split)
    assert first["status"] == second["status"] == "finished"
    assert first["started_at"] < second["finished_at"] and second["started_at"] < first["finished_at"], \
        "the cells ran one after the other"
    sequential = json.loads((sequential_root / "matrix.json").read_text())["cells"]
    assert sequential[split[0]]["finished_at"] <= sequential[split[1]]["started_at"], "the reference ran in parallel"
    client = MlflowClient(tracking_uri=f"sqlite:///{root.resolve()}/mlflow.db")
    for name in split:
        assert {p: cells[name]["hmean"][p] for p in ("tune", "evaluate")} == \
            {p: sequential[name]["hmean"][p] for p in ("tune", "evaluate")}
        assert manifest(root, name)["phases"]["tune"]["best_set_index"] == \
            manifest(sequential_root, name)["phases"]["tune"]["best_set_index"]
        log = (root / name / "matrix-cell.log").read_text()
        assert "tune " in log and "evaluate " in log, log
        phases = {r.data.tags["gtep.phase"]: r.info.status for r in runs(client, name, level="phase")}
        assert phases == {"tune": "FINISHED", "evaluate": "FINISHED"}
    # no report ran: each cell's driver wrote its phases' rows in gtep/reports as it ended, and its phases'
    # snapshots of the runs a report reads
    phase_runs = [r for name in split for r in runs(client, name, level="phase")]
    assert sorted(phase_row_ids(client)) == sorted(r.info.run_id for r in phase_runs)
    assert len(phase_runs) == 4 and all(r.data.tags.get("gtep.snapshot") == "runs.json" for r in phase_runs)


CELL_DRIVER = """
import os, sys, time
from gtep.orchestration.matrix_cell import die_with_parent
die_with_parent(int(sys.argv[1]))
open(sys.argv[2], "w").write(str(os.getpid()))
time.sleep(120)
"""
MATRIX_DRIVER = """
import os, subprocess, sys, time
subprocess.Popen([sys.executable, sys.argv[1], str(os.getpid()), sys.argv[2]])
time.sleep(120)
"""


def test_a_cell_driver_dies_with_the_matrix_driver(tmp_path):
    """A SIGKILLed matrix driver must not leave cells running that its rerun would resume a second time."""
    import os
    import signal
    import subprocess
    import sys
    import time

    (tmp_path / "cell.py").write_text(CELL_DRIVER)
    (tmp_path / "matrix.py").write_text(MATRIX_DRIVER)
    pid_file = tmp_path / "cell.pid"
    parent = subprocess.Popen([sys.executable, str(tmp_path / "matrix.py"), str(tmp_path / "cell.py"), str(pid_file)])
    deadline = time.monotonic() + 60
    while not (pid_file.exists() and pid_file.read_text()):
        assert time.monotonic() < deadline and parent.poll() is None, "the cell process did not start"
        time.sleep(0.1)
    cell_pid = int(pid_file.read_text())
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(cell_pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    os.kill(cell_pid, signal.SIGKILL)
    raise AssertionError("the cell process outlived its killed parent")


def test_failed_cells_are_kept_pending_ones_run_and_the_matrix_goes_on(tmp_path, monkeypatch):
    """The state machine without training: a cell whose phases raise is recorded failed and the next one runs;
    a rerun skips finished and failed cells, --retry-failed runs the failed one, a cell marked pending runs."""
    from gtep.orchestration import matrix as orchestration
    from gtep.protocol.selection import AllSetsDivergedError

    doc = {**MATRIX, "matrix": "fx", "original": False, "protocol": "gtep"}
    names = [cell.replace("mx-", "fx-") for cell in CELLS]
    calls, failing = [], {names[0]}

    def run_cell(rc, phases, console, resume):
        calls.append(rc.cell.name)
        if rc.cell.name in failing:
            raise AllSetsDivergedError("all 2 hyperparameter sets diverged")
        return {phase: 0.5 for phase in phases}

    monkeypatch.setattr(orchestration, "run_cell", run_cell)
    monkeypatch.setattr(orchestration, "check_resources", lambda resolved: None)
    result = gtep_matrix(tmp_path, doc, "--no-report")
    assert result.exit_code == 1 and calls == names, result.output
    state_path = tmp_path / "out" / "fx" / "matrix.json"
    cells = json.loads(state_path.read_text())["cells"]
    assert cells[names[0]]["status"] == "failed" and "all 2 hyperparameter sets diverged" in cells[names[0]]["error"]
    assert all(cells[n]["status"] == "finished" and cells[n]["phases"] == ["tune", "evaluate"] for n in names[1:])

    calls.clear()
    again = gtep_matrix(tmp_path, doc, "--no-report")
    assert again.exit_code == 1 and calls == [] and "(0 to run, 3 finished, 1 failed and kept)" in again.output
    assert "--retry-failed" in again.output
    failing.clear()
    assert gtep_matrix(tmp_path, doc, "--no-report", "--retry-failed").exit_code == 0 and calls == [names[0]]

    calls.clear()
    state = json.loads(state_path.read_text())
    state["cells"][names[2]]["status"] = "pending"
    state_path.write_text(json.dumps(state))
    assert gtep_matrix(tmp_path, doc, "--no-report").exit_code == 0 and calls == [names[2]]

    calls.clear()  # a finished cell whose config changed is refused before anything runs
    changed = {**doc, "base": {**TINY, "seed": 7}}
    refused = gtep_matrix(tmp_path, changed, "--no-report")
    assert refused.exit_code == 2 and calls == [] and "ran with another 'seed'" in refused.stderr


@pytest.mark.slow  # the labelled phases' runs are the matrix fixture's (run_cell); this is their CLI and table
def test_run_with_original_and_the_conventional_protocol_prints_their_rows(tmp_path):
    """The labelled phases on a single study through `gtep run` and `gtep evaluate --protocol conventional`."""
    doc = {"study": "labelled", "algorithm": "replay", "scenario": {"increments": "3x2"},
           "datasets": MATRIX["pairings"]["split"]["datasets"], **TINY, "search": {"trials": 1, "orderings": 1}}
    path = tmp_path / "labelled.yaml"
    path.write_text(yaml.safe_dump(doc))
    common = ["--config", str(path), "--output", str(tmp_path / "out")]
    result = runner.invoke(app, ["run", *common, "--protocol", "conventional", "--with-original"],
                           env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output + repr(result.exception)
    rows = [line.split("│")[1].strip() for line in result.output.splitlines() if line.startswith("│")]
    assert {"tuning", "evaluation", "conventional", "original", "gap"} <= set(rows)
    m = json.loads((tmp_path / "out" / "labelled" / "manifest.json").read_text())
    assert set(m["phases"]) == set(PHASES) and m["phases"]["conventional"]["orderings"] == [1]
    evaluated = m["phases"]["evaluate"]

    result = runner.invoke(app, ["evaluate", *common, "--protocol", "conventional"])
    assert result.exit_code == 0 and "Conventional protocol" in result.output, result.output
    after = json.loads((tmp_path / "out" / "labelled" / "manifest.json").read_text())["phases"]
    assert after["evaluate"] == evaluated and after["conventional"]["attempt"] != m["phases"]["conventional"]["attempt"]
    bad = runner.invoke(app, ["run", *common, "--protocol", "tuned"])
    assert bad.exit_code == 2 and "--protocol" in bad.stderr


def test_one_stop_signal_stops_the_whole_matrix_and_the_same_command_resumes_it(tmp_path, monkeypatch):
    """Ctrl-C during a cell (its phase raises StudyInterrupted) stops the matrix: the cell stays `running`, no
    later cell starts, the exit status is 130; the same command then resumes that cell and runs the rest."""
    import signal

    from gtep.orchestration import matrix as orchestration
    from gtep.orchestration.interrupt import StudyInterrupted

    doc = {**MATRIX, "matrix": "ix", "original": False, "protocol": "gtep"}
    names = [cell.replace("mx-", "ix-") for cell in CELLS]
    calls, interrupt = [], {names[1]}

    def run_cell(rc, phases, console, resume):
        calls.append((rc.cell.name, resume))
        if rc.cell.name in interrupt:
            raise StudyInterrupted(rc.cell.config.study_dir, "tune", signal.SIGINT, 1, 4)
        return {phase: 0.5 for phase in phases}

    monkeypatch.setattr(orchestration, "run_cell", run_cell)
    monkeypatch.setattr(orchestration, "check_resources", lambda resolved: None)
    monkeypatch.setattr(orchestration, "tuning_started", lambda study_dir: True)
    result = gtep_matrix(tmp_path, doc, "--no-report")
    assert result.exit_code == 130 and calls == [(names[0], False), (names[1], False)], result.output
    assert "Resume with the same gtep matrix command" in result.output + result.stderr
    cells = json.loads((tmp_path / "out" / "ix" / "matrix.json").read_text())["cells"]
    assert cells[names[0]]["status"] == "finished" and cells[names[1]]["status"] == "running"
    assert names[2] not in cells or cells[names[2]]["status"] == "pending"

    calls.clear()
    interrupt.clear()
    again = gtep_matrix(tmp_path, doc, "--no-report")
    assert again.exit_code == 0 and calls == [(names[1], True), (names[2], False), (names[3], False)], again.output
