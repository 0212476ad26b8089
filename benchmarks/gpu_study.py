"""`gtep run` through Ray on a GPU, with trials packed per GPU: how busy they keep it and how many images it trains.

For each share of a GPU (`compute.gpus_per_trial`: 1, 0.5, 0.25, 0.125 by default) a real study runs through
`gtep run` (both phases, Ray Tune, the journal and the sqlite MLflow store), with `max_concurrent` set to how
many such trials fit on the GPUs. Where `nvidia-cuda-mps-control` exists (`--mps auto`), the packed shares run a
second time under CUDA MPS, which this script starts and stops. While each study runs, `nvidia-smi` is sampled
every 200 ms (utilisation: the share of time a kernel ran; memory); the units' events (events.jsonl:
unit_started, unit_trained with the images each unit trained) give the training window and images/s. Each
study's figures are written to `--out` (gpu_study.json) as soon as it ends, so a call cut short
keeps what it measured. Per study: the phase's wall time, images/s summed over its trials, the ratio against
one trial per GPU, mean GPU utilisation, peak memory and the share of the GPU's bf16 peak (images/s x training
GFLOP per image / peak); and the store check: every unit trained once, one MLflow run per unit, no duplicate.

    python benchmarks/gpu_study.py --dataset npz:.device-data/tinyimagenet40_32.npz   # on the GPU machine
    python benchmarks/gpu_study.py --device cpu --quick --out /tmp/gs   # CPU dry run: logical GPUs, simulated
    python benchmarks/gpu_study.py --make-data ../shared/data/tinyimagenet200_32.npz  # the carried npz cut

`--device cpu --quick` rehearses the same path on CPUs: Ray declares one GPU the machine does not have and
`compute.simulate_gpus` trains the trials on the CPU, at toy size (ResNet-8, synthetic images, shares 1 and
0.5). benchmarks/gpu_study.sh is the device call around this script.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import yaml

# the neighbouring scripts (this script's folder is first on sys.path): gpu_throughput's FLOPs, paper_scale's store
from gpu_throughput import flops_per_image, make_task, peak_tflops
from paper_scale import store_figures

from gtep.testing import RayCluster

ROOT = Path(__file__).resolve().parents[1]

DATA_CUT = ROOT / ".device-data" / "tinyimagenet40_32.npz"
MPS_CONTROL = "nvidia-cuda-mps-control"


class GpuSampler:
    """`nvidia-smi` in loop mode, one line per sample: (time, utilisation %, memory MiB); nothing without it."""

    def __init__(self, interval_ms: int = 200) -> None:
        self.samples: list[tuple[float, float, float]] = []
        self.process: subprocess.Popen[str] | None = None
        if shutil.which("nvidia-smi") is None:
            return
        self.process = subprocess.Popen(
            ["nvidia-smi", "--query-gpu=utilization.gpu,memory.used", "--format=csv,noheader,nounits",
             f"-lms={interval_ms}"], stdout=subprocess.PIPE, text=True)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process is not None and self.process.stdout is not None
        for line in self.process.stdout:
            try:
                util, memory = (float(v) for v in line.split(",")[:2])
            except ValueError:
                continue
            self.samples.append((time.time(), util, memory))

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait()


def make_data_cut(source: Path, classes: int, out: Path = DATA_CUT) -> Path:
    """The first `classes` classes of an npz image set (Tiny ImageNet at 32 px), small enough to travel."""
    import numpy as np

    with np.load(source) as data:
        keep_train, keep_test = data["y_train"] < classes, data["y_test"] < classes
        arrays = {"x_train": data["x_train"][keep_train], "y_train": data["y_train"][keep_train],
                  "x_test": data["x_test"][keep_test], "y_test": data["y_test"][keep_test]}
        if "class_names" in data.files:
            arrays["class_names"] = data["class_names"][:classes]
    out.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(out, **arrays)
    print(f"{out.relative_to(ROOT) if out.is_relative_to(ROOT) else out}: {classes} classes, "
          f"{len(arrays['y_train'])} train / {len(arrays['y_test'])} test images, {out.stat().st_size / 2**20:.1f} MiB")
    return out


def study_config(args: argparse.Namespace, share: float, concurrent: int, folder: Path) -> dict[str, Any]:
    space = {"algorithm": "replay", "space": {"lr": [0.01, 0.03, 0.05, 0.1], "epochs": [args.epochs],
                                               "batch_size": [128], "weight_decay": [0.0005],
                                               "scheduler": ["cosine"]}}
    (folder / "space.yaml").write_text(yaml.safe_dump(space))
    per_phase = args.classes // 2
    base, step = per_phase // 2, per_phase // 4
    return {
        "study": f"share-{share:g}" + ("-mps" if args.mps_on else ""),
        "algorithm": "replay",
        "backbone": args.backbone,
        "scenario": {"increments": f"C{base}xT1+C{step}xT2"},
        "datasets": {"split": {"dataset": args.dataset, "classes_per_phase": per_phase, "seed": 0}},
        "search": {"trials": args.trials, "orderings": args.orderings, "space": str(folder / "space.yaml")},
        "first_task": {"epochs": args.epochs, "milestones": [max(1, args.epochs // 2)], "batch_size": 128,
                       "scheduler": "steplr"},
        "training": {"memory_size": 200, "reuse_first_task": False, "device": args.device},
        "compute": {"cpus_per_trial": 1, "gpus_per_trial": share, "max_concurrent": concurrent,
                    **({"simulate_gpus": True} if args.device == "cpu" else {})},
        "seed": 0,
    }


def read_events(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def phase_figures(events: list[dict[str, Any]], phase: str) -> dict[str, Any]:
    started = [e for e in events if e["event"] == "unit_started" and e["phase"] == phase]
    trained = [e for e in events if e["event"] == "unit_trained" and e["phase"] == phase]
    if not started or not trained:
        return {"units": len(trained)}
    window = max(e["time"] for e in trained) - min(e["time"] for e in started)
    images = sum(int(e.get("images_trained") or 0) for e in trained)
    return {"units": len(trained), "start": min(e["time"] for e in started), "end": max(e["time"] for e in trained),
            "window_s": round(window, 2), "images": images,
            "images_per_s": round(images / window, 1) if window > 0 else None}


def store_check(events: list[dict[str, Any]], expected: int, store_uri: str) -> dict[str, Any]:
    """What a correct study leaves: every unit trained once, one finished MLflow run per unit, no duplicate."""
    counts = Counter((e["phase"], e["set_index"], e["ordering"]) for e in events if e["event"] == "unit_trained")
    store = store_figures(store_uri)
    check = {"expected_units": expected, "units_trained": len(counts),
             "units_trained_more_than_once": sum(n > 1 for n in counts.values()),
             "ordering_runs": store["runs_by_level"].get("ordering", 0),
             "duplicate_runs": store["duplicate_runs_by_key"] + store["duplicate_runs_by_tags"],
             "runs_not_finished": store["runs_not_finished"]}
    check["passed"] = (check["units_trained"] == expected and check["units_trained_more_than_once"] == 0
                       and check["ordering_runs"] == expected and check["duplicate_runs"] == 0
                       and check["runs_not_finished"] == 0)
    return check


def gflop_per_image(backbone: str, classes: int) -> float:
    """Training FLOPs (forward + backward) of one 32 px image through the study's network, counted on the CPU."""
    import torch

    from gtep.algorithms import ALGORITHMS
    from gtep.engine.loop import Precision

    algorithm = ALGORITHMS.get("replay")
    learner = algorithm(algorithm.Params.from_mapping({}), backbone, 0, torch.device("cpu"))
    task = make_task(8, classes, 8, 1, torch.device("cpu"))
    learner.begin_task(task)
    return flops_per_image(learner, task, Precision.for_device(torch.device("cpu"), False)) / 1e9


def run_study(args: argparse.Namespace, share: float, address: str, env: dict[str, str], workdir: Path,
              gpus: int, peak: float | None, gflop: float) -> dict[str, Any]:
    concurrent = max(1, int(round(gpus / share)))
    folder = workdir / (f"share-{share:g}" + ("-mps" if args.mps_on else ""))
    folder.mkdir(parents=True)
    doc = study_config(args, share, concurrent, folder)
    (folder / "exp.yaml").write_text(yaml.safe_dump(doc))
    sampler = GpuSampler()
    tic = time.time()
    done = subprocess.run([sys.executable, "-c", "from gtep.cli import app; app()", "run", "--config",
                           str(folder / "exp.yaml"), "--output", str(folder / "out"), "--address", address],
                          capture_output=True, text=True, env=env, cwd=folder)
    wall = time.time() - tic
    sampler.stop()
    row: dict[str, Any] = {"share": share, "mps": args.mps_on, "trials_at_once": concurrent, "wall_s": round(wall, 1),
                           "returncode": done.returncode, "output": done.stdout[-6000:]}
    if done.returncode != 0:
        row["error"] = (done.stdout[-2000:] + "\n" + done.stderr[-3000:]).strip()
        return row
    events = read_events(folder / "out" / doc["study"] / "events.jsonl")
    row["tune"], row["evaluate"] = phase_figures(events, "tune"), phase_figures(events, "evaluate")
    expected = args.trials * args.orderings + args.orderings
    row["store"] = store_check(events, expected, f"sqlite:///{folder / 'out' / 'mlflow.db'}")
    tune = row["tune"]
    if "start" in tune:
        window = [s for s in sampler.samples if tune["start"] <= s[0] <= tune["end"]]
        utils = [s[1] for s in window]
        row["gpu"] = {"samples": len(window), "util_mean": round(statistics.mean(utils), 1) if utils else None,
                      "util_median": statistics.median(utils) if utils else None,
                      "memory_peak_mib": max((s[2] for s in window), default=None)}
        if tune.get("images_per_s"):
            row["images_per_s_per_gpu"] = round(tune["images_per_s"] / gpus, 1)
            row["tflops"] = round(tune["images_per_s"] * gflop / 1e3, 2)
            if peak:
                row["share_of_bf16_peak_pct"] = round(100 * row["tflops"] / (peak * gpus), 2)
    best = folder / "out" / doc["study"] / "best.yaml"
    row["best"] = yaml.safe_load(best.read_text()) if best.exists() else None
    return row


def mps_available() -> bool:
    return shutil.which(MPS_CONTROL) is not None


def start_mps() -> str | None:
    """Start the CUDA MPS control daemon (default pipe folder, so Ray's workers find it); None, or why it failed."""
    done = subprocess.run([MPS_CONTROL, "-d"], capture_output=True, text=True)
    return None if done.returncode == 0 else (done.stderr or done.stdout or f"exit {done.returncode}").strip()


def stop_mps() -> None:
    subprocess.run([MPS_CONTROL], input="quit\n", capture_output=True, text=True)


def summarise(rows: list[dict[str, Any]]) -> list[str]:
    """The table docs/speed.md shows: per share and MPS setting, against one trial per GPU (share 1, no MPS)."""
    base = next((r for r in rows if r["share"] == 1 and not r["mps"] and r.get("images_per_s_per_gpu")), None)
    lines = ["| share | MPS | trials at once | run wall s | tune window s | images/s per GPU | x one trial per GPU "
             "| mean GPU util % | peak MiB | % of bf16 peak | store check |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        if r["returncode"] != 0:
            lines.append(f"| {r['share']:g} | {'on' if r['mps'] else 'off'} | {r['trials_at_once']} | failed | | | | | "
                         f"| | {r.get('error', '')[-120:]!r} |")
            continue
        rate = r.get("images_per_s_per_gpu")
        ratio = f"{rate / base['images_per_s_per_gpu']:.2f}" if base and rate else "-"
        gpu = r.get("gpu", {})
        lines.append(f"| {r['share']:g} | {'on' if r['mps'] else 'off'} | {r['trials_at_once']} | "
                     f"{r['wall_s']} | {r['tune'].get('window_s', '-')} | {rate or '-'} | {ratio} | "
                     f"{gpu.get('util_mean') or '-'} | "
                     f"{gpu.get('memory_peak_mib') or '-'} | {r.get('share_of_bf16_peak_pct', '-')} | "
                     f"{'passed' if r['store']['passed'] else 'FAILED'} |")
    return lines


def save(out: Path, facts: dict[str, Any], rows: list[dict[str, Any]]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu_study.json").write_text(json.dumps({"facts": facts, "studies": rows, "table": summarise(rows)},
                                                   indent=1, default=str))


def device_facts(device: str) -> dict[str, Any]:
    import platform

    import torch

    facts: dict[str, Any] = {"device": device, "torch": torch.__version__, "python": platform.python_version(),
                             "cpus": os.cpu_count()}
    if device.startswith("cuda") and torch.cuda.is_available():
        facts.update(gpu=torch.cuda.get_device_name(), gpus=torch.cuda.device_count(), cuda=torch.version.cuda)
    return facts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda", help="cuda (default), or cpu for the dry run (--quick)")
    parser.add_argument("--quick", action="store_true", help="toy size: ResNet-8, synthetic images, shares 1 0.5")
    parser.add_argument("--shares", type=float, nargs="+", help="gpus_per_trial values (default 1 0.5 0.25 0.125)")
    parser.add_argument("--mps", choices=("auto", "on", "off"), default="auto",
                        help="auto: also run the packed shares under CUDA MPS where nvidia-cuda-mps-control exists")
    parser.add_argument("--dataset", help=f"the study's images (default npz:{DATA_CUT.relative_to(ROOT)})")
    parser.add_argument("--classes", type=int, help="classes in the dataset used, split in two phases (default 40)")
    parser.add_argument("--backbone", help="default resnet32 (resnet8 with --quick)")
    parser.add_argument("--trials", type=int, help="R (default 8: the most trials a GPU holds at share 0.125)")
    parser.add_argument("--orderings", type=int, help="S (default 1: the call's minutes go to sets, which pack; 2 "
                                                      "with --quick)")
    parser.add_argument("--epochs", type=int, help="epochs of every task (default 25; 1 with --quick)")
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or ROOT / "benchmarks" / "results"
                                                             / "gpu_study"))
    parser.add_argument("--make-data", type=Path, metavar="NPZ", help="write the carried cut of this npz and stop")
    args = parser.parse_args(argv)
    if args.make_data:
        make_data_cut(args.make_data, args.classes or 40)
        return 0
    quick = args.quick
    args.shares = args.shares or ([1.0, 0.5] if quick else [1.0, 0.5, 0.25, 0.125])
    args.classes = args.classes or (16 if quick else 40)
    args.dataset = args.dataset or ("synthetic:classes=16,train=24,test=8" if quick else f"npz:{DATA_CUT}")
    args.backbone = args.backbone or ("resnet8" if quick else "resnet32")
    args.epochs = args.epochs or (1 if quick else 25)
    args.orderings = args.orderings or (2 if quick else 1)
    args.trials = args.trials or (2 if quick else 8)
    if args.device.startswith("cuda"):
        import torch
        if not torch.cuda.is_available():
            parser.error(f"--device {args.device}: CUDA is not available here (use --device cpu --quick for a dry run)")
        gpus = torch.cuda.device_count()
    elif args.device == "cpu":
        gpus = 1  # logical: Ray declares it, compute.simulate_gpus trains on the CPU
    else:
        parser.error(f"--device {args.device}: use cuda or cpu")
    if args.dataset.startswith("npz:") and not Path(args.dataset[4:]).exists():
        parser.error(f"--dataset {args.dataset}: no such file; make the cut first (--make-data "
                     f"../shared/data/tinyimagenet200_32.npz) or name another npz")
    mps_settings = [False]
    if args.device.startswith("cuda") and (args.mps == "on" or (args.mps == "auto" and mps_available())):
        mps_settings.append(True)
    facts = device_facts(args.device)
    peak = peak_tflops(__import__("torch").device(args.device), None) if args.device.startswith("cuda") else None
    gflop = gflop_per_image(args.backbone, args.classes // 2)
    facts.update(peak_bf16_tflops=peak, gflop_per_training_image=round(gflop, 4), backbone=args.backbone,
                 dataset=args.dataset, trials=args.trials, orderings=args.orderings, epochs=args.epochs)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in [str(ROOT), os.environ.get("PYTHONPATH", "")] if p)}
    env.setdefault("RAY_AUTH_MODE", "disabled")
    env.setdefault("MLFLOW_SERVER_ENABLE_JOB_EXECUTION", "false")
    env.setdefault("HF_HUB_OFFLINE", "1")
    rows: list[dict[str, Any]] = []
    cpus = max(2, int(max(round(gpus / s) for s in args.shares)) + 1)  # a core per packed trial, one for the driver
    print(f"gtep run on {facts.get('gpu') or args.device}: {args.backbone}, R={args.trials} x S={args.orderings}, "
          f"{args.epochs} epochs a task, shares {' '.join(f'{s:g}' for s in args.shares)}, MPS "
          f"{'also' if len(mps_settings) > 1 else 'off'}; {gflop:.3f} GFLOP a training image", flush=True)
    with tempfile.TemporaryDirectory(prefix="gtep-gpu-study-") as tmp:
        for mps in mps_settings:
            args.mps_on = mps
            if mps:
                failure = start_mps()
                if failure:
                    print(f"CUDA MPS did not start ({failure}); the MPS studies are skipped", flush=True)
                    facts["mps_error"] = failure
                    break
            # started after MPS, so its workers are MPS clients
            ray = RayCluster(cpus, nodes=1, gpus_per_node=gpus, env=env).start()
            try:
                for share in args.shares:
                    if mps and share >= 1:
                        continue  # one trial per GPU: nothing for MPS to share
                    row = run_study(args, share, ray.address, env, Path(tmp), gpus, peak, gflop)
                    rows.append(row)
                    save(args.out, facts, rows)
                    if row["returncode"] != 0:
                        print(f"share {share:g}{' (MPS)' if mps else ''}: gtep run failed:\n{row['error']}", flush=True)
                        continue
                    print(f"share {share:g}{' (MPS)' if mps else ''}: {row['trials_at_once']} trials at once, tune "
                          f"{row['tune'].get('window_s')} s, {row.get('images_per_s_per_gpu')} images/s per GPU, "
                          f"GPU util {row.get('gpu', {}).get('util_mean') or 'n/a'} %, store check "
                          f"{'passed' if row['store']['passed'] else 'FAILED'}", flush=True)
            finally:
                ray.stop()
                if mps:
                    stop_mps()
    print("\n".join(summarise(rows)))
    ok = bool(rows) and all(r["returncode"] == 0 and r["store"]["passed"] for r in rows)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
