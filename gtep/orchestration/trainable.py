"""The Ray Tune trainable: one hyperparameter set over its class orderings, one report per ordering."""
from __future__ import annotations

import math
from typing import Any

import torch
from ray import tune

from gtep.data import ImageSet
from gtep.engine import FirstTaskSpec, OrderingJob, run_ordering
from gtep.protocol.metrics import harmonic_mean


def _running_score(done: list[dict[str, Any]]) -> float:
    """HM of the mean Acc and mean AvgAcc over the orderings so far; 0 once any diverged (a defined value
    for searchers such as Optuna, which would otherwise mark the trial failed; selection excludes it)."""
    if any(r["status"] == "diverged" for r in done):
        return 0.0
    acc = sum(r["acc"] for r in done) / len(done)
    avg = sum(r["avg_acc"] for r in done) / len(done)
    return harmonic_mean(acc, avg)


def train_set(config: dict[str, Any], phase_data: ImageSet, job: dict[str, Any]) -> None:
    """config: {"trial": {"set_index": i, "hparams": {...}} or "hparams": {...}, "orderings": [s, ...]};
    job: everything fixed for the phase (algorithm, backbone, scenario, classes, seed, first task...)."""
    unit = config.get("trial", config)
    torch.set_num_threads(max(1, int(job.get("threads", 1))))
    done: list[dict[str, Any]] = []
    orderings = list(config["orderings"])
    for s in orderings:
        spec = OrderingJob(
            algorithm=job["algorithm"], hparams=dict(unit["hparams"]), backbone=job["backbone"],
            increments=tuple(job["increments"]), classes=tuple(job["classes"]), seed=job["seed"], ordering=int(s),
            memory_size=job["memory_size"], first_task=FirstTaskSpec(**job["first_task"]),
            epoch_scale=job["epoch_scale"], augment=job["augment"], device=job["device"], weights=job.get("weights"),
        )
        outcome = run_ordering(spec, phase_data)
        record = {"status": outcome.status, **{k: v for k, v in outcome.metrics.items()}}
        record.setdefault("acc", float("nan"))
        record.setdefault("avg_acc", float("nan"))
        done.append(record)
        score = _running_score(done)
        tune.report({
            **record,
            "ordering": int(s),
            "set_index": int(unit.get("set_index", -1)),
            "class_order": outcome.class_order,
            "acc_matrix": [[None if math.isnan(v) else v for v in row] for row in outcome.acc_matrix],
            "test_counts": outcome.test_counts,
            "task_seconds": outcome.task_seconds,
            "params_total": outcome.params_total,
            "params_trainable": outcome.params_trainable,
            "train_seconds": outcome.train_seconds,
            "message": outcome.message,
            "orderings_done": len(done),
            "score": score,
        })
