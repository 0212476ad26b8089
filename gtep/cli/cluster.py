"""gtep submit | jobs ...: studies sent to a Ray cluster as Ray Jobs, and following them."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from gtep.cli.common import console, run_guarded

app = typer.Typer()


JobsAddressOpt = typer.Option(None, "--address", envvar="RAY_ADDRESS",
                              help="the cluster's dashboard, http://HEAD:8265 [RAY_ADDRESS or http://127.0.0.1:8265]")


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def submit(ctx: typer.Context, config: Path = typer.Option(..., "--config", "-c", help="experiment YAML file"),
           phase: str = typer.Option("run", "--phase", help="tune, evaluate or run"),
           address: Optional[str] = JobsAddressOpt,
           wait: bool = typer.Option(False, "--wait", help="follow the job's log until it ends")) -> None:
    """Send a study to a Ray cluster as a Ray Job.

    Further options (--output, --trials and the others) go to the phase command."""
    def go():
        from gtep.orchestration import jobs

        sent = jobs.submit(address, config, phase, list(ctx.args))
        console.print(f"submitted [bold]{sent.job_id}[/] to {sent.address}: {sent.entrypoint}")
        console.print(f"follow it: gtep jobs logs {sent.job_id} --follow --address {sent.address}")
        print(sent.job_id)
        if wait:
            for chunk in jobs.follow(sent.address, sent.job_id):
                sys.stdout.write(chunk)
            state = jobs.status(sent.address, sent.job_id)
            console.print(f"job {sent.job_id}: {state}")
            if state != "SUCCEEDED":
                raise typer.Exit(1)
    run_guarded(go)


# registered last by gtep.cli, after the top-level commands, as `gtep jobs`
jobs_app = typer.Typer(no_args_is_help=True, help="Follow studies submitted with gtep submit (Ray Jobs).")


@jobs_app.command("status")
def jobs_status(job_id: str, address: Optional[str] = JobsAddressOpt,
                wait: bool = typer.Option(False, "--wait",
                                          help="block until the job ends; exit 1 unless it succeeded")) -> None:
    """Show a job's state: PENDING, RUNNING, SUCCEEDED, FAILED or STOPPED."""
    def go():
        from gtep.orchestration import jobs

        state = jobs.wait(address, job_id) if wait else jobs.status(address, job_id)
        console.print(f"{job_id}: {state}")
        if wait and state != "SUCCEEDED":
            raise typer.Exit(1)
    run_guarded(go)


@jobs_app.command("logs")
def jobs_logs(job_id: str, address: Optional[str] = JobsAddressOpt,
              follow: bool = typer.Option(False, "--follow", "-f", help="keep printing until the job ends")) -> None:
    """Show a job's driver output (its phase tables, progress and where its results went)."""
    def go():
        from gtep.orchestration import jobs

        if follow:
            for chunk in jobs.follow(address, job_id):
                sys.stdout.write(chunk)
        else:
            sys.stdout.write(jobs.logs(address, job_id))
    run_guarded(go)


@jobs_app.command("stop")
def jobs_stop(job_id: str, address: Optional[str] = JobsAddressOpt) -> None:
    """Stop a job; resume the study later with gtep tune|run --resume OUTPUT/STUDY."""
    def go():
        from gtep.orchestration import jobs

        stopped = jobs.stop(address, job_id)
        console.print(f"{job_id}: {'stopping' if stopped else 'had already ended'}")
    run_guarded(go)


@jobs_app.command("list")
def jobs_list(address: Optional[str] = JobsAddressOpt) -> None:
    """List the cluster's jobs."""
    def go():
        from gtep.orchestration import jobs

        table = Table(title="Ray jobs")
        for column in ("id", "status", "start", "entrypoint"):
            table.add_column(column, no_wrap=column != "entrypoint")
        for job in jobs.listing(address):
            table.add_row(job["id"], job["status"], job["start"], job["entrypoint"])
        console.print(table)
    run_guarded(go)
