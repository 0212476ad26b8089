"""Running a matrix of GTEP studies (gtep matrix; the cells come resolved from gtep/matrix.py).

One Ray cluster for the whole matrix (started here, or joined with --address). By default the cells run one
after another in this process, each Tuner asking for the whole cluster (compute.max_concurrent of the cell).
With --parallel-cells N, up to N cells run at once, each in a driver process of its own joined to the same
cluster (gtep/orchestration/matrix_cell.py), so one cell's trials fill the slots another cell's tail leaves
idle; their terminal output goes to <cell>/matrix-cell.log. Every phase run of a cell carries the matrix tags,
so `gtep report --matrix NAME` reads the paper's tables from the one store.

<output>/<matrix>/matrix.json   each cell's status (pending, running, finished, failed), its config, phases,
                                harmonic means and wall time: a rerun skips finished cells, resumes running
                                ones (units reused, MLflow runs found again) and retries failed ones on request
<output>/<matrix>/<cell>/       the cell's study folder (manifest, best.yaml, units, tracking journal)
<output>/<matrix>/mlflow.db     the default store of every cell
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from gtep.config import ConfigError
from gtep.errors import StudyStopped
from gtep.matrix import MatrixConfig, ResolvedCell, changed_field
from gtep.orchestration.interrupt import StudyInterrupted
from gtep.orchestration.ray_search import check_resources, ray_session, redraws
from gtep.orchestration.study import json_by_entry, write_atomic
from gtep.orchestration.study_plan import run_plan
from gtep.protocol.phases import PHASES, PhaseSequence, study_phases

STATE_FILE = "matrix.json"


@dataclass
class MatrixState:
    """The matrix's state file; written by the driver only, atomically, after every change of a cell."""

    path: Path
    data: dict[str, Any]

    @classmethod
    def open(cls, root: Path, matrix: str) -> "MatrixState":
        path = root / STATE_FILE
        if path.exists():
            return cls(path, json.loads(path.read_text()))
        return cls(path, {"matrix": matrix, "cells": {}})

    def cell(self, name: str) -> dict[str, Any]:
        return self.data["cells"].get(name, {})

    def update(self, name: str, **info: Any) -> None:
        self.data["cells"].setdefault(name, {"status": "pending"}).update(info, updated_at=int(time.time()))
        write_atomic(self.path, json_by_entry(self.data))


@dataclass
class CellPlan:
    rc: ResolvedCell
    action: str  # run | resume | skip (finished) | skip-failed
    record: dict[str, Any] = field(default_factory=dict)


def check_state(state: MatrixState, cells: list[ResolvedCell]) -> None:
    """A cell that ran must still be the cell the file describes, or its results would be reported under a
    config they did not come from: an error before any compute, naming the cell and the field."""
    for rc in cells:
        stored = state.cell(rc.cell.name)
        if stored.get("config") and stored.get("status") != "pending":
            changed = changed_field(stored["config"], rc.cell)
            if changed:
                raise ConfigError(changed, f"cell {rc.cell.name} ran with another {changed!r} (see {state.path}); "
                                  "restore it, or give the matrix another name or --output")


def tuning_started(study_dir: Path) -> bool:
    """The study's tuning phase began (its sets and attempt are in the manifest), so the study can be resumed."""
    path = study_dir / "manifest.json"
    return path.exists() and bool(json.loads(path.read_text())["phases"].get("tune", {}).get("attempt"))


def plan_cells(state: MatrixState, cells: list[ResolvedCell], phases: list[str], retry_failed: bool) -> list[CellPlan]:
    """Finished cells that ran every phase asked for are skipped; failed ones too unless retried; a cell whose
    study began its tuning phase resumes it (finished phases are kept), any other starts fresh."""
    plans = []
    for rc in cells:
        record = state.cell(rc.cell.name)
        status = record.get("status", "pending")
        if status == "finished" and study_phases(asked=phases).ran_by(record.get("phases", [])):
            plans.append(CellPlan(rc, "skip", record))
        elif status == "failed" and not retry_failed:
            plans.append(CellPlan(rc, "skip-failed", record))
        else:
            started = status in ("running", "finished", "failed") and tuning_started(rc.cell.config.study_dir)
            plans.append(CellPlan(rc, "resume" if started else "run", record))
    return plans


def cell_plan(rc: ResolvedCell, phases: list[str]) -> PhaseSequence:
    """The phases a cell runs, in the study plan's order: those the matrix file asks for, and evaluate_sets where
    the cell's evaluation.sets is `all` (every other tuned set on D^E; H* unchanged)."""
    return study_phases(every_set=rc.resolved.config.evaluation.sets == "all", asked=phases)


def run_cell(rc: ResolvedCell, phases: list[str], console: Console, resume: bool) -> dict[str, float]:
    """The cell's plan in order, each phase tagged with the cell; returns the harmonic mean of each phase's set
    (of the phases with a summary: evaluate_sets has none)."""
    from gtep.orchestration.pretraining import with_pretrained_weights

    resolved, tags = with_pretrained_weights(rc.resolved, console.print), rc.cell.tags  # a pretrain section's, once
    plan = cell_plan(rc, phases)
    outcomes = run_plan(plan, resolved, console, resume=resume, tags=tags)
    write_cell_rows(resolved.config.tracking_uri, [o.run_id for o in outcomes.values()], tags.get("gtep.matrix"),
                    console)
    return {phase.name: outcomes[phase.name].summary["hmean"] for phase in plan.summarized()}


def write_cell_rows(tracking_uri: str, phase_run_ids: list[str], matrix: str | None, console: Console) -> None:
    """What the matrix's report reads of a cell, written as the cell ends: its phase rows in gtep/reports
    (RunStore.write_phase_rows: the matrix's phases fill one experiment's runs table as its cells end) and its
    phases' snapshots of the runs a report reads of them (RunStore.write_snapshots: a file to read per phase
    instead of searches). A store that does not take them (a server away, a user who may not write
    gtep/reports) costs a line: `gtep report` writes them later."""
    from gtep.orchestration.journal import quiet_http_client
    from gtep.orchestration.report_store import RunStore

    store = RunStore(quiet_http_client(tracking_uri), tracking_uri)
    try:
        store.write_phase_rows(phase_run_ids, matrix)
        store.write_snapshots(phase_run_ids)
    except Exception as err:  # noqa: BLE001 - a view of the runs, never a reason for a finished cell to fail
        console.print(f"[yellow]The cell's phase rows and run snapshots were not all written "
                      f"({err.__class__.__name__}); gtep report writes them.[/]", highlight=False)


def _finite(value: float) -> float | None:
    return value if isinstance(value, (int, float)) and math.isfinite(value) else None


def run_matrix(matrix: MatrixConfig, cells: list[ResolvedCell], root: Path, console: Console,
               address: str | None = None, retry_failed: bool = False, parallel_cells: int = 1) -> list[CellPlan]:
    """Run the cells on one Ray cluster, `parallel_cells` at a time; a cell that fails is recorded and the matrix
    goes on. Interrupting it (Ctrl-C, a killed driver) leaves the running cells `running`: the next run resumes
    them."""
    phases = matrix.phases()
    state = MatrixState.open(root, matrix.matrix)
    check_state(state, cells)
    plans = plan_cells(state, cells, phases, retry_failed)
    todo = [p for p in plans if p.action in ("run", "resume")]
    console.print(f"[bold]gtep matrix[/] {matrix.matrix}: {len(cells)} cells ({len(todo)} to run, "
                  f"{sum(p.action == 'skip' for p in plans)} finished, {sum(p.action == 'skip-failed' for p in plans)} "
                  f"failed and kept) -> {root}; phases {', '.join(phases)}")
    if not todo:
        return plans
    with ray_session(address):
        for plan in todo:  # every trial of every cell must fit some node: refused now, not after hours
            check_resources(plan.rc.resolved)
        if parallel_cells > 1 and len(todo) > 1:
            run_in_parallel(todo, phases, state, console, root, parallel_cells)
        else:
            for number, plan in enumerate(todo, 1):
                run_planned(plan, phases, state, console, f"[{number}/{len(todo)}]")
    return plans


def mark_running(plan: CellPlan, state: MatrixState) -> float:
    """The cell's state before it starts; returns the wall time it already spent (when resumed)."""
    cell = plan.rc.cell
    state.update(cell.name, status="running", algorithm=cell.algorithm, scenario=cell.scenario, pairing=cell.pairing,
                 similarity=cell.similarity, study_dir=str(cell.config.study_dir), error=None,
                 config=cell.config.model_dump(mode="json"), started_at=time.time(),
                 phases=[] if plan.action == "run" else plan.record.get("phases", []))
    return float(plan.record.get("wall_seconds") or 0.0) if plan.action == "resume" else 0.0


def mark_finished(plan: CellPlan, state: MatrixState, phases: list[str], hmeans: dict[str, float], wall: float,
                  console: Console) -> None:
    name = plan.rc.cell.name
    state.update(name, status="finished", phases=phases, wall_seconds=round(wall, 1), finished_at=time.time(),
                 hmean={k: _finite(v) for k, v in hmeans.items()})
    plan.action, plan.record = "finished", state.cell(name)
    console.print(f"[green]{name} finished[/] in {wall:.0f} s: " + ", ".join(
        f"{k} HM {100 * v:.2f}" if _finite(v) is not None else f"{k} HM NaN" for k, v in hmeans.items()))


def mark_failed(plan: CellPlan, state: MatrixState, message: str, wall: float, console: Console) -> None:
    name = plan.rc.cell.name
    state.update(name, status="failed", error=message[:2000], wall_seconds=round(wall, 1), finished_at=time.time())
    console.print(f"[bold red]{name} failed[/] after {wall:.0f} s: {escape(message)}", highlight=False)
    plan.action, plan.record = "failed", state.cell(name)


class MatrixInterrupted(StudyStopped):
    """Ctrl-C or SIGTERM stopped the matrix: the running cells stay `running`, and the same command resumes them."""

    def __init__(self, cells: list[str], exit_code: int = 130) -> None:
        super().__init__(f"interrupted: cell(s) {', '.join(cells) or 'none'} stopped and kept `running`, no "
                         "later cell started", exit_code=exit_code)

    def describe(self, command: str) -> str:
        return f"{self}. Resume with the same gtep matrix command (finished cells are kept)"


def run_planned(plan: CellPlan, phases: list[str], state: MatrixState, console: Console, counter: str) -> None:
    cell = plan.rc.cell
    console.rule(f"{counter} {cell.name}  ({cell.algorithm}, {cell.scenario}, {cell.pairing}: {cell.similarity})"
                 + ("  resuming" if plan.action == "resume" else ""))
    before = mark_running(plan, state)
    start = time.perf_counter()
    try:
        hmeans = run_cell(plan.rc, phases, console, resume=plan.action == "resume")
    except StudyInterrupted as err:  # the user stops the matrix, not this cell: it stays running, to resume
        raise MatrixInterrupted([cell.name], err.exit_code) from err
    except Exception as err:  # noqa: BLE001 - one cell's failure (all sets diverged, a crash) must not stop the matrix
        mark_failed(plan, state, f"{err.__class__.__name__}: {err}", before + time.perf_counter() - start, console)
        return
    mark_finished(plan, state, phases, hmeans, before + time.perf_counter() - start, console)


@dataclass
class CellProcess:
    """A cell running in its own driver process (matrix_cell.py)."""

    plan: CellPlan
    process: subprocess.Popen
    log: Path
    result: Path
    before: float
    start: float = field(default_factory=time.perf_counter)


def start_cell_process(plan: CellPlan, phases: list[str], state: MatrixState, address: str) -> CellProcess:
    cell = plan.rc.cell
    folder = Path(cell.config.study_dir)
    folder.mkdir(parents=True, exist_ok=True)
    log, result = folder / "matrix-cell.log", folder / "matrix-cell.result.json"
    result.unlink(missing_ok=True)  # a result left by an earlier run must not be read as this run's
    before = mark_running(plan, state)
    job = {"cell": {"matrix": cell.matrix, "name": cell.name, "algorithm": cell.algorithm, "scenario": cell.scenario,
                    "pairing": cell.pairing, "similarity": cell.similarity},
           "config": cell.config.model_dump(mode="json"), "phases": phases, "resume": plan.action == "resume",
           "address": address, "result": str(result), "parent_pid": os.getpid()}
    with log.open("ab") as out:
        process = subprocess.Popen([sys.executable, "-m", "gtep.orchestration.matrix_cell"], stdin=subprocess.PIPE,
                                   stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "COLUMNS": "160"})
    if process.stdin is None:  # stdin=PIPE always gives one
        raise RuntimeError("the cell process has no stdin pipe")
    process.stdin.write(json.dumps(job).encode())
    process.stdin.close()
    return CellProcess(plan, process, log, result, before)


def collect_cell(running: CellProcess, phases: list[str], state: MatrixState, console: Console) -> str:
    """A cell process ended: its result file says finished (with the harmonic means), failed (with the error) or
    interrupted (a stop signal: the cell stays `running`, to resume). Returns that status."""
    wall = running.before + time.perf_counter() - running.start
    result = json.loads(running.result.read_text()) if running.result.exists() else None
    if result and result["status"] == "interrupted":
        return "interrupted"
    if result and result["status"] == "finished":
        mark_finished(running.plan, state, phases, result["hmean"], wall, console)
    else:
        message = result["error"] if result else f"its driver exited with code {running.process.returncode}"
        mark_failed(running.plan, state, f"{message} (log: {running.log})", wall, console)
        return "failed"
    return "finished"


def run_in_parallel(todo: list[CellPlan], phases: list[str], state: MatrixState, console: Console, root: Path,
                    parallel_cells: int) -> None:
    """Up to `parallel_cells` cell drivers at once on the cluster this process holds; a bar counts the cells."""
    import ray

    address = ray.get_runtime_context().gcs_address  # the cells join this very cluster, local or not
    waiting: list[CellPlan] = list(todo)
    running: list[CellProcess] = []
    console.print(f"{min(parallel_cells, len(todo))} cells at a time, each a driver of its own; their output: "
                  f"{root}/<cell>/matrix-cell.log")
    progress = Progress(TextColumn("[bold]cells"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[now]}"),
                        TimeElapsedColumn(), console=console, **redraws(console))
    stopped: list[str] = []
    try:
        with progress:
            bar = progress.add_task("cells", total=len(todo), now="")
            while waiting or running:
                while waiting and len(running) < parallel_cells:
                    running.append(start_cell_process(waiting.pop(0), phases, state, address))
                progress.update(bar, now="running: " + ", ".join(r.plan.rc.cell.name for r in running))
                time.sleep(1.0)
                for done in [r for r in running if r.process.poll() is not None]:
                    running.remove(done)
                    if collect_cell(done, phases, state, progress.console) == "interrupted":
                        stopped.append(done.plan.rc.cell.name)
                        waiting.clear()  # a stop signal reached the cells: start no other
                    else:
                        progress.advance(bar)
    except KeyboardInterrupt:  # Ctrl-C reached this driver too: the cells still alive are stopped below
        stopped += [r.plan.rc.cell.name for r in running]
    finally:  # Ctrl-C reached the cells too (one process group); a cell still alive is stopped, and stays `running`
        for r in running:
            if r.process.poll() is None:
                r.process.terminate()
        for r in running:
            try:
                r.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                r.process.kill()
    if stopped:
        raise MatrixInterrupted(stopped)


def _pct(value: Any) -> str:
    return "NaN" if value is None else f"{100 * float(value):.2f}"


def cells_table(matrix: MatrixConfig, state_path: Path, cells: list[ResolvedCell]) -> Table:
    """Every cell with its status, the harmonic means of its phases and its wall time (from the state file)."""
    data = json.loads(state_path.read_text())["cells"] if state_path.exists() else {}
    phases = matrix.phases()
    heads = {name: f"{PHASES.get(name).label} HM" for name in phases}
    table = Table(title=f"matrix {matrix.matrix}", caption=str(state_path))
    for column in ("cell", "status", *[heads[p] for p in phases], "wall s"):
        table.add_column(column, justify="left" if column in ("cell", "status") else "right", no_wrap=column == "cell")
    colours = {"finished": "green", "failed": "red", "running": "yellow"}
    for rc in cells:
        record = data.get(rc.cell.name, {})
        status = record.get("status", "pending")
        hmean = record.get("hmean", {})
        wall = record.get("wall_seconds")
        table.add_row(rc.cell.name, f"[{colours.get(status, 'white')}]{status}[/]",
                      *[_pct(hmean.get(p)) if p in hmean else "-" for p in phases],
                      f"{wall:.0f}" if wall is not None else "-")
    return table
