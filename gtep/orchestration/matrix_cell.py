"""One matrix cell in a driver process of its own, joined to the matrix's Ray cluster (gtep matrix
--parallel-cells N with N > 1). Several such drivers on one cluster is how the cells' trials share it: each
cell's Tuner asks Ray for its trials and Ray places whichever trial of whichever cell finds room.

    python -m gtep.orchestration.matrix_cell < job.json

The job (written by gtep/orchestration/matrix.py) names the cell, its experiment config, the phases, whether to
resume, the cluster address, where to write the result, and the parent's pid: the cell dies with its parent, so a
killed matrix driver never leaves a cell running that the next `gtep matrix` would resume a second time.
"""
from __future__ import annotations

import ctypes
import json
import os
import signal
import sys
import traceback
from pathlib import Path
from typing import Any

PR_SET_PDEATHSIG = 1


def die_with_parent(parent_pid: int) -> None:
    """Linux delivers SIGKILL to this process when its parent goes; elsewhere the parent stops its cells itself."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent_pid:  # the parent went before prctl took effect
        sys.exit(1)


def write_result(path: Path, result: dict[str, Any]) -> None:
    from gtep.orchestration.study import write_atomic

    write_atomic(path, json.dumps(result, indent=2))


def run_job(job: dict[str, Any]) -> dict[str, float]:
    from rich.console import Console

    from gtep.config import ExperimentConfig
    from gtep.matrix import MatrixCell, ResolvedCell
    from gtep.orchestration.matrix import run_cell
    from gtep.orchestration.ray_search import ray_session

    cell = MatrixCell(**job["cell"], config=ExperimentConfig.model_validate(job["config"]))
    from gtep.preflight import preflight

    rc = ResolvedCell(cell, preflight(cell.config).resolved)
    console = Console(file=sys.stdout, width=160, highlight=False)  # stdout is the cell's log file
    with ray_session(job["address"]):
        return run_cell(rc, job["phases"], console, resume=job["resume"])


def main() -> int:
    from gtep.orchestration.interrupt import StudyInterrupted

    job = json.loads(sys.stdin.read())
    die_with_parent(int(job["parent_pid"]))
    result_path = Path(job["result"])
    try:
        hmeans = run_job(job)
    except StudyInterrupted as err:  # stopped by a signal: the parent keeps the cell running, to resume
        write_result(result_path, {"status": "interrupted", "error": str(err)})
        return err.exit_code
    except Exception as err:  # noqa: BLE001 - the parent records the cell as failed with this message
        traceback.print_exc()
        write_result(result_path, {"status": "failed", "error": f"{err.__class__.__name__}: {err}"})
        return 1
    write_result(result_path, {"status": "finished", "hmean": hmeans})
    return 0


if __name__ == "__main__":
    sys.exit(main())
