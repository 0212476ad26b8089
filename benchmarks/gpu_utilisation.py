"""How busy a tuning phase keeps one GPU: one trial per GPU against four trials sharing it.

A real `gtep tune` (Replay on ResNet-32, synthetic 32 px images, 8 sets x 1 ordering, the first-task store
off so that every set trains every task) runs once per share in `--shares`, with `compute.gpus_per_trial`
set to the share and `max_concurrent` to how many such trials fit on the GPU. While it runs, `nvidia-smi`
samples the GPU's utilisation (the share of time a kernel was running) and its memory every 200 ms; the
samples between the first unit's start and the last unit's end (from the study's events.jsonl) are
summarised. Printed per share: the phase's wall time, the training window, mean and median utilisation,
peak memory; last, the wall-time ratio of the last share against the first (the baseline).

    python benchmarks/gpu_utilisation.py [--shares 1 0.25 --trials 8 --epoch-scale 0.1]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


class GpuSampler:
    """`nvidia-smi` in loop mode, one line per sample: (time, utilisation %, memory MiB)."""

    def __init__(self, interval_ms: int = 200) -> None:
        self.samples: list[tuple[float, float, float]] = []
        self.process = subprocess.Popen(
            ["nvidia-smi", "--query-gpu=utilization.gpu,memory.used", "--format=csv,noheader,nounits",
             f"-lms={interval_ms}"], stdout=subprocess.PIPE, text=True)
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        for line in self.process.stdout:
            try:
                util, memory = (float(v) for v in line.split(",")[:2])
            except ValueError:
                continue
            self.samples.append((time.time(), util, memory))

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait()


def study_config(root: Path, args: argparse.Namespace, share: float) -> dict:
    space = {"algorithm": "replay", "space": {"lr": [0.05, 0.1], "epochs": [100], "batch_size": [128],
                                               "weight_decay": [0.0005], "scheduler": ["cosine"]}}
    (root / "space.yaml").write_text(yaml.safe_dump(space))
    return {
        "study": f"share-{share:g}",
        "algorithm": "replay",
        "backbone": args.backbone,
        "scenario": {"increments": "C10xT1+C5xT2"},
        "datasets": {"split": {"dataset": args.dataset, "classes_per_phase": 20}},
        "search": {"trials": args.trials, "orderings": 1, "space": str(root / "space.yaml")},
        "first_task": {"epochs": 100, "milestones": [50], "batch_size": 128, "scheduler": "steplr"},
        "training": {"memory_size": 200, "epoch_scale": args.epoch_scale, "reuse_first_task": False},
        "compute": {"cpus_per_trial": 1, "gpus_per_trial": share, "max_concurrent": max(1, int(1 / share))},
        "seed": 0,
    }


def run_share(args: argparse.Namespace, share: float, workdir: Path) -> dict:
    root = workdir / f"share-{share:g}"
    root.mkdir(parents=True)
    doc = study_config(root, args, share)
    (root / "exp.yaml").write_text(yaml.safe_dump(doc))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    sampler = GpuSampler()
    tic = time.time()
    done = subprocess.run([sys.executable, "-c", "from gtep.cli import app; app()", "tune", "--config",
                           str(root / "exp.yaml"), "--output", str(root / "out")], capture_output=True, text=True,
                          env=env, cwd=root)
    wall = time.time() - tic
    sampler.stop()
    if done.returncode != 0:
        raise SystemExit(f"gtep tune failed for share {share}:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    events = [json.loads(line) for line in (root / "out" / doc["study"] / "events.jsonl").read_text().splitlines()]
    start = min(e["time"] for e in events if e["event"] == "unit_started")
    end = max(e["time"] for e in events if e["event"] == "unit_trained")
    window = [s for s in sampler.samples if start <= s[0] <= end]
    utils = [s[1] for s in window] or [0.0]
    return {"share": share, "wall": wall, "window": end - start, "util_mean": statistics.mean(utils),
            "util_median": statistics.median(utils), "memory_peak": max((s[2] for s in window), default=0.0),
            "samples": len(window)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shares", type=float, nargs="+", default=[1.0, 0.25], help="gpus_per_trial values")
    parser.add_argument("--trials", type=int, default=8)
    parser.add_argument("--backbone", default="resnet32")
    parser.add_argument("--dataset", default="synthetic:classes=40,train=500,test=50,size=32")
    parser.add_argument("--epoch-scale", type=float, default=0.1)
    args = parser.parse_args()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("MLFLOW_SERVER_ENABLE_JOB_EXECUTION", "false")
    rows = []
    with tempfile.TemporaryDirectory(prefix="gtep-gpu-util-") as tmp:
        for share in args.shares:
            row = run_share(args, share, Path(tmp))
            rows.append(row)
            print(f"gpus_per_trial {share:g} ({max(1, int(1 / share))} trials at once): tune {row['wall']:.1f} s, "
                  f"training window {row['window']:.1f} s, GPU utilisation mean {row['util_mean']:.0f}% median "
                  f"{row['util_median']:.0f}% ({row['samples']} samples), peak memory {row['memory_peak']:.0f} MiB",
                  flush=True)
    if len(rows) > 1:
        print(f"training window ratio, share {rows[-1]['share']:g} against {rows[0]['share']:g}: "
              f"{rows[-1]['window'] / rows[0]['window']:.2f}")


if __name__ == "__main__":
    main()
