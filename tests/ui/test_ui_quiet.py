"""`gtep ui` shows gtep's lines only (issue 68, item 1): MLflow's, Starlette's and Uvicorn's start-up notices (a
deprecation warning naming a site-packages file among them), their request lines and, on Ctrl-C, their shutdown
lines or tracebacks (KeyboardInterrupt, CancelledError: 1 stop in 2) go to a log file beside the store, owner-only,
which gtep's first line names; Ctrl-C is a clean stop (exit 0, as for any server gtep starts). A server that ends
of itself (a port in use) is one error line that quotes the log's error and names the log.

Group `ui` (pytest -m ui): the MLflow servers' own processes, started and stopped, as the browser tests do (no
browser here)."""
from __future__ import annotations

import re
import signal
import socket
import stat
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.ui

STARTS = 3  # the tracebacks came 1 stop in 2: three stops
NOT_GTEPS = ("INFO", "uvicorn", "Uvicorn", "Traceback", "site-packages", "Warning", "MLflow]", "Registry store")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def serves(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as answer:
            return answer.status == 200
    except (urllib.error.URLError, OSError):
        return False


def gtep_ui(store: Path, port: int) -> subprocess.Popen:
    store.mkdir()
    (store / "mlflow.db").touch()  # an empty file is an empty store: gtep ui has MLflow make its tables
    return subprocess.Popen([sys.executable, "-m", "gtep", "ui", "--output", str(store), "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.fixture(scope="module")
def stops(tmp_path_factory) -> dict[str, Any]:
    """STARTS gtep ui stopped by Ctrl-C once they serve, and one on a port another process holds; side by side,
    to keep the module short. Each: (exit code, output, port, store)."""
    root = tmp_path_factory.mktemp("ui")
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    held = taken.getsockname()[1]
    started = []
    for n in range(STARTS):
        port = free_port()
        started.append((gtep_ui(root / f"runs{n}", port), port, root / f"runs{n}"))
    busy = gtep_ui(root / "busy", held)
    try:
        deadline = time.monotonic() + 240  # a loaded 2-core machine starts four slowly
        for proc, port, _ in started:
            while not serves(port):
                assert proc.poll() is None, f"gtep ui ended before serving:\n{proc.communicate()[0]}"
                assert time.monotonic() < deadline, f"gtep ui does not serve on port {port}"
                time.sleep(0.3)
        for proc, _, _ in started:
            proc.send_signal(signal.SIGINT)  # Ctrl-C
        stopped = [(proc.wait(timeout=120), proc.communicate()[0], port, store) for proc, port, store in started]
        ended = (busy.wait(timeout=240), busy.communicate()[0], held, root / "busy")
    finally:
        taken.close()
        for proc in [busy, *(proc for proc, _, _ in started)]:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    return {"stopped": stopped, "busy": ended}


def test_ctrl_c_stops_gtep_ui_cleanly_showing_gteps_lines_only(stops):
    for code, output, port, store in stops["stopped"]:
        assert code == 0, output
        lines = output.splitlines()
        assert lines[0].startswith(f"MLflow UI on http://127.0.0.1:{port}/") and lines[-1] == "MLflow UI stopped", \
            output
        assert not [line for line in lines if any(mark in line for mark in NOT_GTEPS)], output
        named = re.search(r"the server's own lines go to (\S+)\)", lines[0])
        assert named, output
        log = Path(named.group(1))
        assert log.parent == store.resolve() and log.exists()
        assert stat.S_IMODE(log.stat().st_mode) == 0o600
        text = log.read_text()
        assert "Uvicorn running on" in text and "Finished server process" in text, text
        assert "Traceback" not in text, text  # gtep stops the server with SIGTERM: no KeyboardInterrupt there


def test_a_server_that_ends_of_itself_is_one_error_line_naming_its_log(stops):
    code, output, port, store = stops["busy"]
    assert code == 2, output
    error = [line for line in output.splitlines() if line.startswith("error:")]
    assert len(error) == 1 and error[0].startswith("error: --port: the MLflow UI ended"), output
    assert "address already in use" in output and str(store.resolve() / "mlflow-ui.log") in output, output
    assert not [line for line in output.splitlines() if line.startswith(("INFO", "Traceback", "  "))], output
