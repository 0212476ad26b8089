"""gtep report: the command line of gtep.reporting.build.run_report (the paper's tables and figures from MLflow).

Heavy imports (MLflow, pandas, matplotlib, Optuna) happen only when the command runs, so `gtep --help` stays fast.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console

from gtep.cli.common import console, output_folder, run_guarded
from gtep.config import ConfigError, check_tracking_uri

app = typer.Typer()

SelectorsArg = typer.Argument(None, help="study names, experiment names (gtep/<study>) or globs ('gtep/mx-*')",
                              show_default=False)


def matrix_store_folder(output: Path, matrix: str | None) -> Path:
    """The folder whose mlflow.db to read: a matrix keeps its store in <output>/<matrix> (gtep matrix), so
    `--matrix NAME --output RUNS` finds it there when RUNS itself holds none."""
    if matrix and not (output / "mlflow.db").exists() and (output / matrix / "mlflow.db").exists():
        return output / matrix
    return output


@app.command("report")
def report_command(
        selectors: Optional[List[str]] = SelectorsArg,
        matrix: Optional[str] = typer.Option(None, "--matrix", help="only phase runs of this gtep matrix "
                                             "(tag gtep.matrix); with no selectors, every study of the store"),
        formats: List[str] = typer.Option(["table"], "--format", "-f", help="table, md, csv, latex: repeat the option "
                                         "or separate with commas (figures as PNG, and as PDF too with latex; "
                                         "report.html with every table and figure is always written)"),
        out: Optional[Path] = typer.Option(None, "--out", help="folder for the report's files "
                                           "(default: <output>/reports/<date-time>)"),
        output: Path = typer.Option(Path("gtep-runs"), "--output", parser=output_folder, metavar="<path>",
                                    help="the runs folder whose mlflow.db to read"),
        tracking_uri: Optional[str] = typer.Option(None, "--tracking-uri",
                                                   help="MLflow tracking URI (default: sqlite:///<output>/mlflow.db)"),
        no_log: bool = typer.Option(False, "--no-log", help="do not log the report as a run in gtep/reports"),
        no_figures: bool = typer.Option(False, "--no-figures", help="tables only: draw no figure (report.html "
                                        "and report.md without them)"),
) -> None:
    """Build the paper's tables and figures from tracked studies; nothing is re-run.

    Per scenario and dataset pairing: Acc / AvgAcc of
    every algorithm in each phase, the overestimation gap, Kendall's tau between the phases' rankings, Original vs
    H*, per-task curves of H* on D^HT beside D^E, cost plots, and hyperparameter importance and convergence from the
    tuning trials, with the set states (complete / incomplete / diverged) and the phase runs left out.
    It reads MLflow only."""
    def go() -> None:
        from gtep.orchestration.report_store import open_store
        from gtep.reporting.build import check_formats, run_report

        chosen = check_formats(formats)
        runs = matrix_store_folder(output, matrix) if tracking_uri is None else output
        uri = tracking_uri or f"sqlite:///{runs.resolve()}/mlflow.db"
        check_tracking_uri(uri, "--tracking-uri" if tracking_uri else "--output")
        open_store(uri, "--tracking-uri" if tracking_uri else "--output")  # the option the user can fix
        if out is not None and out.exists() and not out.is_dir():
            raise ConfigError("--out", f"{out} is a file; give a folder for the report")
        folder = out or runs / "reports" / time.strftime("%Y%m%d-%H%M%S")
        report = run_report(uri, list(selectors or []), matrix=matrix, out=folder, formats=chosen,
                            console=console, log_to_mlflow=not no_log, figures=not no_figures,
                            progress=Console(stderr=True))
        console.print(f"report files: {report.out} ({len(report.paths)} files)")
        if report.run_id:
            console.print(f"report run: {report.run_id} in experiment gtep/reports of {uri}")
    run_guarded(go)
