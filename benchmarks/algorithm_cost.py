"""Training time per task of each ResNet algorithm relative to Replay, on one scenario and one recipe.

Every algorithm runs the same ordering with the same common hyperparameters (its own at their
`original` values), one after another in this process, so the ratios hold on a noisy machine. Prints a
table and, as the last line, the largest ratio.

    .venv/bin/python benchmarks/algorithm_cost.py [--dataset npz:../shared/data/tinyimagenet200_32.npz]
"""
from __future__ import annotations

import argparse

import numpy as np
import torch

from gtep.data import resolve_dataset
from gtep.engine import FirstTaskSpec, OrderingJob, run_ordering
from gtep.spaces import load_space

RESNET_METHODS = ["replay", "icarl", "bic", "wa", "podnet", "der", "foster", "beef", "memo"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dataset", default="npz:../shared/data/tinyimagenet200_32.npz")
    parser.add_argument("--classes", type=int, default=15)
    parser.add_argument("--increments", default="5,5,5")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--backbone", default="resnet8")
    args = parser.parse_args()
    torch.set_num_threads(1)
    data = resolve_dataset(args.dataset).load()
    increments = tuple(int(v) for v in args.increments.split(","))
    common = {"epochs": args.epochs, "lr": 0.05, "batch_size": 64, "scheduler": "cosine", "weight_decay": 5e-4}
    rows = []
    for name in RESNET_METHODS:
        own = {k: v for k, v in load_space(name).presets["original"].items() if k not in common and k != "milestones"
               and k not in ("milestone_num", "lr_decay")}
        # the methods' own epoch counts (compression, fusion, fine-tuning) follow the same short budget
        own = {k: min(v, args.epochs) if "epochs" in k and isinstance(v, int) else v for k, v in own.items()}
        job = OrderingJob(name, {**common, **own}, args.backbone, increments, tuple(range(args.classes)), seed=0,
                          ordering=0, memory_size=10 * args.classes,
                          first_task=FirstTaskSpec(epochs=args.epochs, milestones=(args.epochs,), batch_size=64))
        out = run_ordering(job, data)
        rows.append((name, out.task_seconds, out.params_total, out.params_trainable,
                     out.metrics.get("acc", float("nan"))))
    base = np.array(rows[0][1])
    print(f"{'algorithm':10s} {'task1 s':>8s} {'later s':>8s} {'x replay (later tasks)':>22s} {'params':>9s} "
          f"{'trainable':>9s} {'acc':>6s}")
    ratios = []
    for name, seconds, total, trainable, acc in rows:
        later = float(np.mean(seconds[1:]))
        ratio = later / float(np.mean(base[1:]))
        ratios.append(ratio)
        print(f"{name:10s} {seconds[0]:8.2f} {later:8.2f} {ratio:22.2f} {total:9,d} {trainable:9,d} {acc:6.3f}")
    print(f"max time per incremental task relative to replay: {max(ratios):.2f}")


if __name__ == "__main__":
    main()
