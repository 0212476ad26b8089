"""gtep matrix | matrices: a matrix of studies (algorithms x scenarios x pairings), run cell by cell, then
reported over as a whole. Heavy imports (Ray, MLflow) happen only when a command runs."""
from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer
from rich.markup import escape
from rich.table import Table

from gtep.cli.common import (
    check_counts,
    console,
    described_presets,
    output_folder,
    preset_table,
    run_guarded,
    through_ray_client,
)
from gtep.config import ConfigError

if TYPE_CHECKING:
    from gtep.matrix import MatrixConfig, ResolvedCell

app = typer.Typer()


@app.command("matrix")
def matrix_command(
        config: Optional[Path] = typer.Option(None, "--config", "-c", help="matrix YAML file"),
        preset: Optional[str] = typer.Option(None, "--preset", help="a matrix shipped with gtep (gtep matrices)"),
        output: Optional[Path] = typer.Option(None, "--output", parser=output_folder, metavar="<path>",
                                              help="parent of the matrix folder <output>/<matrix> "
                                              "[base.tracking.output or ./gtep-runs]"),
        tracking_uri: Optional[str] = typer.Option(None, "--tracking-uri",
                                                   help="MLflow tracking URI [sqlite:///<output>/<matrix>/mlflow.db]"),
        address: Optional[str] = typer.Option(None, "--address", help="an existing Ray cluster (host:port, "
                                              "ray://host:10001, auto)"),
        trials: Optional[int] = typer.Option(None, "--trials", help="R of every cell"),
        orderings: Optional[int] = typer.Option(None, "--orderings", help="S of every cell"),
        max_concurrent: Optional[int] = typer.Option(None, "--max-concurrent", help="trials running at once"),
        parallel_cells: int = typer.Option(1, "--parallel-cells", min=1, help="cells running at once, each a driver "
                                           "process of its own on the one Ray cluster "
                                           "(output in <cell>/matrix-cell.log)"),
        retry_failed: bool = typer.Option(False, "--retry-failed", help="run failed cells again (resuming them)"),
        check: bool = typer.Option(False, "--check", help="validate every cell and list them; run nothing"),
        no_report: bool = typer.Option(False, "--no-report", help="skip the report over the matrix at the end"),
) -> None:
    """Run algorithms x scenarios x dataset pairings (paper Tables 1-2) as one batch.

    Each cell is a study with its own
    folder and MLflow lineage, run on one Ray cluster (one after another, or --parallel-cells at once), resumable
    cell by cell (rerun the same command), then the report over the whole matrix."""
    def go() -> None:
        from gtep.config.uris import check_no_userinfo
        from gtep.matrix import load_matrix, load_matrix_preset, matrix_root, resolve_cells

        if config and preset:
            raise ConfigError("--preset", "give either --config or --preset, not both")
        if not config and not preset:
            raise ConfigError("--config", "give a matrix file (--config m.yaml) or a matrix preset (--preset small; "
                              "gtep matrices lists them)")
        check_counts(trials=trials, orderings=orderings, max_concurrent=max_concurrent)
        if tracking_uri is not None:
            check_no_userinfo(tracking_uri, "--tracking-uri")  # before a Ray client or a cell repeats it
        if through_ray_client(address, config):
            return
        matrix = load_matrix(config) if config else load_matrix_preset(str(preset))  # one of them is given
        overrides = {"tracking.tracking_uri": tracking_uri, "compute.ray_address": address, "search.trials": trials,
                     "search.orderings": orderings, "compute.max_concurrent": max_concurrent}
        cells = resolve_cells(matrix, output, overrides)  # every cell before any compute; nothing written
        root = matrix_root(matrix, output).resolve()
        first = cells[0].resolved.config
        run_matrix_cells(matrix, cells, root, first.tracking_uri, first.compute.ray_address, check=check,
                         retry_failed=retry_failed, report=not no_report, parallel_cells=parallel_cells)
    run_guarded(go)


def run_matrix_cells(matrix: MatrixConfig, cells: list[ResolvedCell], root: Path, tracking_uri: str,
                     address: Optional[str], *, check: bool, retry_failed: bool, report: bool,
                     parallel_cells: int = 1) -> None:
    from gtep.orchestration.matrix import STATE_FILE, cells_table, run_matrix
    from gtep.orchestration.ray_search import check_address
    from gtep.orchestration.report_store import create_store
    from gtep.orchestration.tracking_store import check_tracking

    check_address(address)
    check_tracking(tracking_uri)
    if check:
        console.print(cell_listing(cells, root / STATE_FILE))
        return
    if parallel_cells > 1:
        create_store(tracking_uri)  # cell drivers would otherwise race to create a fresh sqlite store's tables
    plans = run_matrix(matrix, cells, root, console, address=address, retry_failed=retry_failed,
                       parallel_cells=parallel_cells)
    console.print(cells_table(matrix, root / STATE_FILE, cells))
    if report and any(p.action in ("finished", "skip") for p in plans):
        report_matrix(matrix, tracking_uri, root)
    console.print(f"matrix folder: {root}  (matrix.json, one study folder per cell)\nMLflow store: {tracking_uri}")
    failed = [p.rc.cell.name for p in plans if p.action in ("failed", "skip-failed")]
    if failed:
        console.print(f"[red]{len(failed)} cell(s) failed[/] (errors in {escape(str(root / STATE_FILE))}); rerun with "
                      "--retry-failed to run them again")
        raise typer.Exit(1)


def report_matrix(matrix: MatrixConfig, tracking_uri: str, root: Path) -> Path | None:
    """The paper's tables over the whole matrix: `gtep report --matrix NAME` as a process of its own, so that what
    reading a paper-scale matrix costs (half a GiB of frames and figures at 18,600 units) is given back when it
    ends instead of staying in this driver for good. The matrix's results are kept in MLflow either way, so a
    report that cannot be built is a warning with the command to build it later."""
    import os
    import subprocess
    import sys

    later = f"gtep report --matrix {matrix.matrix} --tracking-uri '{tracking_uri}'"
    out = root / "report"
    # the URI carries no credentials (check_no_userinfo); a server's come from the environment, as here
    command = [sys.executable, "-m", "gtep", "report", "--matrix", matrix.matrix, "--tracking-uri", tracking_uri,
               "--out", str(out), "--format", "table,md,csv,latex"]
    width = str(console.width)  # the child's output is a pipe: it lays its tables out at this terminal's width
    try:
        child = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True, env={**os.environ, "COLUMNS": width})
    except OSError as err:
        console.print(f"[yellow]report over the matrix could not start ({escape(str(err))}); "
                      f"build it later with: {escape(later)}[/]", highlight=False)
        return None
    assert child.stdout is not None
    for line in child.stdout:  # as it comes: the progress lines of a long report, then its tables
        console.out(line.rstrip("\n"), highlight=False)
    if child.wait() != 0:
        console.print(f"[yellow]report over the matrix failed (exit {child.returncode}, said above); "
                      f"build it later with: {escape(later)}[/]", highlight=False)
        return None
    return out


def cell_listing(cells: list[ResolvedCell], state_path: Path) -> Table:
    """`gtep matrix --check`: what each cell would run, and its status when the matrix ran before."""
    states = json.loads(state_path.read_text())["cells"] if state_path.exists() else {}
    table = Table(title=f"{len(cells)} cells, all valid", caption=str(state_path.parent))
    for column in ("cell", "scenario", "D^HT", "D^E", "similarity", "backbone", "R x S", "status"):
        table.add_column(column, no_wrap=column == "cell")
    for rc in cells:
        r, cfg = rc.resolved, rc.resolved.config
        table.add_row(rc.cell.name, cfg.scenario.describe(), f"{r.tuning.dataset} ({len(r.tuning.classes)})",
                      f"{r.evaluation.dataset} ({len(r.evaluation.classes)})", rc.cell.similarity, cfg.backbone,
                      f"{cfg.search.trials} x {cfg.search.orderings}",
                      states.get(rc.cell.name, {}).get("status", "pending"))
    return table


@app.command("matrices")
def matrices_command(show: Optional[str] = typer.Option(None, "--show", help="print a matrix preset's YAML "
                                                       "(to copy and edit)")) -> None:
    """List the matrices shipped with gtep (use with gtep matrix --preset NAME)."""
    def go() -> None:
        from gtep.matrix import matrix_preset_names, matrix_preset_text

        if show:
            print(matrix_preset_text(show), end="")
            return
        table = preset_table("matrix presets", ("name", "algorithms", "scenarios", "pairings", "cells", "description"))
        for name, doc, comment in described_presets(matrix_preset_names(), matrix_preset_text):
            pairings = ", ".join(f"{p} ({spec['similarity']})" for p, spec in doc["pairings"].items())
            cells = len(doc["algorithms"]) * len(doc["scenarios"]) * len(doc["pairings"])
            table.add_row(name, ", ".join(doc["algorithms"]), ", ".join(doc["scenarios"]), pairings, str(cells),
                          comment.split(". ")[0][:120])
        console.print(table)
    run_guarded(go)
