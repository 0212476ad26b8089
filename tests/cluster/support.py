"""The cluster and fault tests' studies and gtep drivers; the Ray nodes, MLflow servers and waiting on them are
gtep.testing's, shared with the benchmarks."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import yaml

from gtep.testing import MlflowServer, RayCluster, environment, free_port, gtep_command, kill_group, wait_for

__all__ = ["ENV", "MlflowServer", "RayCluster", "count", "events", "finish", "free_port", "gtep", "kill_group",
           "tiny_study", "wait_for", "write_config"]

# tiny tasks checkpointed each, so a kill mid-ordering resumes one
ENV = environment(GTEP_CHECKPOINT_EVERY_SECONDS="0")


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


def gtep(*args: str, log: Path, cwd: Path | None = None, env: dict[str, str] | None = None) -> subprocess.Popen:
    """A gtep command in its own process group, so the test can kill it with everything it started."""
    return subprocess.Popen(gtep_command(*args), stdout=open(log, "w"), stderr=subprocess.STDOUT,
                            env=ENV if env is None else env, cwd=cwd, start_new_session=True)


def finish(process: subprocess.Popen, log: Path, timeout: float = 600) -> str:
    code = process.wait(timeout=timeout)
    output = log.read_text()
    assert code == 0, f"exit {code}:\n{output[-3000:]}"
    return output


def events(study_dir: Path) -> list[dict]:
    path = study_dir / "events.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def count(study_dir: Path, event: str, phase: str = "tune") -> int:
    return sum(1 for e in events(study_dir) if e["event"] == event and e["phase"] == phase)
