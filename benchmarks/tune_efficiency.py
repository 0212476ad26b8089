"""How close a real `gtep tune` comes to the ideal: its wall time against the units' own training time
spread over the concurrent slots.

    ideal = sum over (set, ordering) units of train_seconds (manifest.json) / slots

A small study (Replay on ResNet-8, R=6 sets x S=2 orderings of synthetic 32 px images, 4 tasks) runs through
the CLI exactly as a user runs it, with `compute.max_concurrent` = slots (the cores of this machine) and one
CPU per trial. The first-task store is off (`training.reuse_first_task: false`): a reused first task keeps
the seconds it took to train in train_seconds, which would count it in the ideal once per set. Epochs and
batch size are fixed in the space (the rest is Replay's own sets), so units are of one size and the ratio
measures gtep's overhead rather than how unequal trials happen to pack; --replay-space uses Replay's own.

The wall time is split, from the study's events.jsonl, into start-up (command start to the first unit),
slot time outside units while units were still to start (trial start, data transfer, reports), the tail
(slots idle because nothing was left to start), time inside units but outside train_seconds (tensors,
checkpoints, unit files) and the end (last unit to the command's exit: selection, MLflow, Ray shutdown).
The last line is the ratio (target <= 1.15).

    .venv/bin/python benchmarks/tune_efficiency.py [--trials 6 --orderings 2 --slots 2 --epoch-scale 0.2]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPLAY_SETS = {"lr": [0.05, 0.1, 0.15, 0.2], "milestone_num": [2, 3, 4], "lr_decay": [0.1, 0.3, 0.5],
               "weight_decay": [0.0001, 0.0005, 0.001, 0.005], "scheduler": ["steplr", "cosine"]}


def study_config(root: Path, args: argparse.Namespace) -> dict:
    space = {"algorithm": "replay", "space": {**REPLAY_SETS, "epochs": [args.epochs], "batch_size": [64]}}
    (root / "space.yaml").write_text(yaml.safe_dump(space))
    search = {"trials": args.trials, "orderings": args.orderings}
    if not args.replay_space:
        search["space"] = str(root / "space.yaml")
    return {
        "study": "efficiency",
        "algorithm": "replay",
        "backbone": args.backbone,
        "scenario": {"increments": "C4xT1+C2xT3"},
        "datasets": {"split": {"dataset": args.dataset, "classes_per_phase": 10}},
        "search": search,
        "first_task": {"epochs": 200, "milestones": [60, 120, 170], "batch_size": 64, "scheduler": "steplr"},
        "training": {"memory_size": 20, "epoch_scale": args.epoch_scale, "reuse_first_task": False},
        "compute": {"cpus_per_trial": 1, "max_concurrent": args.slots},
        "seed": 0,
    }


def slot_breakdown(events: list[dict], slots: int) -> dict[str, float]:
    """Slot-seconds from the first unit's start to the last unit's end: inside units, idle while units were
    still to start (trial start-up, transfers, reports), and idle in the tail (nothing left to start)."""
    spans = {}
    for e in events:
        key = (e.get("set_index"), e.get("ordering"))
        if e["event"] == "unit_started":
            spans[key] = [e["time"], None]
        elif e["event"] == "unit_trained" and key in spans:
            spans[key][1] = e["time"]
    spans = [tuple(s) for s in spans.values() if s[1] is not None]
    first, last = min(s for s, _ in spans), max(e for _, e in spans)
    last_start = max(s for s, _ in spans)
    inside = sum(e - s for s, e in spans)

    def busy_between(a: float, b: float) -> float:
        return sum(max(0.0, min(e, b) - max(s, a)) for s, e in spans)

    return {"first": first, "last": last, "inside": inside,
            "gaps": slots * (last_start - first) - busy_between(first, last_start),
            "tail": slots * (last - last_start) - busy_between(last_start, last)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trials", type=int, default=6, help="R")
    parser.add_argument("--orderings", type=int, default=2, help="S")
    parser.add_argument("--slots", type=int, default=2, help="max_concurrent = the cores of this machine")
    parser.add_argument("--epoch-scale", type=float, default=0.2)
    parser.add_argument("--epochs", type=int, default=70, help="the sampled epochs of tasks 2+ (fixed in the space)")
    parser.add_argument("--backbone", default="resnet8")
    parser.add_argument("--dataset", default="synthetic:classes=20,train=60,test=10,size=32")
    parser.add_argument("--replay-space", action="store_true", help="sample from search_spaces/replay.yaml")
    parser.add_argument("--keep", action="store_true", help="keep the temporary study folder")
    args = parser.parse_args()
    for key, value in (("RAY_AUTH_MODE", "disabled"), ("MLFLOW_SERVER_ENABLE_JOB_EXECUTION", "false"),
                       ("HF_HUB_OFFLINE", "1")):
        os.environ.setdefault(key, value)

    root = Path(tempfile.mkdtemp(prefix="gtep-bench-efficiency-"))
    try:
        config = root / "efficiency.yaml"
        config.write_text(yaml.safe_dump(study_config(root, args)))
        gtep = Path(sys.executable).with_name("gtep")
        tic = time.perf_counter()  # what every gtep command pays before it does anything (warm file cache)
        subprocess.run([sys.executable, "-c", "import gtep.cli, gtep.orchestration.phases"], check=True)
        imports = time.perf_counter() - tic
        started = time.time()
        subprocess.run([str(gtep), "tune", "--config", str(config), "--output", str(root / "out")], check=True,
                       stdout=subprocess.DEVNULL)
        ended = time.time()
        study = root / "out" / "efficiency"
        units = json.loads((study / "manifest.json").read_text())["units"].values()
        train = sum(float(u["train_seconds"]) for u in units)
        events = [json.loads(line) for line in (study / "events.jsonl").read_text().splitlines()]
        split = slot_breakdown(events, args.slots)
        wall, ideal = ended - started, train / args.slots
        n = len(units)
        print(f"replay on {args.backbone}: R={args.trials} x S={args.orderings} = {n} units, {args.slots} slots, "
              f"epoch_scale {args.epoch_scale}")
        print(f"units' train_seconds: {train:.1f} s in all ({train / n:.1f} s per unit); ideal {ideal:.1f} s; "
              f"gtep tune wall {wall:.1f} s")
        print(f"  start-up (command start to first unit): {split['first'] - started:6.1f} s, of which Python imports "
              f"~{imports:.1f} s (timed apart); the rest: Ray start, MLflow store, first trials")
        print(f"  end (last unit to exit: selection, MLflow, Ray shutdown): {ended - split['last']:6.1f} s")
        print(f"  slot-seconds inside units but outside train_seconds: {split['inside'] - train:6.1f} "
              f"({(split['inside'] - train) / n:.2f} per unit)")
        print(f"  slot-seconds idle between units (trial start, transfer, reports): {split['gaps']:6.1f}")
        print(f"  slot-seconds idle in the tail (nothing left to start): {split['tail']:6.1f}")
        if args.keep:
            print(f"study folder: {study}")
        print(f"ratio: {wall / ideal:.2f} (target <= 1.15)")
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
