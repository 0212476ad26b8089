"""A paper-scale study matrix, rehearsed on this machine (issue 34; in progress: the matrix's shape).

The GTEP paper's evaluation is a matrix of 15 algorithms over 8 scenario/pairing cells with R = 30 sets x S = 5
orderings per study plus each H*'s evaluation: 120 studies, 18,000 tuning units, some 19,000 units in all. The
learners here cost nothing (benchmarks/paper_scale_learners.py: the paper's fifteen algorithms as `ps_<name>`,
answering with seeded accuracy matrices of the right number of tasks), so what is measured is gtep's own part:
the driver, the journal, the MLflow store, the reports and the UI.

This file writes that matrix: the fifteen learners x two scenarios (10 tasks; 6 tasks with half of the classes
first, as Table 1) x four pairings of synthetic 50-class phases (two splits of one pool: high similarity; two
pairs of unrelated pools: low), R = 30, S = 5, and one search space per learner (the paper's common values: lr,
batch size, weight decay, epochs, milestones, decay, scheduler). `--scale` shrinks R and S (and `--algorithms`
and `--cells` the product) for a rehearsal that fits CI:

    .venv/bin/python benchmarks/paper_scale.py --write runs/paper-scale            # the full matrix, checked
    .venv/bin/python benchmarks/paper_scale.py --write runs/ps --scale 0.1 --algorithms 3 --cells 2

and checks it with `gtep matrix --check` (every cell resolved, nothing run). Running it on a two-node Ray cluster
with the MLflow server on PostgreSQL, timing it and killing it half way is the next step of issue 34.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from paper_scale_learners import PROFILES  # noqa: E402

SPACE = {"lr": [0.001, 0.003, 0.01, 0.03, 0.05, 0.1, 0.2, 0.5], "batch_size": [16, 32, 64, 128, 256],
         "weight_decay": [0.0001, 0.0005, 0.001], "epochs": [30, 70, 120, 170], "milestone_num": [2, 3],
         "lr_decay": [0.1, 0.3], "scheduler": ["steplr", "cosine"]}
SCENARIOS = {"10tasks": {"tasks": 10}, "6tasks": {"tasks": 6, "first": "half"}}
PAIRINGS = {
    "split-a": {"similarity": "high", "datasets": {"split": {
        "dataset": "synthetic:classes=100,train=20,test=10,seed=11", "by": "class", "seed": 0,
        "classes_per_phase": 50}}},
    "split-b": {"similarity": "high", "datasets": {"split": {
        "dataset": "synthetic:classes=100,train=20,test=10,seed=12", "by": "class", "seed": 1,
        "classes_per_phase": 50}}},
    "a-to-b": {"similarity": "low", "datasets": {
        "tuning": {"dataset": "synthetic:classes=50,train=20,test=10,seed=21"},
        "evaluation": {"dataset": "synthetic:classes=50,train=20,test=10,seed=22"}}},
    "b-to-a": {"similarity": "low", "datasets": {
        "tuning": {"dataset": "synthetic:classes=50,train=20,test=10,seed=22"},
        "evaluation": {"dataset": "synthetic:classes=50,train=20,test=10,seed=21"}}},
}


def cells(count: int) -> tuple[dict, dict]:
    """The first `count` (scenario, pairing) cells of the 2 x 4, pairings first (as the matrix runs them)."""
    keys = [(s, p) for p in PAIRINGS for s in SCENARIOS][:count]
    return ({s: SCENARIOS[s] for s in dict.fromkeys(k[0] for k in keys)},
            {p: PAIRINGS[p] for p in dict.fromkeys(k[1] for k in keys)})


def matrix_document(folder: Path, scale: float = 1.0, algorithms: int = 15, cell_count: int = 8,
                    name: str = "paper-scale") -> dict:
    """The matrix file's content; writes each learner's search space into `folder`/spaces."""
    spaces = folder / "spaces"
    spaces.mkdir(parents=True, exist_ok=True)
    chosen = [f"ps_{n}" for n in list(PROFILES)[:algorithms]]
    for algorithm in chosen:
        (spaces / f"{algorithm}.yaml").write_text(yaml.safe_dump({"algorithm": algorithm, "space": SPACE}))
    scenarios, pairings = cells(cell_count)
    return {
        "matrix": name,
        "algorithms": chosen,
        "scenarios": scenarios,
        "pairings": pairings,
        "base": {"backbone": "resnet8", "search": {"trials": max(2, round(30 * scale)),
                                                   "orderings": max(2, round(5 * scale))},
                 "first_task": {"epochs": 200, "lr": 0.1, "milestones": [60, 120, 170], "batch_size": 128},
                 "training": {"memory_size": 0, "device": "cpu"},
                 "compute": {"cpus_per_trial": 1, "max_concurrent": 2},
                 "tracking": {"output": str(folder / "runs")}, "seed": 0},
        "algorithm_overrides": {a: {"search": {"space": str(spaces / f"{a}.yaml")}} for a in chosen},
        "protocol": "gtep",
    }


def plugin_environment() -> dict[str, str]:
    """GTEP_PLUGINS and PYTHONPATH so that the driver and Ray's workers register the ps_ learners."""
    plugins = ",".join(filter(None, [os.environ.get("GTEP_PLUGINS", ""), "paper_scale_learners"]))
    path = os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH", "")]))
    return {**os.environ, "GTEP_PLUGINS": plugins, "PYTHONPATH": path, "RAY_AUTH_MODE": "disabled",
            "HF_HUB_OFFLINE": "1"}


def units(document: dict) -> tuple[int, int]:
    """(studies, units): each study's R x S tuning units and S evaluation units."""
    search = document["base"]["search"]
    studies = len(document["algorithms"]) * len(document["scenarios"]) * len(document["pairings"])
    return studies, studies * (search["trials"] + 1) * search["orderings"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", type=Path, required=True, help="folder for the matrix file, spaces and runs")
    parser.add_argument("--scale", type=float, default=1.0, help="R = 30 x scale and S = 5 x scale (at least 2)")
    parser.add_argument("--algorithms", type=int, default=15, choices=range(1, 16), metavar="1-15")
    parser.add_argument("--cells", type=int, default=8, choices=range(1, 9), metavar="1-8")
    args = parser.parse_args()
    folder = args.write.resolve()
    document = matrix_document(folder, args.scale, args.algorithms, args.cells)
    path = folder / "paper-scale.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    studies, total = units(document)
    print(f"{path}: {studies} studies, {total} units (R = {document['base']['search']['trials']}, "
          f"S = {document['base']['search']['orderings']})", flush=True)
    check = subprocess.run([sys.executable, "-m", "gtep.cli", "matrix", "--config", str(path), "--check"],
                           env=plugin_environment(), capture_output=True, text=True)
    print(check.stdout[-2000:] + check.stderr[-2000:])
    if check.returncode != 0:
        raise SystemExit(check.returncode)


if __name__ == "__main__":
    main()
