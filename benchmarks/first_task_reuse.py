"""Wall time of one small `gtep tune` with the shared first task against the same study training it every time.

The scenario has the paper's half-base shape (C50xT1+C10xT5, scaled down: half the classes in task 1, then
five tasks of a tenth each) and the paper's fixed first-task recipe, so task 1 is the largest task. Both
studies run in this script, one after the other (alternating when --repeats > 1), with the same config and
seed; it also checks that they reach the same metrics. Prints the first-task trainings counted in the
events of the reusing study (= S), task 1's share of a unit's training time in the study without reuse (which
bounds what reuse can save: about 1 - share + share / R), and, as the last line, the ratio (target <= 0.5).

    .venv/bin/python benchmarks/first_task_reuse.py [--trials 10 --orderings 2 --repeats 1]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import yaml


def study_config(name: str, reuse: bool, args: argparse.Namespace) -> dict:
    per_phase = 20
    return {
        "study": name,
        "algorithm": "replay",
        "backbone": "resnet8",
        "scenario": {"increments": f"C{per_phase // 2}xT1+C{per_phase // 10}xT5"},
        "datasets": {"split": {"dataset": f"synthetic:classes={2 * per_phase},train=60,test=10",
                               "classes_per_phase": per_phase}},
        "search": {"trials": args.trials, "orderings": args.orderings},
        # the paper's Table 3 recipe with a fixed scheduler, so the key is the ordering alone (S trainings)
        "first_task": {"epochs": 200, "milestones": [60, 120, 170], "scheduler": "steplr"},
        "training": {"memory_size": 20, "epoch_scale": args.epoch_scale, "reuse_first_task": reuse},
        "compute": {"cpus_per_trial": 1, "max_concurrent": args.slots},
        "seed": 0,
    }


def run_study(root: Path, name: str, reuse: bool, args: argparse.Namespace) -> tuple[float, Path]:
    config = root / f"{name}.yaml"
    config.write_text(yaml.safe_dump(study_config(name, reuse, args)))
    gtep = Path(sys.executable).with_name("gtep")
    tic = time.perf_counter()
    subprocess.run([str(gtep), "tune", "--config", str(config), "--output", str(root / "out")], check=True,
                   stdout=subprocess.DEVNULL)
    return time.perf_counter() - tic, root / "out" / name


def first_task_sources(study: Path) -> Counter:
    events = [json.loads(line) for line in (study / "events.jsonl").read_text().splitlines()]
    return Counter(e.get("first_task") for e in events if e["event"] == "unit_trained")


def unit_metrics(study: Path) -> dict[str, tuple]:
    units = json.loads((study / "manifest.json").read_text())["units"]
    return {key: (u["acc"], u["avg_acc"]) for key, u in units.items()}


def first_task_share(study: Path) -> float:
    """Task 1's share of the units' training time in a study that trained every first task. Reuse removes all
    but S of the R x S first-task trainings, so the ratio cannot go below about 1 - share + share / R."""
    units = [json.loads(p.read_text()) for p in (study / "units").rglob("*.json")]
    seconds = [u["task_seconds"] for u in units if u.get("task_seconds")]
    return sum(t[0] for t in seconds) / sum(sum(t) for t in seconds)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--orderings", type=int, default=2)
    parser.add_argument("--slots", type=int, default=2, help="trials at once (cores on this machine)")
    parser.add_argument("--epoch-scale", type=float, default=0.1)
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    for key, value in (("RAY_AUTH_MODE", "disabled"), ("MLFLOW_SERVER_ENABLE_JOB_EXECUTION", "false"),
                       ("HF_HUB_OFFLINE", "1")):
        os.environ.setdefault(key, value)
    times: dict[bool, list[float]] = {True: [], False: []}
    with tempfile.TemporaryDirectory(prefix="gtep-bench-") as tmp:
        for repeat in range(args.repeats):
            for reuse in (True, False) if repeat % 2 == 0 else (False, True):
                seconds, study = run_study(Path(tmp), f"{'reuse' if reuse else 'noreuse'}{repeat}", reuse, args)
                times[reuse].append(seconds)
                print(f"{'with reuse   ' if reuse else 'without reuse'} run {repeat + 1}: {seconds:7.1f} s   "
                      f"first task: {dict(first_task_sources(study))}", flush=True)
        same = unit_metrics(Path(tmp) / "out" / "reuse0") == unit_metrics(Path(tmp) / "out" / "noreuse0")
        trained = first_task_sources(Path(tmp) / "out" / "reuse0")["trained"]
        share = first_task_share(Path(tmp) / "out" / "noreuse0")
    with_reuse, without = statistics.median(times[True]), statistics.median(times[False])
    print(f"R={args.trials} S={args.orderings} slots={args.slots}: with reuse {with_reuse:.1f} s, "
          f"without {without:.1f} s (medians of {args.repeats})")
    print(f"first-task trainings counted with reuse: {trained} (S = {args.orderings}); "
          f"same metrics with and without reuse: {same}")
    print(f"task 1's share of a unit's training without reuse: {share:.2f}, so the best ratio reuse can give here "
          f"is about {1 - share + share / args.trials:.2f} (below 0.5 only when task 1 is most of a unit's work)")
    print(f"ratio: {with_reuse / without:.2f} (target <= 0.5)")


if __name__ == "__main__":
    main()
