"""Does a fused trial drift from its orderings run alone more than rounding does? (issue: one training loop)

The default study (preset `default`: Replay, ResNet-20, Omniglot, epoch_scale 0.1), set 0 of its tuning phase, its
S = 2 orderings, trained three ways on the CPU:

    plain        each ordering alone, 1 thread                       (the reference)
    control      each ordering alone, 2 threads                      (differs from plain only in rounding: a
                                                                      convolution's sums split across threads)
    fused        the two orderings as one fused network, 1 thread    (grouped convolutions: other summation order)

Task 1 (the fixed first-task recipe, 20 epochs) is compared epoch by epoch: the norm-relative distance of each
ordering's weights from the plain run's after every epoch, for the control and for the fused run, and the task-1
test accuracy of each (`--tasks 3`: the whole scenario, its Acc and AvgAcc too). Where the fused run's distance stays within a small
factor of the control's, epoch by epoch, the fused path differs from the plain one by rounding alone, which training
then amplifies as it amplifies the control's.

    python benchmarks/fusion_drift.py [--tasks 1] [--out benchmarks/results/fusion_drift.json]
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any, Sequence

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gtep.api import experiment  # noqa: E402
from gtep.config.resolution import resolve  # noqa: E402
from gtep.data import resolve_dataset  # noqa: E402
from gtep.engine import OrderingJob, run_ordering  # noqa: E402
from gtep.engine.fusion import FusedFit  # noqa: E402
from gtep.engine.loop import FitCall, FitMode, FitStep, PlainFit  # noqa: E402
from gtep.orchestration.trial_job import phase_scenario  # noqa: E402
from gtep.protocol.phases import TUNE  # noqa: E402
from gtep.protocol.sampling import sample_sets  # noqa: E402
from gtep.spaces import load_space  # noqa: E402


def weights_of(step: FitStep, lane: int, lanes: int) -> torch.Tensor:
    return torch.cat([(p[lane] if lanes > 1 else p).detach().flatten().float().clone() for p in step.params])


class WatchedPlain(PlainFit):
    """A plain fit that keeps the weights after every epoch of the unit's first fit (task 1's)."""

    def __init__(self) -> None:
        self.fits = 0
        self.epochs: list[list[torch.Tensor]] = [[]]

    def fit(self, call: FitCall) -> None:
        self.fits += 1
        self.run_plain(call)

    def end_epoch(self, epoch: int, calls: Sequence[FitCall], step: FitStep) -> None:
        if self.fits == 1:
            self.epochs[0].append(weights_of(step, 0, 1))


class WatchedFused(FusedFit):
    """A fused unit; the lockstep calls end_epoch on the group's first unit with every ordering's calls."""

    record: list[list[torch.Tensor]] = []
    done = False

    def end_epoch(self, epoch: int, calls: Sequence[FitCall], step: FitStep) -> None:
        if WatchedFused.done or len(calls) < 2:
            return
        if epoch == 0:
            WatchedFused.record = [[] for _ in calls]
        for lane in range(len(calls)):
            WatchedFused.record[lane].append(weights_of(step, lane, len(calls)))
        if epoch + 1 == calls[0].recipe.epochs:
            WatchedFused.done = True


def default_jobs(tasks: int | None) -> tuple[list[OrderingJob], Any]:
    cfg = experiment(preset="default")
    resolved = resolve(cfg)
    space = load_space(cfg.algorithm, resolved.space_path).space
    hparams = sample_sets(space, cfg.search.trials, cfg.seed)[0]
    scenario = phase_scenario(resolved, TUNE)
    spec = resolved.phase(TUNE)
    data = resolve_dataset(spec.dataset).load().subset(sorted(spec.classes))
    jobs = [replace(scenario, hparams=dict(hparams), ordering=s, device="cpu", max_tasks=tasks)
            for s in range(cfg.search.orderings)]
    return jobs, data


def summary(outcome: Any) -> dict[str, Any]:
    return {"acc": outcome.metrics.get("acc"), "avg_acc": outcome.metrics.get("avg_acc"),
            "task1_acc": outcome.acc_matrix[0][0], "images_trained": outcome.images_trained,
            "train_seconds": round(outcome.train_seconds, 2)}


def plain(jobs: list[OrderingJob], data: Any, threads: int) -> tuple[list[Any], list[list[torch.Tensor]]]:
    torch.set_num_threads(threads)
    outcomes, traces = [], []
    for job in jobs:
        mode = WatchedPlain()
        outcomes.append(run_ordering(job, data, fit_mode=mode))
        traces.append(mode.epochs[0])
    return outcomes, traces


def fused(jobs: list[OrderingJob], data: Any) -> tuple[list[Any], list[list[torch.Tensor]]]:
    torch.set_num_threads(1)
    WatchedFused.done, WatchedFused.record = False, []

    def unit(job: OrderingJob, mode: FitMode) -> Any:
        return run_ordering(job, data, fit_mode=mode)

    outcomes = WatchedFused.run_units([partial(unit, job) for job in jobs])
    return outcomes, WatchedFused.record


def distances(reference: list[torch.Tensor], other: list[torch.Tensor]) -> list[float]:
    return [float((a - b).norm() / a.norm()) for a, b in zip(reference, other)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "fusion_drift.json")
    parser.add_argument("--tasks", type=int, default=1, help="tasks of the scenario to train (1: task 1 only)")
    args = parser.parse_args(argv)
    jobs, data = default_jobs(args.tasks)
    tic = time.perf_counter()
    runs = {}
    for name, train in (("plain", partial(plain, threads=1)), ("control", partial(plain, threads=2)),
                        ("fused", fused)):
        runs[name] = train(jobs, data)
        print(f"{name}: done at {time.perf_counter() - tic:.0f} s", flush=True)
    again, _ = plain(jobs, data, 1)
    reference = runs["plain"][1]
    result: dict[str, Any] = {
        "command": f"python benchmarks/fusion_drift.py --tasks {args.tasks}",
        "study": "preset default (Replay, ResNet-20, omniglot-small, epoch_scale 0.1), tuning set 0, S = 2",
        "machine": {"cpu": platform.processor() or platform.machine(), "torch": torch.__version__},
        "plain_reproduces_itself": [a.acc_matrix == b.acc_matrix for a, b in zip(runs["plain"][0], again)],
        "task1_epochs": len(reference[0]),
        "drift": {name: [distances(ref, trace) for ref, trace in zip(reference, runs[name][1])]
                  for name in ("control", "fused")},
        "outcomes": {name: [summary(o) for o in outcomes] for name, (outcomes, _) in runs.items()},
        "seconds": round(time.perf_counter() - tic, 1),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    for s in range(len(jobs)):
        print(f"ordering {s}: norm-relative distance from the plain run after each task-1 epoch")
        print("  epoch  control (2 threads)  fused")
        for epoch, (c, f) in enumerate(zip(result["drift"]["control"][s], result["drift"]["fused"][s])):
            print(f"  {epoch + 1:5d}  {c:19.2e}  {f:.2e}")
    for name, rows in result["outcomes"].items():
        print(name, [{k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()} for row in rows])
    print("plain reproduces itself:", result["plain_reproduces_itself"], f"({result['seconds']} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
