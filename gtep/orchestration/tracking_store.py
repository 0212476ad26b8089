"""The MLflow side of a phase: the store checked before compute, sqlite in WAL mode, the study's experiment,
the journal that carries every write (and replays it after an outage), and H* read back from a tuning run."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from mlflow.tracking import MlflowClient
from rich.console import Console
from rich.markup import escape

from gtep.config import ConfigError, ResolvedExperiment, check_tracking_uri
from gtep.config.private import private_file, private_folder
from gtep.config.uris import is_server
from gtep.orchestration.journal import TrackingJournal, quiet_http_client
from gtep.orchestration.study import StudyPaths, read_best
from gtep.orchestration.tracking import ensure_experiment
from gtep.orchestration.tracking_auth import (
    check_can_write,
    check_credentials,
    redact,
    refusal_error,
)


def check_tracking(uri: str) -> None:
    """A store MLflow cannot open, or a tracking server that does not answer, is refused before Ray starts (an
    outage later is journaled). For an address no resolution has checked (gtep ui, gtep matrix, gtep users)."""
    check_tracking_uri(uri, "--tracking-uri")  # first: no password in the address (gtep.config.uris)
    check_tracking_server(uri)


def check_tracking_server(uri: str) -> None:
    """A tracking server that does not answer, or refuses our credentials, is refused before Ray starts; a local
    store passes. `uri` is an address already checked (a resolved experiment's: gtep.config.resolution checked
    it once), so it is only classified here, and a server's own checks take it as it is."""
    if not is_server(uri):
        return
    import urllib.request

    try:
        with urllib.request.urlopen(f"{uri.rstrip('/')}/health", timeout=5):
            pass
    except OSError as err:
        reason = getattr(err, "reason", None) or err
        raise ConfigError("--tracking-uri", f"no MLflow server answers at {uri} ({reason}); start one "
                          "(gtep server) or leave --tracking-uri out for the local sqlite store") from None
    check_credentials(uri)  # a server with authentication: who we are, refused now rather than after a minute



def sqlite_write_ahead_log(path: Path) -> None:
    """Put a local sqlite store in WAL mode (it stays so in the file): a commit costs one sync instead of
    several (a unit's four MLflow writes 53 -> 34 ms here), and the MLflow UI or a parallel cell's driver reads
    while a study writes. WAL needs a local disk; on a network filesystem set GTEP_SQLITE_WAL=0 (or, better,
    run an MLflow server). A store it creates is its owner's only (gtep.config.private), and starts from
    the empty store template (seed_sqlite_store)."""
    wal = path.with_name(path.name + "-wal")  # a WAL store's pages can all be there, its main file still empty
    fresh = (not path.exists() or path.stat().st_size == 0) and not (wal.exists() and wal.stat().st_size > 0)
    private_file(path)
    if fresh:
        seed_sqlite_store(path)
    if os.environ.get("GTEP_SQLITE_WAL", "1") == "0":
        return
    import sqlite3

    connection = sqlite3.connect(path, timeout=30)
    try:
        connection.execute("PRAGMA journal_mode=WAL")
    finally:
        connection.close()



def store_template() -> Path:
    """An empty sqlite store with MLflow's tables, made once per MLflow version by MLflow itself, under
    $GTEP_CACHE (else ~/.cache/gtep), owner-only. Its Default experiment is removed: MLflow creates that when
    it opens a store without one, with the artifact location and time it would give a store it made there."""
    import sqlite3
    import tempfile

    import mlflow
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    from gtep.data.datasets import cache_root
    from gtep.orchestration.quiet import NOISE, dropping

    cache = cache_root()
    template = cache / f"mlflow-{mlflow.__version__}-empty-store.db"
    if template.exists():
        return template
    private_folder(cache)
    handle, name = tempfile.mkstemp(dir=cache, prefix=".empty-store-", suffix=".db")  # 0600, and unique: two
    os.close(handle)  # processes making the template at once each make their own and the last rename wins
    try:
        with dropping("mlflow.store.db.utils", *NOISE["mlflow.store.db.utils"]):  # the table-creation INFO lines
            store = SqlAlchemyStore(f"sqlite:///{name}", str(cache / "unused-artifacts"))
        store.engine.dispose()
        connection = sqlite3.connect(name)
        try:
            with connection:
                connection.execute("DELETE FROM experiments WHERE experiment_id = 0")
        finally:
            connection.close()
        os.replace(name, template)
    finally:
        Path(name).unlink(missing_ok=True)
    return template


def seed_sqlite_store(path: Path) -> None:
    """Fill a new, empty local store with the template's tables. MLflow creates them by running every schema
    migration since its first, some 2 s for each new output folder (a test session makes hundreds of stores);
    copying the template costs a few milliseconds and leaves the same store, Default experiment included."""
    import shutil

    shutil.copyfile(store_template(), path)  # into the empty file private_file made: it keeps its mode


def server_wait() -> float:
    """How long a phase waits for a tracking server that does not answer when it begins or ends (a server being
    restarted while a matrix runs): GTEP_TRACKING_WAIT seconds, 60 by default."""
    return float(os.environ.get("GTEP_TRACKING_WAIT", 60))


def mlflow_client(resolved: ResolvedExperiment) -> tuple[MlflowClient, str]:
    """The store and the study's experiment. A tracking server that does not answer is waited for (server_wait:
    a restart while a matrix starts its next cell or phase), then it is an error, before any compute (the CLI
    refuses a server that is down before Ray starts; once a phase runs, an outage is journaled instead)."""
    import time

    cfg = resolved.config
    uri = cfg.tracking_uri
    artifact_root = None
    if uri.startswith("sqlite:///"):
        sqlite_write_ahead_log(Path(uri[len("sqlite:///"):]))
        artifact_root = private_folder(cfg.tracking.output.resolve() / "mlartifacts")
    # the address as the resolution checked it (api.check asked a server for our credentials before any compute);
    # classified once here. A refusal (401, 403) below is final: refusal_error, no waiting for the server.
    server = is_server(uri)
    client = quiet_http_client(uri)
    deadline = time.monotonic() + (server_wait() if server else 0.0)
    while True:
        try:
            experiment_id = ensure_experiment(client, cfg.study, artifact_root)
            if server:
                check_can_write(uri, cfg.study, experiment_id)  # EDIT on the study, before Ray trains anything
            return client, experiment_id
        except ConfigError:
            raise
        except Exception as err:  # noqa: BLE001 - connection errors surface as several MLflow/requests types
            refused = refusal_error(err, uri, cfg.study)
            if refused is not None:  # the server answered: waiting would not change its mind
                raise refused from None
            if time.monotonic() >= deadline:
                raise ConfigError("--tracking-uri", f"the MLflow store at {uri} does not answer "
                                  f"({err.__class__.__name__}); start it (gtep server) or give another "
                                  "--tracking-uri") from None
            time.sleep(2.0)


def open_journal(resolved: ResolvedExperiment, paths: StudyPaths) -> TrackingJournal:
    client, experiment_id = mlflow_client(resolved)
    journal = TrackingJournal.open(paths.root, resolved.config.tracking_uri, experiment_id)
    journal.client = client
    if is_server(resolved.config.tracking_uri):
        journal.wait_seconds = server_wait()  # a forced flush (a phase's start and end) outlasts a server restart
    return journal



def finish_journal(journal: TrackingJournal, paths: StudyPaths, console: Console) -> None:
    if journal.flush(force=True):
        reason = escape(redact(str(journal.last_error)))
        console.print(f"[yellow]MLflow at {journal.state.tracking_uri} is not answering ({reason}): "
                      f"{len(journal.pending)} writes wait in {journal.journal_path}; "
                      f"run [bold]gtep sync {paths.root}[/] when it is back.[/]")



def best_from_run(resolved: ResolvedExperiment, tuning_run_id: str) -> dict[str, Any]:
    """H* from the best.yaml artifact of a tuning phase run in the tracking store (nothing is written)."""
    import tempfile

    uri = resolved.config.tracking_uri
    if uri.startswith("sqlite:///") and not Path(uri[len("sqlite:///"):]).exists():
        raise ConfigError("--tuning-run", f"there is no MLflow store at {uri}; pass --output or --tracking-uri "
                          "of the study that ran gtep tune")
    client = MlflowClient(tracking_uri=uri)
    with tempfile.TemporaryDirectory() as scratch:
        try:
            client.get_run(tuning_run_id)
            local = client.download_artifacts(tuning_run_id, "best.yaml", scratch)
        except Exception as err:  # noqa: BLE001 - MLflow raises several types for a missing run or artifact
            raise ConfigError("--tuning-run", f"cannot read best.yaml of run {tuning_run_id} in {uri} "
                              f"({err.__class__.__name__}); give the run id of a tuning phase run") from None
        return read_best(Path(local))
