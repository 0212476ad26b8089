"""What gtep's controller costs per (set, ordering) unit: a tuning phase of a learner that does nothing.

1,000 units by default (200 sets x 5 orderings) of the "noop" learner (benchmarks/noop_learner.py, chance
predictions, no training) go through the real path of `gtep tune`: Ray Tune's Tuner with the seeded random
searcher, a Ray trial per set, unit files, per-task checkpoints and events on the study folder, the MLflow
writer callback on the driver, its write journal and a local sqlite store. The learner is registered through
GTEP_PLUGINS, set with PYTHONPATH before Ray starts so that Ray's workers import it as well.

    overhead per unit = (wall time of the tuning phase - the units' own run time / slots) / units

The units' own run time is their `train_seconds` (near zero here); Ray's start and shutdown are timed apart,
since they are paid once per phase. Also printed: the driver's resident memory before Ray starts and after
the phase (and its peak), the time Ray Tune's loop spent in gtep's callbacks (journaling a unit's writes, the
manifest, progress), the time the MLflow writer thread spent per kind of write (it runs beside the loop, so with
units this short it is what bounds the phase), and the time workers spent inside their units (from events.jsonl).
The last line is the overhead (target < 50 ms).

    .venv/bin/python benchmarks/controller_overhead.py [--sets 200 --orderings 5 --slots 2] [--profile FILE]

--profile writes a cProfile of the driver during the phase (read it with `python -m pstats FILE`).
Everything is written under a temporary folder, removed at the end unless --keep is given.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Callable

HERE = Path(__file__).resolve().parent
for _key, _value in (("RAY_AUTH_MODE", "disabled"), ("MLFLOW_SERVER_ENABLE_JOB_EXECUTION", "false"),
                     ("HF_HUB_OFFLINE", "1")):
    os.environ.setdefault(_key, _value)
# Before gtep.algorithms is imported here and before Ray starts: Ray's workers inherit the environment.
os.environ["GTEP_PLUGINS"] = ",".join(filter(None, [os.environ.get("GTEP_PLUGINS", ""), "noop_learner"]))
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH", "")]))

import yaml  # noqa: E402
from rich.console import Console  # noqa: E402

from gtep.config import ExperimentConfig, resolve  # noqa: E402
from gtep.orchestration import phases, ray_search  # noqa: E402
from gtep.orchestration.journal import TrackingJournal  # noqa: E402
from gtep.orchestration.study import Manifest  # noqa: E402
from gtep.orchestration.tracking import MlflowWriter  # noqa: E402

SPACE = {"algorithm": "noop",
         "space": {"lr": [0.01, 0.05, 0.1], "batch_size": [32, 64, 128], "weight_decay": [0.0001, 0.0005]}}


def rss_mib(field: str = "VmRSS") -> float:
    """The driver's resident memory (VmRSS) or its peak (VmHWM), from /proc/self/status."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    return float("nan")


class DriverClock:
    """Wall time the driver spends in gtep's Tune callbacks and in their parts (the methods are wrapped
    class-wide, in this process only). Cheaper and less distorting than a profiler."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def wrap(self, cls: type, method: str, label: str | Callable[..., str]) -> None:
        original = getattr(cls, method)

        def timed(obj, *args, **kwargs):
            tic = time.perf_counter()
            try:
                return original(obj, *args, **kwargs)
            finally:
                name = label(*args) if callable(label) else label
                self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - tic
        setattr(cls, method, timed)

    def instrument(self) -> None:
        self.wrap(MlflowWriter, "on_trial_result", "callbacks")
        self.wrap(MlflowWriter, "on_trial_start", "callbacks")
        self.wrap(ray_search.ProgressCallback, "on_trial_result", "callbacks")
        self.wrap(TrackingJournal, "_apply", lambda op: f"mlflow {op['op']}")
        self.wrap(TrackingJournal, "_existing", "mlflow search (in create_run)")
        self.wrap(TrackingJournal, "_save_state", "journal state.json")
        self.wrap(Manifest, "save", "manifest.json")

    def parts(self, units: int) -> str:
        return ", ".join(f"{name} {seconds / units * 1000:.1f}" for name, seconds in sorted(self.seconds.items())
                         if name != "callbacks")


def study_config(root: Path, args: argparse.Namespace) -> ExperimentConfig:
    space = root / "noop.yaml"
    space.write_text(yaml.safe_dump(SPACE))
    return ExperimentConfig.model_validate({
        "study": "controller",
        "algorithm": "noop",
        "backbone": "resnet8",  # never built: the no-op learner has a network without parameters
        "scenario": {"increments": "1x2"},
        "datasets": {"split": {"dataset": "synthetic:classes=4,train=2,test=2,size=8", "classes_per_phase": 2}},
        "search": {"trials": args.sets, "orderings": args.orderings, "space": str(space)},
        "training": {"memory_size": 0},
        "compute": {"cpus_per_trial": 1, "max_concurrent": args.slots},
        "tracking": {"output": str(root / "out")},
        "seed": 0,
    })


def worker_seconds(study: Path) -> float:
    """Sum over units of the time between a unit's start and end events (the worker's side of a unit)."""
    started, total = {}, 0.0
    for line in (study / "events.jsonl").read_text().splitlines():
        event = json.loads(line)
        key = (event.get("set_index"), event.get("ordering"))
        if event["event"] == "unit_started":
            started[key] = event["time"]
        elif event["event"] == "unit_trained" and key in started:
            total += event["time"] - started.pop(key)
    return total


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sets", type=int, default=200, help="R: trials (one Ray trial per set)")
    parser.add_argument("--orderings", type=int, default=5, help="S: orderings per set")
    parser.add_argument("--slots", type=int, default=2, help="trials at once (the cores of this machine)")
    parser.add_argument("--profile", type=Path, default=None, help="write a cProfile of the driver's phase here")
    parser.add_argument("--keep", action="store_true", help="keep the temporary study folder")
    args = parser.parse_args()

    clock = DriverClock()
    clock.instrument()

    root = Path(tempfile.mkdtemp(prefix="gtep-bench-controller-"))
    try:
        resolved = resolve(study_config(root, args))
        console = Console(quiet=True)
        rss_before = rss_mib()
        tic = time.perf_counter()
        with ray_search.ray_session(None):
            ray_started = time.perf_counter()
            if args.profile:
                import cProfile

                profiler = cProfile.Profile()
                outcome = profiler.runcall(phases.tune_phase, resolved, console)
                profiler.dump_stats(str(args.profile))
            else:
                outcome = phases.tune_phase(resolved, console)
            phase_end = time.perf_counter()
            rss_after, rss_peak = rss_mib(), rss_mib("VmHWM")
        shut_down = time.perf_counter()

        study = outcome.paths.root
        units = json.loads(outcome.paths.manifest.read_text())["units"]
        n = len(units)
        own = sum(float(u.get("train_seconds") or 0.0) for u in units.values())
        wall = phase_end - ray_started
        in_units = worker_seconds(study)
        callbacks = clock.seconds.get("callbacks", 0.0)
        overhead_ms = (wall - own / args.slots) / n * 1000
        print(f"{n} units ({args.sets} sets x {args.orderings} orderings) of the no-op learner, {args.slots} slots")
        print(f"ray start {ray_started - tic:.1f} s, tuning phase {wall:.1f} s, "
              f"ray shutdown {shut_down - phase_end:.1f} s")
        print(f"units' own run time (train_seconds): {own:.2f} s in all; workers inside units: {in_units:.1f} s "
              f"({in_units / n * 1000:.1f} ms/unit)")
        print(f"Tune loop in gtep's callbacks (journaling, manifest, progress): {callbacks:.1f} s = "
              f"{callbacks / n * 1000:.1f} ms/unit; by part, ms/unit (the MLflow parts are the writer thread's, "
              f"overlapped with the loop): {clock.parts(n)}")
        print(f"driver RSS: {rss_before:.0f} MiB before Ray, {rss_after:.0f} MiB after the phase "
              f"(peak {rss_peak:.0f} MiB)")
        if args.keep:
            print(f"study folder: {study}")
        print(f"overhead: {overhead_ms:.1f} ms/unit (target < 50)")
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
