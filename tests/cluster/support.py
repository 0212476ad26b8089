"""Processes for the cluster and fault tests: gtep drivers, MLflow servers, Ray nodes; and waiting on them."""
from __future__ import annotations

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
from typing import Callable

import yaml

BIN = Path(sys.executable).parent
# the venv's bin first, as on a node where gtep is installed: Ray Jobs run `gtep ...` from the PATH
ENV = {**os.environ, "RAY_AUTH_MODE": "disabled", "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
       "RAY_CHDIR_TO_TRIAL_DIR": "0", "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1",
       "GTEP_CHECKPOINT_EVERY_SECONDS": "0",  # tiny tasks checkpointed each, so a kill mid-ordering resumes one
       "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}


def tiny_study(name: str, trials: int = 3, orderings: int = 2, epochs: int = 6, **extra) -> dict:
    """A study whose units take a few seconds each: long enough to be interrupted between tasks."""
    return {
        "study": name, "algorithm": "replay", "backbone": "resnet8",
        "scenario": {"increments": "3x3"},
        "datasets": {"split": {"dataset": "synthetic:classes=20,train=30,test=10", "classes_per_phase": 9, "seed": 1}},
        "search": {"trials": trials, "orderings": orderings},
        "first_task": {"epochs": epochs, "milestones": [epochs // 2], "batch_size": 16},
        "training": {"memory_size": 18, "epoch_scale": 1.0},
        "compute": {"cpus_per_trial": 1, "max_concurrent": 1},
        "seed": 5, **extra,
    }


def write_config(folder: Path, config: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{config['study']}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


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


def gtep(*args: str, log: Path, cwd: Path | None = None, env: dict[str, str] | None = None) -> subprocess.Popen:
    """A gtep command in its own process group, so the test can kill it with everything it started."""
    return subprocess.Popen([sys.executable, "-m", "gtep.cli", *args], stdout=open(log, "w"), stderr=subprocess.STDOUT,
                            env=ENV if env is None else env, cwd=cwd, start_new_session=True)


def finish(process: subprocess.Popen, log: Path, timeout: float = 600) -> str:
    code = process.wait(timeout=timeout)
    output = log.read_text()
    assert code == 0, f"exit {code}:\n{output[-3000:]}"
    return output


def kill_group(process: subprocess.Popen, sig: int = signal.SIGKILL) -> None:
    try:
        os.killpg(process.pid, sig)
    except ProcessLookupError:
        pass
    process.wait(timeout=60)


def wait_for(predicate: Callable[[], object], timeout: float, what: str, interval: float = 0.5):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def events(study_dir: Path) -> list[dict]:
    path = study_dir / "events.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def count(study_dir: Path, event: str, phase: str = "tune") -> int:
    return sum(1 for e in events(study_dir) if e["event"] == event and e["phase"] == phase)


class MlflowServer:
    """`gtep server` on 127.0.0.1; stop() and start() again on the same port and store simulate an outage."""

    def __init__(self, root: Path, backend_store_uri: str | None = None) -> None:
        self.root, self.port = root, free_port()
        self.backend = backend_store_uri or f"sqlite:///{root / 'server.db'}"
        self.process: subprocess.Popen | None = None

    @property
    def uri(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def arguments(self) -> list[str]:
        return ["--backend-store-uri", self.backend, "--artifacts-destination", str(self.root / "artifacts"),
                "--port", str(self.port), "--workers", "1"]

    def environment(self) -> dict[str, str]:
        return ENV

    def start(self) -> "MlflowServer":
        log = self.root / f"server-{int(time.time())}.log"
        self.process = gtep("server", *self.arguments(), log=log, env=self.environment())
        wait_for(lambda: self.healthy() or self.process.poll() is not None, 120, f"the MLflow server ({log})")
        assert self.healthy(), f"the MLflow server did not start:\n{log.read_text()[-2000:]}"
        return self

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.uri}/health", timeout=2) as response:
                return response.status == 200
        except OSError:
            return False

    def stop(self) -> None:
        if self.process is not None:
            kill_group(self.process, signal.SIGTERM)
            self.process = None


class RayCluster:
    """A head and a worker node on 127.0.0.1, each with its own CPUs and temp dir, started by `ray start`."""

    def __init__(self, root: Path, cpus_per_node: int = 1) -> None:
        self.root, self.cpus = root, cpus_per_node
        self.port, self.dashboard_port, self.client_port = free_port(), free_port(), free_port()
        self.temp_dirs = [Path(tempfile.mkdtemp(prefix="gtep-ray-")) for _ in range(2)]  # short: socket paths
        self.sessions: list[int] = []

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def dashboard(self) -> str:
        return f"http://127.0.0.1:{self.dashboard_port}"

    def _ray(self, *args: str) -> None:
        """`ray start` in a session of its own: every process it leaves running (GCS, raylet, agents, client
        servers) stays in that session, which stop() kills whole."""
        process = subprocess.Popen([str(BIN / "ray"), *args], env=ENV, stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, start_new_session=True, text=True)
        self.sessions.append(process.pid)  # the session id of everything it starts
        output, _ = process.communicate(timeout=180)
        assert process.returncode == 0, output[-3000:]

    @staticmethod
    def node_ports() -> list[str]:
        """Two nodes on one host must not share their agents' ports (as two Ray jobs on a SLURM node)."""
        return [f"--dashboard-agent-listen-port={free_port()}", f"--dashboard-agent-grpc-port={free_port()}",
                f"--metrics-export-port={free_port()}", f"--runtime-env-agent-port={free_port()}"]

    def start(self) -> "RayCluster":
        common = ["--node-ip-address=127.0.0.1", f"--num-cpus={self.cpus}", "--num-gpus=0", "--disable-usage-stats"]
        self._ray("start", "--head", f"--port={self.port}", "--dashboard-host=127.0.0.1",
                  f"--dashboard-port={self.dashboard_port}", "--include-dashboard=true", "--ray-client-server-port",
                  str(self.client_port), f"--temp-dir={self.temp_dirs[0]}", *self.node_ports(), *common)
        self._ray("start", f"--address={self.address}", f"--temp-dir={self.temp_dirs[1]}", *self.node_ports(), *common)
        wait_for(lambda: len(self.node_ids()) == 2, 120, "both Ray nodes")
        return self

    def node_ids(self) -> list[str]:
        script = ("import json, ray; ray.init(address=%r, logging_level='ERROR'); "
                  "print(json.dumps([n['NodeID'] for n in ray.nodes() if n['Alive']]))" % self.address)
        done = subprocess.run([sys.executable, "-c", script], env=ENV, capture_output=True, text=True, timeout=120)
        return json.loads(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 else []

    def worker_node_id(self) -> str:
        """The worker node's Ray id: the node whose raylet socket lies in the worker's temp dir."""
        script = ("import json, ray; ray.init(address=%r, logging_level='ERROR'); "
                  "print(json.dumps([(n['NodeID'], n['RayletSocketName']) for n in ray.nodes() if n['Alive']]))"
                  % self.address)
        done = subprocess.run([sys.executable, "-c", script], env=ENV, capture_output=True, text=True, timeout=120)
        nodes = json.loads(done.stdout.strip().splitlines()[-1])
        node, = [node for node, socket in nodes if socket.startswith(str(self.temp_dirs[1]))]
        return node

    def worker_processes(self) -> list[int]:
        """The worker node's processes: those of the session its `ray start` made (raylet, agents, the Ray workers
        running trials) and any naming its temp dir."""
        listing = subprocess.run(["ps", "-eo", "pid=,sid=,args="], capture_output=True, text=True).stdout
        found = []
        for line in listing.splitlines():
            pid, sid, args = (line.split(None, 2) + [""])[:3]
            if int(sid) == self.sessions[1] or str(self.temp_dirs[1]) in args:
                found.append(int(pid))
        return found

    def kill_worker(self) -> None:
        """SIGKILL every process of the worker node at once, as a preempted machine goes."""
        for pid in self.worker_processes():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        wait_for(lambda: not self.worker_processes(), 30, "the worker node's processes to end")

    def stop(self) -> None:
        for temp in self.temp_dirs:  # each node's processes: by their session, and by their temp dir
            subprocess.run(["pkill", "-9", "-f", str(temp)], check=False)
        for pid in self.sessions:
            subprocess.run(["pkill", "-9", "-s", str(pid)], check=False)
        for temp in self.temp_dirs:
            shutil.rmtree(temp, ignore_errors=True)
