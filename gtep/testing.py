"""Local processes for tests, benchmarks and plugin authors: a Ray cluster of several nodes on 127.0.0.1, a `gtep
server`, free ports, waiting on them and ending what was started (as `ray.cluster_utils` or `numpy.testing`).

Everything here runs in subprocesses (`ray start`, `gtep server`, a Python that asks Ray for its nodes), so this
module imports neither Ray nor MLflow: it drives gtep from outside, as a user's shell does. Every process it starts
is in a session of its own, and stop() ends those sessions whole, and nothing else.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Callable, Sequence, TypeVar

T = TypeVar("T")

# Settings every local run wants: no Ray token auth, no MLflow job runners, no hub downloads, Ray Tune's trials in
# the working directory they were started in, output as it is written.
QUIET = {"RAY_AUTH_MODE": "disabled", "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", "RAY_CHDIR_TO_TRIAL_DIR": "0",
         "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}


def environment(**extra: str) -> dict[str, str]:
    """This process's environment with QUIET and `extra`, and this Python's bin folder first on PATH, as on a node
    where gtep is installed: Ray Jobs run `gtep ...` from the PATH."""
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    return {**os.environ, **QUIET, "PATH": path, **extra}


def plugin_environment(modules: str, folder: Path, **extra: str) -> dict[str, str]:
    """environment() in which the driver and (through `ray start`) every node's workers import the plugin `modules`
    (comma-separated) from `folder`: GTEP_PLUGINS and PYTHONPATH extended, for learners that live outside gtep."""
    plugins = ",".join(filter(None, [os.environ.get("GTEP_PLUGINS", ""), modules]))
    path = os.pathsep.join(filter(None, [str(folder), os.environ.get("PYTHONPATH", "")]))
    return environment(GTEP_PLUGINS=plugins, PYTHONPATH=path, **extra)


def gtep_command(*args: str) -> list[str]:
    """The gtep command line as this Python runs it (no console script needed)."""
    return [sys.executable, "-m", "gtep.cli", *args]


_HANDED_OUT: set[int] = set()


def free_port() -> int:
    """A free port on 127.0.0.1 that this process has not handed out before: once a probe socket is closed the OS
    may give the same port to the next probe, and two agents of one Ray node then collide ('runtime_env_agent is
    trying to use a port number ... that is used by other components', seen in a clean-clone cluster run)."""
    while True:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port


def wait_for(predicate: Callable[[], T], timeout: float, what: str, interval: float = 0.5) -> T:
    """The predicate's first true value, asked every `interval` seconds; TimeoutError naming `what` after
    `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")


def http_ok(url: str, timeout: float = 2) -> bool:
    """Whether `url` answers 200 now (a server's /health, say)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status == 200
    except OSError:
        return False


def session_of(pid: int) -> int | None:
    """The session id of a process (field 6 of /proc/PID/stat), None once it is gone."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[4])
    except (OSError, IndexError, ValueError):
        return None


def end_processes(sessions: Sequence[int], markers: Sequence[str] = ()) -> None:
    """SIGKILL every process of the given sessions (each started here with start_new_session) and any process
    whose command line names one of `markers` (a temp dir made here): only what the caller started."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        pid = int(entry.name)
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if session_of(pid) in sessions or any(marker in cmdline for marker in markers):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


def kill_group(process: subprocess.Popen, sig: int = signal.SIGKILL, timeout: float = 60) -> None:
    """`sig` to the process group of a process started with start_new_session, then wait for it."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, sig)
    process.wait(timeout=timeout)


def ray_query(address: str, expression: str, env: dict[str, str], timeout: float = 180) -> object | None:
    """The JSON value of a Python `expression` over `ray` (ray.nodes(), ray.cluster_resources(), ...) evaluated in a
    fresh Python connected to the cluster at `address`; None when it could not connect."""
    script = f"import json, ray; ray.init(address={address!r}, logging_level='ERROR'); print(json.dumps({expression}))"
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0 or not done.stdout.strip():
        return None
    return json.loads(done.stdout.strip().splitlines()[-1])


class MlflowServer:
    """`gtep server` on 127.0.0.1, its logs in `root`; stop() then start() on the same port and store is an outage.
    Subclasses change arguments() or environment() (an authenticated server, say)."""

    def __init__(self, root: Path, backend_store_uri: str | None = None, *, artifacts: Path | None = None,
                 env: dict[str, str] | None = None, workers: int = 1) -> None:
        self.root, self.workers = root, workers
        self.backend = backend_store_uri or f"sqlite:///{root / 'server.db'}"
        self.artifacts = artifacts or root / "artifacts"
        self.env = environment() if env is None else env
        self.port = free_port()
        self.process: subprocess.Popen | None = None
        self.starts = 0

    @property
    def uri(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def arguments(self) -> list[str]:
        return ["--backend-store-uri", self.backend, "--artifacts-destination", str(self.artifacts),
                "--port", str(self.port), "--workers", str(self.workers)]

    def environment(self) -> dict[str, str]:
        return self.env

    def start(self, timeout: float = 180) -> "MlflowServer":
        self.starts += 1
        log = self.root / f"server-{self.starts}.log"
        process = subprocess.Popen(gtep_command("server", *self.arguments()), env=self.environment(),
                                   stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)
        self.process = process
        wait_for(lambda: self.healthy() or process.poll() is not None, timeout, f"the MLflow server ({log})")
        if not self.healthy():
            raise RuntimeError(f"the MLflow server did not start:\n{log.read_text()[-3000:]}")
        return self

    def healthy(self) -> bool:
        return http_ok(f"{self.uri}/health")

    def stop(self) -> None:
        """SIGTERM to the server's process group, then SIGKILL to whatever of its session is left."""
        if self.process is None:
            return
        with contextlib.suppress(subprocess.TimeoutExpired):
            kill_group(self.process, signal.SIGTERM, timeout=30)
        end_processes([self.process.pid])
        self.process.wait(timeout=30)
        self.process = None


class RayCluster:
    """A head and `nodes - 1` worker nodes on 127.0.0.1, started by `ray start`, each with its own CPUs, temp dir
    and agent ports, and `gpus_per_node` GPUs it declares (whether it has them or not: a simulated GPU cluster).
    `env` reaches every node's workers (GTEP_PLUGINS and PYTHONPATH for a plugin's learners, say)."""

    def __init__(self, cpus_per_node: int = 1, *, nodes: int = 2, gpus_per_node: int = 0,
                 env: dict[str, str] | None = None, dashboard: bool = False) -> None:
        self.cpus, self.nodes, self.gpus = cpus_per_node, nodes, gpus_per_node
        self.env = environment() if env is None else env
        self.port, self.client_port = free_port(), free_port()
        self.dashboard_port = free_port() if dashboard else None
        # a folder of its own per node, its name short: Ray's socket paths must stay under 108 characters
        self.temp_dirs = [Path(tempfile.mkdtemp(prefix="gtep-ray-")) for _ in range(nodes)]
        self.sessions: list[int] = []  # one per node: the session of its `ray start` and all it leaves running

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def dashboard(self) -> str:
        assert self.dashboard_port is not None, "RayCluster(dashboard=True) starts the dashboard"
        return f"http://127.0.0.1:{self.dashboard_port}"

    def _ray(self, *args: str) -> None:
        """`ray start` in a session of its own: every process it leaves running (GCS, raylet, agents, client
        servers) stays in that session, which stop() ends whole. Ray's CLI as a module: an install without its
        console script (a wheel unpacked with --target) has it too."""
        process = subprocess.Popen([sys.executable, "-m", "ray.scripts.scripts", *args], env=self.env, text=True,
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
        self.sessions.append(process.pid)  # the session id of everything it starts
        output, _ = process.communicate(timeout=300)
        if process.returncode != 0:
            raise RuntimeError(f"ray {' '.join(args[:2])} failed:\n{output[-3000:]}")

    def _node(self, index: int) -> list[str]:
        """One node's options. Nodes on one host must not share their agents' ports (as two Ray jobs on a SLURM
        node)."""
        return [f"--temp-dir={self.temp_dirs[index]}", "--node-ip-address=127.0.0.1", f"--num-cpus={self.cpus}",
                f"--num-gpus={self.gpus}", "--disable-usage-stats",
                f"--dashboard-agent-listen-port={free_port()}", f"--dashboard-agent-grpc-port={free_port()}",
                f"--metrics-export-port={free_port()}", f"--runtime-env-agent-port={free_port()}"]

    def start(self, timeout: float = 300) -> "RayCluster":
        dashboard = (["--include-dashboard=true", "--dashboard-host=127.0.0.1",
                      f"--dashboard-port={self.dashboard_port}"] if self.dashboard_port else
                     ["--include-dashboard=false"])
        self._ray("start", "--head", f"--port={self.port}", f"--ray-client-server-port={self.client_port}",
                  *dashboard, *self._node(0))
        for index in range(1, self.nodes):
            self._ray("start", f"--address={self.address}", *self._node(index))
        wait_for(lambda: len(self.node_ids()) == self.nodes, timeout, f"all {self.nodes} Ray nodes", interval=1)
        return self

    def node_ids(self) -> list[str]:
        """The Ray ids of the nodes alive ([] while Ray cannot be reached)."""
        nodes = ray_query(self.address, "[n['NodeID'] for n in ray.nodes() if n['Alive']]", self.env)
        return list(nodes) if isinstance(nodes, list) else []

    def resources(self) -> dict[str, float]:
        """ray.cluster_resources(): CPU, GPU, memory, ... ({} while Ray cannot be reached)."""
        resources = ray_query(self.address, "ray.cluster_resources()", self.env)
        return dict(resources) if isinstance(resources, dict) else {}

    def worker_node_id(self, index: int = 1) -> str:
        """A worker node's Ray id: the node whose raylet socket lies in that node's temp dir."""
        nodes = ray_query(self.address, "[(n['NodeID'], n['RayletSocketName']) for n in ray.nodes() if n['Alive']]",
                          self.env)
        assert isinstance(nodes, list), f"Ray at {self.address} did not answer"
        node, = [node for node, raylet in nodes if raylet.startswith(str(self.temp_dirs[index]))]
        return node

    def worker_processes(self, index: int = 1) -> list[int]:
        """A node's processes: those of the session its `ray start` made (raylet, agents, the Ray workers running
        trials) and any naming its temp dir."""
        listing = subprocess.run(["ps", "-eo", "pid=,sid=,args="], capture_output=True, text=True).stdout
        found = []
        for line in listing.splitlines():
            pid, sid, args = (line.split(None, 2) + [""])[:3]
            if int(sid) == self.sessions[index] or str(self.temp_dirs[index]) in args:
                found.append(int(pid))
        return found

    def kill_worker(self, index: int = 1) -> None:
        """SIGKILL every process of a worker node at once, as a preempted machine goes."""
        for pid in self.worker_processes(index):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        wait_for(lambda: not self.worker_processes(index), 30, "the worker node's processes to end")

    def stop(self) -> None:
        """Every node's processes ended (by their session, and by their temp dir), and the temp dirs removed."""
        end_processes(self.sessions, [str(temp) for temp in self.temp_dirs])
        for temp in self.temp_dirs:
            shutil.rmtree(temp, ignore_errors=True)
