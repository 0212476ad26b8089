"""gtep ui | server | sync: the MLflow side, a UI over a store, a tracking server, writes a study could not make.

`ui` and `server` run MLflow's own commands in a subprocess (so nothing here imports MLflow)."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple, Optional

import typer

from gtep.cli.common import UriOpt, console, fail, output_folder, run_guarded
from gtep.config import ConfigError, check_port, check_store_file
from gtep.config.private import private_folder
from gtep.config.uris import check_no_userinfo, has_password, redact_uri

app = typer.Typer()


@app.command()
def ui(output: Path = typer.Option(Path("gtep-runs"), "--output", parser=output_folder, metavar="<path>",
                                   help="the --output folder of the runs"),
       tracking_uri: Optional[str] = UriOpt, host: str = typer.Option("127.0.0.1", help="bind address"),
       port: int = typer.Option(5000, help="port"),
       study: Optional[str] = typer.Option(None, "--study", help="print the links of this study only"),
       workers: int = typer.Option(1, help="server worker processes (one is plenty for one user)"),
       insecure: bool = typer.Option(False, "--insecure", help="listen beyond this machine: the UI has no login "
                                     "and writes the store, so only where every machine that reaches the port is "
                                     "trusted")) -> None:
    """Open the MLflow UI over the runs' store and print each study's runs table.

    The UI listens on 127.0.0.1 unless --host says otherwise; as for gtep server, beyond this machine only with
    --insecure (the UI has no authentication: a team shares gtep server --auth). Each study's table puts its phase runs'
    Acc/AvgAcc/HM side by side, and its orderings are charted by phase."""
    uri = tracking_uri or f"sqlite:///{output.resolve()}/mlflow.db"

    def refuse() -> None:  # before anything repeats the address or starts: the address rule, the bind rule
        check_no_userinfo(uri, "--tracking-uri")
        check_bind(host, False, insecure, "ui")

    run_guarded(refuse)
    if uri.startswith("sqlite:///") and not Path(uri[len("sqlite:///"):]).exists():
        fail(f"--output: no MLflow store at {uri[len('sqlite:///'):]}; run gtep run first or pass --output")

    found: list[tuple[str, dict[str, str]]] = []

    def links() -> None:
        from gtep.orchestration.quiet import quiet_libraries
        from gtep.orchestration.tracking import prepare_ui, ui_routes

        check_port(port)
        check_ui_store(uri, "--tracking-uri" if tracking_uri else "--output")
        with quiet_libraries():  # MLflow's "Creating initial MLflow database tables" over a new store
            studies = prepare_ui(uri, study)
        if study is not None and not studies:
            raise ConfigError("--study", f"{uri} has no study {study!r}")
        found.extend((name, ui_routes(experiment_id)) for name, experiment_id in studies)

    run_guarded(links)
    log = ui_log(uri)
    root = f"http://{'127.0.0.1' if host in ('0.0.0.0', '::') else host}:{port}/"
    console.print(f"MLflow UI on {root} over {uri} (Ctrl-C stops it; the server's own lines go to {log})",
                  soft_wrap=True, highlight=False)
    for name, routes in found:
        console.print(f"  {name}: runs  {root}{routes['runs']}", soft_wrap=True, highlight=False)
        console.print(f"  {' ' * len(name)}  orderings by phase  {root}{routes['orderings']}", soft_wrap=True,
                      highlight=False)
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    cmd = [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", uri, "--host", host, "--port", str(port),
           "--workers", str(workers)]
    served = serve(cmd, env, log=log)
    if served.stopped:
        console.print("MLflow UI stopped", highlight=False)
        raise typer.Exit(0)
    # it ended of itself, whatever its exit code (a port in use ends it with 0): the terminal never saw why
    fail(f"--port: the MLflow UI ended (exit code {served.code}) saying {last_error(log)!r}: if the port is taken, "
         f"give another --port (the server's whole log: {log})")


UI_LOG = "mlflow-ui.log"


def ui_log(uri: str) -> Path:
    """Where gtep ui's server writes its start-up notices and request lines (MLflow's, Starlette's, Uvicorn's): beside
    a sqlite store, else in gtep's cache folder; the terminal keeps gtep's own lines."""
    if uri.startswith("sqlite:///"):
        return Path(uri[len("sqlite:///"):]).resolve().parent / UI_LOG
    from gtep.data.datasets import cache_root

    return cache_root() / "logs" / UI_LOG


def open_log(path: Path) -> int:
    """The server's log, appended to and its owner's only (its lines name the store and every request); a file
    descriptor for the server's stdout and stderr."""
    private_folder(path.parent)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.fchmod(fd, 0o600)  # a log made before, or under another umask
    return fd


def last_error(path: Path) -> str:
    """What the server said as it ended (a port in use, a store it cannot open): the log's last line naming an
    error, else its last line."""
    try:
        lines = [line.strip() for line in path.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return ""
    errors = [line for line in lines if "error" in line.lower()]
    return (errors or lines or [""])[-1]


def check_ui_store(uri: str, option: str) -> None:
    """The store answers before the UI starts: a server is asked once with a short timeout (MLflow's client would
    retry for minutes with no output), a sqlite file must be a database (else MLflow's traceback)."""
    from gtep.orchestration.tracking_store import check_tracking

    check_tracking(uri)  # the scheme, and an http(s) server's /health within 5 s
    if uri.startswith("sqlite:///"):
        check_store_file(Path(uri[len("sqlite:///"):]), option)


class Served(NamedTuple):
    code: int  # 0 when stopped by a signal, else the server's own exit code
    stopped: bool  # whether a signal to gtep stopped it (else it ended of itself)


def serve(cmd: list[str], env: dict[str, str], private: bool = False, log: Path | None = None) -> Served:
    """Run a server in its own process group and stop the whole group (MLflow's server and its workers) on
    SIGINT/SIGTERM/SIGHUP, so that Ctrl-C or `kill <pid of gtep ui>` stops what it started. `private`: what the
    server creates (run and users databases, artifact folders) is its owner's only (umask 077). `log`: the
    server's stdout and stderr go there, not to the terminal."""
    import signal

    output = open_log(log) if log is not None else None
    if output is not None:
        os.write(output, f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(cmd)}\n".encode())
    try:
        proc = subprocess.Popen(cmd, env=env, start_new_session=True, umask=0o077 if private else -1,
                                stdout=output, stderr=subprocess.STDOUT if output is not None else None)
    finally:
        if output is not None:
            os.close(output)
    stopped = False

    def forward(signum, frame) -> None:
        # SIGTERM whatever came: on SIGINT MLflow's launcher dies in a KeyboardInterrupt traceback and uvicorn in a
        # CancelledError one (1 stop in 2), on SIGTERM both stop quietly
        nonlocal stopped
        stopped = True
        try:
            os.killpg(proc.pid, signal.SIGTERM)
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
    return Served(0 if stopped or code in (-signal.SIGINT, -signal.SIGTERM, -signal.SIGHUP) else code, stopped)


STORE_URI_VARIABLE = "GTEP_BACKEND_STORE_URI"  # gtep server's --backend-store-uri, kept out of the command line
MLFLOW_STORE_VARIABLE = "MLFLOW_BACKEND_STORE_URI"  # what `mlflow server --backend-store-uri` reads instead


def mlflow_server_command(backend_store_uri: str, artifacts_destination: str, host: str, port: int,
                          workers: int, auth: bool = False) -> list[str]:
    """The `mlflow server` line `gtep server` runs (README shows it for use without gtep). No secret is ever on
    it: a command line is in every process listing. A store address with a password goes to MLflow in its
    environment instead (mlflow_server_environment), which only its owner can read (/proc/PID/environ)."""
    store = [] if has_password(backend_store_uri) else ["--backend-store-uri", backend_store_uri]
    return [sys.executable, "-m", "mlflow", "server", *store,
            "--artifacts-destination", artifacts_destination, "--serve-artifacts",
            "--host", host, "--port", str(port), "--workers", str(workers),
            *(["--app-name", "basic-auth"] if auth else [])]


def mlflow_server_environment(backend_store_uri: str, environ: dict[str, str]) -> dict[str, str]:
    """The server's environment: the store address there when the command line leaves it out (a password)."""
    env = {**environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    env.pop(STORE_URI_VARIABLE, None)
    if has_password(backend_store_uri):
        env[MLFLOW_STORE_VARIABLE] = backend_store_uri
    else:
        env.pop(MLFLOW_STORE_VARIABLE, None)
    return env


def check_store_uri_source(backend_store_uri: str, typed: bool) -> None:
    """A database password typed on the command line is in gtep's arguments (and the shell's history), where every
    local user reads it with ps: refused, with the two ways that keep it out."""
    if typed and has_password(backend_store_uri):
        raise ConfigError("--backend-store-uri", f"{redact_uri(backend_store_uri)} puts the database password on the "
                          "command line, where every local user reads it (ps): give the address in "
                          f"{STORE_URI_VARIABLE} instead (read -rs GTEP_BACKEND_STORE_URI && export "
                          "GTEP_BACKEND_STORE_URI), or leave the password out of it and keep it in PGPASSWORD or "
                          "~/.pgpass")


def is_loopback(host: str) -> bool:
    """127.0.0.0/8, ::1 or localhost: only this machine can reach the port. A host name other than localhost
    counts as reachable from the network (it names an interface that is)."""
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_bind(host: str, auth: bool, insecure: bool, command: str = "server") -> None:
    """The one bind rule of every server gtep starts (`gtep server`, `gtep ui`): one without authentication lets
    whoever reaches its port read, overwrite and delete every study, so it listens beyond this machine only with
    --auth (gtep server), or --insecure where the network itself is trusted."""
    if auth or insecure or is_loopback(host):
        return
    fix = ("add --auth (users and permissions: gtep users)" if command == "server" else
           "share the store through gtep server --auth instead (users and permissions: gtep users)")
    raise ConfigError("--host", f"{host} opens the {command} to the network without authentication: {fix}, or "
                      "--insecure if only trusted machines can reach it")


AUTH_PERMISSIONS = ("READ", "NO_PERMISSIONS")
AUTH_CACHE_SECONDS = 60
AUTH_MLFLOW = (3, 17)  # the first MLflow whose auth app takes the admin password from MLFLOW_AUTH_ADMIN_PASSWORD


def auth_folder(backend_store_uri: str, artifacts_destination: str) -> Path:
    """Where `gtep server --auth` keeps its auth config and users database: beside a sqlite store, else beside
    a local artifacts folder, else ./gtep-server."""
    if backend_store_uri.startswith("sqlite:///"):
        return Path(backend_store_uri[len("sqlite:///"):]).resolve().parent
    if "://" not in artifacts_destination:
        return Path(artifacts_destination).resolve().parent
    return Path("gtep-server").resolve()


def check_auth_config(path: Path) -> bool:
    """MLflow's auth INI given with --auth-config: readable, its [mlflow] keys there, private if it holds the
    admin password. True when it holds one."""
    import configparser

    parser = configparser.ConfigParser()
    try:
        parser.read_string(path.read_text())
    except (OSError, UnicodeDecodeError, configparser.Error) as err:
        raise ConfigError("--auth-config", f"cannot read {path} as MLflow's auth INI ({err.__class__.__name__})"
                          ) from None
    missing = [key for key in ("default_permission", "database_uri")
               if "mlflow" not in parser or not parser["mlflow"].get(key)]
    if missing:
        raise ConfigError("--auth-config", f"{path} needs {', '.join(missing)} in its [mlflow] section "
                          "(docs/cluster.md shows one)")
    has_password = bool(parser["mlflow"].get("admin_password"))
    if has_password and path.stat().st_mode & 0o077:
        raise ConfigError("--auth-config", f"{path} holds the admin password and others may read it: chmod 600 {path}")
    return has_password


def auth_environment(backend_store_uri: str, artifacts_destination: str, auth_config: Optional[Path],
                     default_permission: str, environ: dict[str, str]) -> dict[str, str]:
    """The variables MLflow's basic-auth app reads, for the server's process only: its config file (written
    here, 0600, unless --auth-config names one), the admin password checked to be there for a new users
    database, a CSRF key shared by the server's workers."""
    import importlib.util
    import secrets
    from importlib.metadata import version

    if importlib.util.find_spec("flask_wtf") is None:
        raise ConfigError("--auth", "MLflow's basic-auth app needs its extra: pip install 'gtep[server]'")
    if tuple(int(part) for part in version("mlflow").split(".")[:2]) < AUTH_MLFLOW:
        raise ConfigError("--auth", f"needs MLflow {'.'.join(map(str, AUTH_MLFLOW))} or later (installed: "
                          f"{version('mlflow')}): pip install -U 'gtep[server]'")
    if default_permission not in AUTH_PERMISSIONS:
        raise ConfigError("--default-permission", f"{default_permission!r} is not one of {list(AUTH_PERMISSIONS)}")
    env = {"MLFLOW_FLASK_SERVER_SECRET_KEY": environ.get("MLFLOW_FLASK_SERVER_SECRET_KEY") or secrets.token_hex(32)}
    if auth_config is not None:
        file_password = check_auth_config(auth_config)
        env["MLFLOW_AUTH_CONFIG_PATH"] = str(auth_config.resolve())
        new_database = False if file_password else None  # None: MLflow says itself if the password is missing
    else:
        folder = auth_folder(backend_store_uri, artifacts_destination)
        database = environ.get("GTEP_AUTH_DATABASE_URI") or f"sqlite:///{folder / 'basic_auth.db'}"
        new_database = database.startswith("sqlite:///") and not Path(database[len("sqlite:///"):]).exists()
    if new_database and not environ.get("MLFLOW_AUTH_ADMIN_PASSWORD"):
        raise ConfigError("MLFLOW_AUTH_ADMIN_PASSWORD", "a new users database needs its admin: export "
                          "MLFLOW_AUTH_ADMIN_PASSWORD (and MLFLOW_AUTH_ADMIN_USERNAME, default admin) for the "
                          "server's first start, or give admin_password in a private --auth-config file")
    if auth_config is None:  # written once every check passed: a refused start leaves nothing behind
        env["MLFLOW_AUTH_CONFIG_PATH"] = str(write_auth_config(folder, database, default_permission))
    return env


def write_auth_config(folder: Path, database_uri: str, default_permission: str) -> Path:
    """MLflow's auth INI without the admin password (MLflow takes it from MLFLOW_AUTH_ADMIN_PASSWORD), private
    all the same: GTEP_AUTH_DATABASE_URI may carry a database password."""
    private_folder(folder)
    path = folder / "basic_auth.ini"
    path.touch(mode=0o600, exist_ok=True)
    path.chmod(0o600)
    path.write_text("[mlflow]\n"
                    f"default_permission = {default_permission}\n"
                    f"database_uri = {database_uri}\n"
                    "admin_username = admin\n"
                    "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n"
                    # MLflow checks the password's hash (werkzeug's scrypt) on every request, a study's writes included;
                    # a credential that passed is trusted for a minute (a password changed through
                    # gtep users is dropped at once by the worker that changed it, by the others within it)
                    f"auth_cache_ttl_seconds = {AUTH_CACHE_SECONDS}\n")
    return path


@app.command()
def server(ctx: typer.Context,
           backend_store_uri: str = typer.Option("sqlite:///gtep-server/mlflow.db", "--backend-store-uri",
                                                 envvar=STORE_URI_VARIABLE, show_envvar=True,
                                                 help="the run store; postgresql://user@host:5432/db for a shared "
                                                      "server (its password in PGPASSWORD or ~/.pgpass). An address "
                                                      f"with a password only from {STORE_URI_VARIABLE}: on the command "
                                                      "line it is refused (every local user reads it with ps)"),
           artifacts_destination: str = typer.Option("gtep-server/mlartifacts", "--artifacts-destination",
                                                     help="a folder, s3://... or gs://... for run artifacts"),
           host: str = typer.Option("127.0.0.1", help="bind address; beyond 127.0.0.1 only with --auth or "
                                                  "--insecure"),
           port: int = typer.Option(5000, help="port"),
           workers: int = typer.Option(2, help="server worker processes"),
           auth: bool = typer.Option(False, "--auth", help="users and permissions (MLflow's basic-auth app): the "
                                     "admin from MLFLOW_AUTH_ADMIN_USERNAME/MLFLOW_AUTH_ADMIN_PASSWORD"),
           auth_config: Optional[Path] = typer.Option(None, "--auth-config", metavar="<path>",
                                                      help="MLflow's auth INI file, instead of the one gtep "
                                                           "writes"),
           default_permission: str = typer.Option("READ", "--default-permission",
                                                  help="with --auth: what a user may do on others' studies, READ "
                                                       "or NO_PERMISSIONS"),
           insecure: bool = typer.Option(False, "--insecure", help="listen beyond this machine without --auth: "
                                         "only where every machine that reaches the port is trusted")) -> None:
    """Start an MLflow tracking server for studies on a cluster.

    Studies log to it with --tracking-uri http://HOST:PORT. With --auth every request needs a user's
    credentials (MLFLOW_TRACKING_USERNAME/MLFLOW_TRACKING_PASSWORD or ~/.mlflow/credentials); gtep users adds
    users and grants them READ, EDIT or MANAGE on a study. The store and artifact folders it makes here are
    its owner's only (0700, files 0600)."""
    source = ctx.get_parameter_source("backend_store_uri")
    typed = getattr(source, "name", "") == "COMMANDLINE"  # typed, not from GTEP_BACKEND_STORE_URI or the default

    def go():
        import importlib.util

        # every check first: a refused option leaves nothing behind
        check_store_uri_source(backend_store_uri, typed)
        check_port(port)
        check_bind(host, auth, insecure)
        if workers < 1:
            raise ConfigError("--workers", f"{workers} worker processes: give 1 or more")
        if auth_config is not None and not auth:
            raise ConfigError("--auth-config", "applies with --auth: add --auth")
        scheme = backend_store_uri.split(":", 1)[0].lower()
        driver = "psycopg2" if scheme == "postgresql+psycopg2" else "psycopg"
        if scheme.startswith("postgresql") and importlib.util.find_spec(driver) is None:
            raise ConfigError("--backend-store-uri",
                              f"PostgreSQL needs its driver {driver}: pip install 'gtep[server]'")
        check_no_userinfo(artifacts_destination, "--artifacts-destination")
        env = mlflow_server_environment(backend_store_uri, dict(os.environ))
        if auth:
            env.update(auth_environment(backend_store_uri, artifacts_destination, auth_config, default_permission,
                                        env))
        if scheme == "sqlite":
            store = Path(backend_store_uri[len("sqlite:///"):])
            private_folder(store.parent)  # the database itself: created by the server, under its umask 077
        if "://" not in artifacts_destination:
            private_folder(Path(artifacts_destination))
        who = "users of gtep users" if auth else "no authentication"
        console.print(f"MLflow tracking server on http://{host}:{port} ({who}; store "
                      f"{redact_uri(backend_store_uri)}, artifacts {artifacts_destination}); Ctrl-C stops it",
                      highlight=False, soft_wrap=True)
        cmd = mlflow_server_command(backend_store_uri, artifacts_destination, host, port, workers, auth)
        raise typer.Exit(serve(cmd, env, private=True).code)
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
