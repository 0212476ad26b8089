"""The Ray Tune trainable: one hyperparameter set over its class orderings, one report per ordering.

Fault tolerance lives here, on the study's (shared) storage: every finished ordering leaves a unit file
that a retried trial or a resumed study reports again instead of training again, and every running
ordering keeps a checkpoint of its last finished task to continue from.
"""
from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any

import ray
import torch
from ray import tune

from gtep.data import ImageSet
from gtep.engine import FirstTaskSpec, OrderingJob, run_ordering
from gtep.orchestration.study import write_atomic
from gtep.protocol.metrics import harmonic_mean


def _running_score(done: list[dict[str, Any]]) -> float:
    """HM of the mean Acc and mean AvgAcc over the orderings so far; 0 once any diverged (a defined value
    for searchers such as Optuna, which would otherwise mark the trial failed; selection excludes it)."""
    if any(r["status"] == "diverged" for r in done):
        return 0.0
    acc = sum(r["acc"] for r in done) / len(done)
    avg = sum(r["avg_acc"] for r in done) / len(done)
    return harmonic_mean(acc, avg)


def log_event(job: dict[str, Any], event: str, **fields: Any) -> None:
    """One line per unit event in <study>/events.jsonl: what ran where, what was reused or resumed."""
    if not job.get("events"):
        return
    line = json.dumps({"time": time.time(), "event": event, "phase": job.get("phase"), "attempt": job.get("attempt"),
                       "pid": os.getpid(), **fields})
    with open(job["events"], "a") as fh:  # O_APPEND: short lines from many workers do not interleave
        fh.write(line + "\n")


def _node_id() -> str:
    try:
        return ray.get_runtime_context().get_node_id()
    except Exception:  # noqa: BLE001 - outside Ray (direct calls in tests)
        return ""


def _train_unit(set_index: int, hparams: dict[str, Any], s: int, phase_data: ImageSet, job: dict[str, Any],
                checkpoint: Path | None) -> dict[str, Any]:
    spec = OrderingJob(
        algorithm=job["algorithm"], hparams=dict(hparams), backbone=job["backbone"],
        increments=tuple(job["increments"]), classes=tuple(job["classes"]), seed=job["seed"], ordering=int(s),
        memory_size=job["memory_size"], first_task=FirstTaskSpec(**job["first_task"]),
        epoch_scale=job["epoch_scale"], augment=job["augment"], device=job["device"], weights=job.get("weights"),
    )
    outcome = run_ordering(spec, phase_data, checkpoint=checkpoint)
    record = {"status": outcome.status, **outcome.metrics}
    record.setdefault("acc", float("nan"))
    record.setdefault("avg_acc", float("nan"))
    record.update({
        "ordering": int(s), "set_index": int(set_index), "class_order": outcome.class_order,
        "acc_matrix": [[None if math.isnan(v) else v for v in row] for row in outcome.acc_matrix],
        "test_counts": outcome.test_counts, "task_seconds": outcome.task_seconds,
        "params_total": outcome.params_total, "params_trainable": outcome.params_trainable,
        "train_seconds": outcome.train_seconds, "message": outcome.message,
        "resumed_tasks": outcome.resumed_tasks, "node": _node_id(), "finished_at": int(time.time() * 1000),
    })
    return record


def train_set(config: dict[str, Any], phase_data: ImageSet, job: dict[str, Any]) -> None:
    """config: {"trial": {"set_index": i, "hparams": {...}} or "hparams": {...}, "orderings": [s, ...]};
    job: everything fixed for the phase (algorithm, backbone, scenario, classes, seed, first task, and the
    study folders for unit files, checkpoints and events)."""
    unit = config.get("trial", config)
    set_index = int(unit.get("set_index", -1))
    torch.set_num_threads(max(1, int(job.get("threads", 1))))
    unit_dir = Path(job["unit_dir"]) if job.get("unit_dir") else None
    done: list[dict[str, Any]] = []
    for s in list(config["orderings"]):
        name = f"set{set_index:03d}-o{int(s)}"
        unit_file = unit_dir / f"{name}.json" if unit_dir else None
        if unit_file is not None and unit_file.exists():
            record = json.loads(unit_file.read_text())
            log_event(job, "unit_reused", set_index=set_index, ordering=int(s), node=_node_id())
        else:
            checkpoint = Path(job["checkpoint_dir"]) / f"{name}.pt" if job.get("checkpoint_dir") else None
            log_event(job, "unit_started", set_index=set_index, ordering=int(s), node=_node_id(),
                      checkpoint=bool(checkpoint and checkpoint.exists()))
            record = _train_unit(set_index, unit["hparams"], int(s), phase_data, job, checkpoint)
            if unit_file is not None:
                write_atomic(unit_file, json.dumps(record))
            if checkpoint is not None and checkpoint.exists():
                checkpoint.unlink()  # the unit file is the record now; checkpoints can be large (RanPAC)
            log_event(job, "unit_trained", set_index=set_index, ordering=int(s), node=record["node"],
                      resumed_tasks=record["resumed_tasks"], status=record["status"])
        done.append(record)
        tune.report({**record, "orderings_done": len(done), "score": _running_score(done)})
