"""gtep ui | server | sync: the MLflow side, a UI over a store, a tracking server, writes a study could not make.

`ui` and `server` run MLflow's own commands in a subprocess (so nothing here imports MLflow)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Optional

import typer

from gtep.cli.common import UriOpt, console, fail, output_folder, run_guarded
from gtep.config import ConfigError, check_port, check_store_file

app = typer.Typer()


@app.command()
def ui(output: Path = typer.Option(Path("gtep-runs"), "--output", parser=output_folder, metavar="<path>",
                                   help="the --output folder of the runs"),
       tracking_uri: Optional[str] = UriOpt, host: str = typer.Option("127.0.0.1", help="bind address"),
       port: int = typer.Option(5000, help="port"),
       study: Optional[str] = typer.Option(None, "--study", help="print the links of this study only"),
       workers: int = typer.Option(1, help="server worker processes (one is plenty for one user)")) -> None:
    """Open the MLflow UI over the runs' store and print each study's runs table.

    The UI listens on 127.0.0.1 unless --host says otherwise. Each study's table puts its phase runs'
    Acc/AvgAcc/HM side by side, and its orderings are charted by phase."""
    uri = tracking_uri or f"sqlite:///{output.resolve()}/mlflow.db"
    if uri.startswith("sqlite:///") and not Path(uri[len("sqlite:///"):]).exists():
        fail(f"--output: no MLflow store at {uri[len('sqlite:///'):]}; run gtep run first or pass --output")

    found: list[tuple[str, dict[str, str]]] = []

    def links() -> None:
        from gtep.orchestration.tracking import prepare_ui, ui_routes

        check_port(port)
        check_ui_store(uri, "--tracking-uri" if tracking_uri else "--output")
        studies = prepare_ui(uri, study)
        if study is not None and not studies:
            raise ConfigError("--study", f"{uri} has no study {study!r}")
        found.extend((name, ui_routes(experiment_id)) for name, experiment_id in studies)

    run_guarded(links)
    root = f"http://{'127.0.0.1' if host in ('0.0.0.0', '::') else host}:{port}/"
    console.print(f"MLflow UI on {root} over {uri} (Ctrl-C stops it)", soft_wrap=True, highlight=False)
    for name, routes in found:
        console.print(f"  {name}: runs  {root}{routes['runs']}", soft_wrap=True, highlight=False)
        console.print(f"  {' ' * len(name)}  orderings by phase  {root}{routes['orderings']}", soft_wrap=True,
                      highlight=False)
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    cmd = [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", uri, "--host", host, "--port", str(port),
           "--workers", str(workers)]
    raise typer.Exit(serve(cmd, env))


def check_ui_store(uri: str, option: str) -> None:
    """The store answers before the UI starts: a server is asked once with a short timeout (MLflow's client would
    retry for minutes with no output), a sqlite file must be a database (else MLflow's traceback)."""
    from gtep.orchestration.tracking_store import check_tracking

    check_tracking(uri)  # the scheme, and an http(s) server's /health within 5 s
    if uri.startswith("sqlite:///"):
        check_store_file(Path(uri[len("sqlite:///"):]), option)


def serve(cmd: list[str], env: dict[str, str]) -> int:
    """Run a server in its own process group and pass SIGINT/SIGTERM/SIGHUP on to the whole group (MLflow's
    server and its workers), so `kill <pid of gtep ui>` stops what it started; returns its exit code."""
    import signal

    proc = subprocess.Popen(cmd, env=env, start_new_session=True)

    def forward(signum, frame) -> None:
        try:
            os.killpg(proc.pid, signum)
        except ProcessLookupError:
            pass

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        while True:
            try:
                code = proc.wait()
                break
            except KeyboardInterrupt:
                continue
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    try:
        os.killpg(proc.pid, signal.SIGTERM)  # workers the server left behind
    except ProcessLookupError:
        pass
    return 0 if code in (-signal.SIGINT, -signal.SIGTERM, -signal.SIGHUP) else code


def mlflow_server_command(backend_store_uri: str, artifacts_destination: str, host: str, port: int,
                          workers: int) -> list[str]:
    """The `mlflow server` line `gtep server` runs (README shows it for use without gtep)."""
    return [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", backend_store_uri,
            "--artifacts-destination", artifacts_destination, "--serve-artifacts",
            "--host", host, "--port", str(port), "--workers", str(workers)]


@app.command()
def server(backend_store_uri: str = typer.Option("sqlite:///gtep-server/mlflow.db", "--backend-store-uri",
                                                 help="postgresql://user:pass@host:5432/db for a shared server"),
           artifacts_destination: str = typer.Option("gtep-server/mlartifacts", "--artifacts-destination",
                                                     help="a folder, s3://... or gs://... for run artifacts"),
           host: str = typer.Option("127.0.0.1", help="bind address (0.0.0.0 only inside a private network)"),
           port: int = typer.Option(5000, help="port"),
           workers: int = typer.Option(2, help="server worker processes")) -> None:
    """Start an MLflow tracking server for studies on a cluster.

    Studies log to it with --tracking-uri http://HOST:PORT."""
    def go():
        import importlib.util

        check_port(port)
        scheme = backend_store_uri.split(":", 1)[0]
        driver = "psycopg2" if scheme == "postgresql+psycopg2" else "psycopg"
        if scheme.startswith("postgresql") and importlib.util.find_spec(driver) is None:
            raise ConfigError("--backend-store-uri",
                              f"PostgreSQL needs its driver {driver}: pip install 'gtep[server]'")
        if scheme == "sqlite":
            Path(backend_store_uri[len("sqlite:///"):]).parent.mkdir(parents=True, exist_ok=True)
        if "://" not in artifacts_destination:
            Path(artifacts_destination).mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
        console.print(f"MLflow tracking server on http://{host}:{port} (store {backend_store_uri.split('@')[-1]}, "
                      f"artifacts {artifacts_destination}); Ctrl-C stops it")
        cmd = mlflow_server_command(backend_store_uri, artifacts_destination, host, port, workers)
        raise typer.Exit(serve(cmd, env))
    run_guarded(go)


@app.command()
def sync(study_dir: Path = typer.Argument(..., help="OUTPUT/STUDY: the study folder"),
         tracking_uri: Optional[str] = typer.Option(None, "--tracking-uri",
                                                    help="write to another store than the study's")) -> None:
    """Write what a study could not write to MLflow while its tracking server was away."""
    def go():
        from gtep.orchestration.journal import TrackingJournal

        try:
            journal = TrackingJournal.load(study_dir, tracking_uri)
        except FileNotFoundError as err:
            raise ConfigError("study_dir", f"{err}; give the OUTPUT/STUDY folder of a study") from None
        before = len(journal.pending)
        left = journal.flush(force=True)
        console.print(f"{study_dir}: {before - left} writes applied to {journal.state.tracking_uri}, {left} waiting")
        if left:
            fail(f"--tracking-uri: {journal.state.tracking_uri} did not take them ({journal.last_error}); "
                 "run gtep sync again when it answers")
    run_guarded(go)
