"""Running a matrix of GTEP studies (gtep matrix; the cells come resolved from gtep/matrix.py).

One Ray session for the whole matrix; the cells run one after another and each Tuner gets the whole cluster
for its trials (compute.max_concurrent of the cell), which is how the cells share it. Every phase run of a
cell carries the matrix tags, so `gtep report --matrix NAME` reads the paper's tables from the one store.

<output>/<matrix>/matrix.json   each cell's status (pending, running, finished, failed), its config, phases,
                                harmonic means and wall time: a rerun skips finished cells, resumes running
                                ones (units reused, MLflow runs found again) and retries failed ones on request
<output>/<matrix>/<cell>/       the cell's study folder (manifest, best.yaml, units, tracking journal)
<output>/<matrix>/mlflow.db     the default store of every cell
"""
from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from gtep.config import ConfigError
from gtep.matrix import MatrixConfig, ResolvedCell, changed_field
from gtep.orchestration.phases import (check_resources, conventional_phase, evaluate_phase, original_phase,
                                       ray_session, tune_phase)
from gtep.orchestration.study import json_by_entry, read_best, write_atomic

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
        if status == "finished" and set(phases) <= set(record.get("phases", [])):
            plans.append(CellPlan(rc, "skip", record))
        elif status == "failed" and not retry_failed:
            plans.append(CellPlan(rc, "skip-failed", record))
        else:
            started = status in ("running", "finished", "failed") and tuning_started(rc.cell.config.study_dir)
            plans.append(CellPlan(rc, "resume" if started else "run", record))
    return plans


def run_cell(rc: ResolvedCell, phases: list[str], console: Console, resume: bool) -> dict[str, float]:
    """The cell's phases in order, each tagged with the cell; returns the harmonic mean of each phase's set."""
    resolved, tags = rc.resolved, rc.cell.tags
    hmeans: dict[str, float] = {}
    tuned = tune_phase(resolved, console, resume=resume, tags=tags)
    hmeans["tune"] = tuned.summary["hmean"]
    best = read_best(tuned.paths.best)
    hmeans["evaluate"] = evaluate_phase(resolved, best, console, resume=resume, tags=tags).summary["hmean"]
    if "original" in phases:
        hmeans["original"] = original_phase(resolved, console, resume=resume, tags=tags).summary["hmean"]
    if "conventional" in phases:
        hmeans["conventional"] = conventional_phase(resolved, best, console, resume=resume, tags=tags).summary["hmean"]
    return hmeans


def _finite(value: float) -> float | None:
    return value if isinstance(value, (int, float)) and math.isfinite(value) else None


def run_matrix(matrix: MatrixConfig, cells: list[ResolvedCell], root: Path, console: Console,
               address: str | None = None, retry_failed: bool = False) -> list[CellPlan]:
    """Run the cells in one Ray session, one after another; a cell that fails is recorded and the matrix goes on.
    Interrupting it (Ctrl-C, a killed driver) leaves the running cell `running`: the next run resumes it."""
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
        for number, plan in enumerate(todo, 1):
            run_planned(plan, phases, state, console, f"[{number}/{len(todo)}]")
    return plans


def run_planned(plan: CellPlan, phases: list[str], state: MatrixState, console: Console, counter: str) -> None:
    cell = plan.rc.cell
    console.rule(f"{counter} {cell.name}  ({cell.algorithm}, {cell.scenario}, {cell.pairing}: {cell.similarity})"
                 + ("  resuming" if plan.action == "resume" else ""))
    before = float(plan.record.get("wall_seconds") or 0.0) if plan.action == "resume" else 0.0
    state.update(cell.name, status="running", algorithm=cell.algorithm, scenario=cell.scenario, pairing=cell.pairing,
                 similarity=cell.similarity, study_dir=str(cell.config.study_dir), error=None,
                 config=cell.config.model_dump(mode="json"), phases=[] if plan.action == "run" else
                 plan.record.get("phases", []))
    start = time.perf_counter()
    try:
        hmeans = run_cell(plan.rc, phases, console, resume=plan.action == "resume")
    except Exception as err:  # noqa: BLE001 - one cell's failure (all sets diverged, a crash) must not stop the matrix
        wall = before + time.perf_counter() - start
        message = f"{err.__class__.__name__}: {err}"
        state.update(cell.name, status="failed", error=message[:2000], wall_seconds=round(wall, 1))
        console.print(f"[bold red]{cell.name} failed[/] after {wall:.0f} s: {message}", highlight=False)
        plan.action, plan.record = "failed", state.cell(cell.name)
        return
    wall = before + time.perf_counter() - start
    state.update(cell.name, status="finished", phases=phases, wall_seconds=round(wall, 1),
                 hmean={k: _finite(v) for k, v in hmeans.items()})
    plan.action, plan.record = "finished", state.cell(cell.name)
    console.print(f"[green]{cell.name} finished[/] in {wall:.0f} s: " + ", ".join(
        f"{k} HM {100 * v:.2f}" if _finite(v) is not None else f"{k} HM NaN" for k, v in hmeans.items()))


def _pct(value: Any) -> str:
    return "NaN" if value is None else f"{100 * float(value):.2f}"


def cells_table(matrix: MatrixConfig, state_path: Path, cells: list[ResolvedCell]) -> Table:
    """Every cell with its status, the harmonic means of its phases and its wall time (from the state file)."""
    data = json.loads(state_path.read_text())["cells"] if state_path.exists() else {}
    phases = matrix.phases()
    heads = {"tune": "tuning HM", "evaluate": "evaluation HM", "original": "original HM",
             "conventional": "conventional HM"}
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


def report_matrix(matrix: MatrixConfig, tracking_uri: str, root: Path, console: Console) -> Path | None:
    """The paper's tables over the whole matrix (gtep report --matrix NAME); the matrix's results are kept in
    MLflow either way, so a report that cannot be built is a warning with the command to build it later."""
    from gtep.report import run_report

    later = f"gtep report --matrix {matrix.matrix} --tracking-uri '{tracking_uri}'"
    out = root / "report"
    try:
        run_report(tracking_uri, [], matrix=matrix.matrix, out=out,
                   formats=("table", "md", "csv", "latex"), console=console)
    except Exception as err:  # noqa: BLE001 - the computed results are safe in MLflow; say how to retry
        console.print(f"[yellow]report over the matrix failed ({err.__class__.__name__}: {err}); "
                      f"build it later with: {later}[/]", highlight=False)
        return None
    console.print(f"report files: {out}")
    return out
