"""Accuracy and speed of one method on a fixed small setting, over N seeds, to hold gtep against any toolbox.

Trains `--algorithm` on the first `--classes` classes of `--dataset`, split into tasks by `--increments`, once
per seed (seed s: the class ordering and the initial weights of ordering 0 of a study with seed s), with one
recipe for every task: `--epochs`, SGD at `--lr` (momentum 0.9), decayed 10x at 50% and 75% of the epochs,
`--weight-decay`, `--batch`. No Ray, no MLflow, no first-task sharing: the engine's ordering run alone, as
a trial runs it. Prints the accuracy on all classes seen after each task (Acc_t, in %) as mean +- std over
the seeds, the final Acc and AvgAcc, and the training images per second (images through `fit`, divided by
the time spent in `fit`). Run the other toolbox on the same classes, split, recipe and seeds and compare.

    .venv/bin/python benchmarks/fidelity.py --dataset npz:../shared/data/tinyimagenet200_32.npz \
        --algorithm replay --backbone resnet32 --classes 30 --increments 10x3 --seeds 3 --epochs 6
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

for _key, _value in (("RAY_AUTH_MODE", "disabled"), ("MLFLOW_SERVER_ENABLE_JOB_EXECUTION", "false"),
                     ("HF_HUB_OFFLINE", "1")):
    os.environ.setdefault(_key, _value)

import torch  # noqa: E402

from gtep.data import resolve_dataset  # noqa: E402
from gtep.engine.runner import FirstTaskSpec, OrderingJob, OrderingRun  # noqa: E402
from gtep.preflight.calibration import TimedFit  # noqa: E402
from gtep.protocol.scenarios import parse_increments  # noqa: E402


def job_for(args: argparse.Namespace, seed: int) -> OrderingJob:
    """One recipe for every task (the first included), so the setting is easy to reproduce elsewhere."""
    milestones = (max(1, args.epochs // 2), max(1, args.epochs * 3 // 4))
    hparams = {"epochs": args.epochs, "lr": args.lr, "batch_size": args.batch, "weight_decay": args.weight_decay,
               "scheduler": "steplr", "milestones": milestones, "optimizer": "sgd", "momentum": 0.9}
    first = FirstTaskSpec(epochs=args.epochs, lr=args.lr, milestones=milestones, lr_decay=0.1,
                          weight_decay=args.weight_decay, batch_size=args.batch, scheduler="steplr")
    increments = tuple(parse_increments(args.increments))
    return OrderingJob(args.algorithm, hparams, args.backbone, increments, tuple(range(args.classes)), seed=seed,
                       ordering=0, memory_size=args.memory, first_task=first, device=args.device,
                       dataset=args.dataset, **({"augment": args.augment} if args.augment else {}))


def run_seed(args: argparse.Namespace, data, seed: int) -> tuple[list[float], float, float]:
    """(Acc_t per task in %, images per second in fit, seconds) of one seed."""
    timed = TimedFit()  # the fit mode that sums the seconds spent in fits; the trainer counts their images
    run = OrderingRun(job_for(args, seed), data, timed)
    tic = time.perf_counter()
    for task in run.tasks:
        run.train_task(task)
        if run.outcome.diverged:
            raise SystemExit(f"seed {seed} diverged: {run.outcome.message}")
    outcome = run.finish()
    images_per_second = run.trainer.images_trained / timed.seconds
    return [100 * a for a in outcome.metrics["acc_t"]], images_per_second, time.perf_counter() - tic


def mean_std(values: list[float]) -> str:
    spread = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):6.2f} +- {spread:5.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", default="npz:../shared/data/tinyimagenet200_32.npz")
    parser.add_argument("--algorithm", default="replay")
    parser.add_argument("--backbone", default="resnet32")
    parser.add_argument("--classes", type=int, default=30, help="use classes 0..N-1 of the dataset")
    parser.add_argument("--increments", default="10x3", help="classes per task, e.g. 10x3 or C20xT1+C5xT2")
    parser.add_argument("--seeds", type=int, default=3, help="seeds 0..N-1")
    parser.add_argument("--epochs", type=int, default=6, help="epochs of every task")
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--weight-decay", type=float, default=5e-4)
    parser.add_argument("--memory", type=int, default=300, help="exemplars in total")
    parser.add_argument("--augment", default=None,
                        help="training.augment of the experiment file (default: the dataset's)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (a trial with one CPU uses 1)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    data = resolve_dataset(args.dataset).load().subset(list(range(args.classes)))

    rows, rates, seconds = [], [], []
    for seed in range(args.seeds):
        acc_t, rate, took = run_seed(args, data, seed)
        rows.append(acc_t)
        rates.append(rate)
        seconds.append(took)
        print(f"seed {seed}: Acc_t " + " ".join(f"{a:5.1f}" for a in acc_t) + f"  ({rate:.0f} images/s, {took:.0f} s)",
              flush=True)
    print(f"{args.algorithm} on {args.backbone}, {args.dataset} classes 0-{args.classes - 1}, tasks {args.increments}, "
          f"{args.epochs} epochs/task, lr {args.lr}, batch {args.batch}, memory {args.memory}, {args.seeds} seeds, "
          f"{args.device}, {torch.get_num_threads()} thread(s)")
    for t, column in enumerate(zip(*rows)):
        print(f"after task {t + 1}: Acc {mean_std(list(column))} %")
    avg = [statistics.mean(r) for r in rows]
    print(f"final Acc {mean_std([r[-1] for r in rows])} %, AvgAcc {mean_std(avg)} %")
    print(f"training speed: {mean_std(rates)} images/s; {statistics.mean(seconds):.0f} s per seed")


if __name__ == "__main__":
    main()
