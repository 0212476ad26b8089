"""A study as a Ray Job: `gtep submit` sends the config to a cluster's Jobs API, `gtep jobs` follows it.

The job's entrypoint is the same `gtep tune|evaluate|run` a user would type on the head node; its working
directory holds the config (and a local search-space file, if the config names one), so nothing on the
cluster needs to be prepared by hand beyond an installed gtep and the data roots the config names.
"""
from __future__ import annotations

import shlex
import shutil
import socket
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator
from urllib.parse import urlparse

from gtep.config import ConfigError, load_config
from gtep.config.uris import check_no_userinfo

SUBMITTED_COMMANDS = ("tune", "evaluate", "run")  # what `gtep submit --phase` runs: gtep commands, not phases
FINAL = {"SUCCEEDED", "FAILED", "STOPPED"}
JOB_ENV = {"RAY_CHDIR_TO_TRIAL_DIR": "0", "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", "PYTHONUNBUFFERED": "1"}


def dashboard_address(address: str | None) -> str:
    """http://host:8265, answering; a clear error before anything is uploaded."""
    address = address or "http://127.0.0.1:8265"
    if "://" not in address:
        address = f"http://{address}"
    parsed = urlparse(address)
    if parsed.scheme not in ("http", "https") or not parsed.hostname or not parsed.port:
        raise ConfigError("--address", f"{address!r} is not the dashboard address of a Ray cluster (http://HEAD:8265)")
    try:
        with socket.create_connection((parsed.hostname, parsed.port), timeout=3):
            pass
    except OSError as err:
        raise ConfigError("--address", f"no Ray dashboard answers at {address} ({err.strerror or err}); start the head "
                          "with its dashboard (ray start --head) or forward its port (ray dashboard cluster.yaml)"
                          ) from None
    return address


def client(address: str | None):
    from ray.job_submission import JobSubmissionClient

    return JobSubmissionClient(dashboard_address(address))


@dataclass
class Submission:
    job_id: str
    entrypoint: str
    address: str


def package(config: Path, workdir: Path) -> str:
    """Copy the config (validated here, before anything is sent) and a local search-space file into workdir."""
    cfg = load_config(config)
    shutil.copyfile(config, workdir / "exp.yaml")
    space = cfg.search.space
    if space is not None and not Path(space).is_absolute() and (config.parent / space).exists():
        target = workdir / space
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(config.parent / space, target)
    return "exp.yaml"


def submit(address: str | None, config: Path, phase: str, extra_args: list[str]) -> Submission:
    if phase not in SUBMITTED_COMMANDS:
        raise ConfigError("--phase", f"{phase!r} is not one of {list(SUBMITTED_COMMANDS)}")
    load_config(config)  # a bad config is refused here, before the cluster is asked anything
    refuse_secret_addresses(extra_args)  # the entrypoint is shown to everyone who opens the dashboard
    jobs = client(address)
    with tempfile.TemporaryDirectory(prefix="gtep-job-") as workdir:
        name = package(config, Path(workdir))
        entrypoint = shlex.join(["gtep", phase, "--config", name, *extra_args])
        job_id = _submit_when_ready(jobs, entrypoint=entrypoint,
                                    runtime_env={"working_dir": workdir, "env_vars": JOB_ENV},
                                    metadata={"gtep.phase": phase, "gtep.config": str(config)})
    return Submission(job_id, entrypoint, jobs.get_address())


def refuse_secret_addresses(args: list[str]) -> None:
    """A --tracking-uri for the phase command with a password in it (gtep.config.uris' rule), refused here: the
    job's entrypoint, which carries it, is stored by Ray and shown in its dashboard and `ray job list`."""
    for index, arg in enumerate(args):
        if arg == "--tracking-uri" and index + 1 < len(args):
            check_no_userinfo(args[index + 1], "--tracking-uri")
        elif arg.startswith("--tracking-uri="):
            check_no_userinfo(arg.split("=", 1)[1], "--tracking-uri")


def _submit_when_ready(jobs, wait_seconds: float = 90, **job) -> str:
    """A head that has just started answers 'No available agent' until its job agent is up: wait for it."""
    deadline = time.monotonic() + wait_seconds
    while True:
        try:
            return jobs.submit_job(**job)
        except RuntimeError as err:
            if "No available agent" not in str(err) or time.monotonic() > deadline:
                raise
            time.sleep(2)


def status(address: str | None, job_id: str) -> str:
    return str(client(address).get_job_status(job_id).value)


def wait(address: str | None, job_id: str, timeout: float | None = None, poll: float = 2.0) -> str:
    jobs = client(address)
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        state = str(jobs.get_job_status(job_id).value)
        if state in FINAL or (deadline is not None and time.monotonic() > deadline):
            return state
        time.sleep(poll)


def logs(address: str | None, job_id: str) -> str:
    return client(address).get_job_logs(job_id)


def follow(address: str | None, job_id: str, poll: float = 2.0) -> Iterator[str]:
    """New log text as it appears, until the job ends."""
    jobs = client(address)
    seen = 0
    while True:
        text = jobs.get_job_logs(job_id)
        if len(text) > seen:
            yield text[seen:]
            seen = len(text)
        if str(jobs.get_job_status(job_id).value) in FINAL:
            text = jobs.get_job_logs(job_id)
            if len(text) > seen:
                yield text[seen:]
            return
        time.sleep(poll)


def stop(address: str | None, job_id: str) -> bool:
    return bool(client(address).stop_job(job_id))


def listing(address: str | None) -> list[dict[str, str]]:
    return [{"id": j.submission_id or j.job_id or "", "status": str(j.status.value), "entrypoint": j.entrypoint,
             "start": time.strftime("%Y-%m-%d %H:%M", time.localtime((j.start_time or 0) / 1000))}
            for j in client(address).list_jobs()]


# ---------------------------------------------------------------- --address ray://host:10001

def _run_on_head(argv: list[str], config_text: str | None) -> tuple[int, str]:
    """Inside the cluster: the same gtep command, driving the cluster this task runs in."""
    import os
    import subprocess
    import sys

    import ray

    with tempfile.TemporaryDirectory(prefix="gtep-client-") as scratch:
        if config_text is not None:
            config = Path(scratch) / "exp.yaml"
            config.write_text(config_text)
            argv = [str(config) if a == "@config" else a for a in argv]
        gcs = ray.get_runtime_context().gcs_address
        env = {**os.environ, **JOB_ENV}
        done = subprocess.run([sys.executable, "-m", "gtep.cli", *argv, "--address", gcs], env=env,
                              capture_output=True, text=True)
    return done.returncode, done.stdout + done.stderr


CLIENT_CONNECT_ATTEMPTS = 3


def connect_client(connect: Callable[[], object], attempts: int = CLIENT_CONNECT_ATTEMPTS,
                   pause_s: float = 5.0) -> None:
    """Connect through Ray's client proxy, again when its per-client server fails to start.

    The proxy starts a server process for every connection; on a loaded head that start can fail or time out
    ("Starting Ray client server failed", "Proxy failed to Connect to backend") although the cluster is fine,
    and a new connection gets a new server on the next port. Nothing has run on the cluster before the
    connection exists, so trying again is safe. Other errors (no proxy at that address) are raised at once."""
    for attempt in range(1, attempts + 1):
        try:
            connect()
            return
        except ConnectionAbortedError as err:
            if attempt == attempts or not _client_server_start_failed(err):
                raise
            time.sleep(pause_s)


def _client_server_start_failed(err: BaseException) -> bool:
    text = str(err)
    return "Starting Ray client server failed" in text or "Proxy failed to Connect" in text


def run_through_client(address: str, argv: list[str], config: Path | None) -> tuple[int, str]:
    """`gtep tune|evaluate|run --address ray://HEAD:10001`: the driver runs on the head node, as a task
    pinned there, so the Tune callbacks, the journal and the study folder live on the cluster. Paths in
    argv are taken as they are on the cluster (a shared filesystem), the config file travels with the call."""
    import ray

    text = config.read_text() if config is not None else None
    # Ray annotates logging_level as int, but its own default is a name ("info") and setup_logger converts names
    connect_client(lambda: ray.init(address=address, logging_level="ERROR"))  # type: ignore[arg-type]
    try:
        task = ray.remote(num_cpus=0, resources={"node:__internal_head__": 0.001}, max_retries=0)(_run_on_head)
        return ray.get(task.remote(argv, text))
    finally:
        ray.shutdown()
