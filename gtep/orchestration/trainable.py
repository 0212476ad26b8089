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
import zlib
from pathlib import Path
from typing import Any, Callable

import ray
import torch
from ray import tune

from gtep.algorithms import ALGORITHMS
from gtep.config import ResolvedExperiment
from gtep.config.private import owner_only
from gtep.data import ImageSet, resolve_dataset
from gtep.engine import OrderingJob, run_ordering
from gtep.engine.checkpoint import checkpoints_every
from gtep.engine.device import GpuNotVisibleError, TrialDevice, trial_device
from gtep.engine.first_task import FirstTaskStore, first_task_key
from gtep.engine.loop import FitMode
from gtep.engine.orderings import run_orderings
from gtep.engine.runner import OrderingOutcome, hparams_reaching_first_task
from gtep.orchestration.study import write_atomic
from gtep.orchestration.trial_job import StudyFolders, TrialJob, trial_job
from gtep.protocol.criteria import CRITERIA, DEFAULT_CRITERION
from gtep.protocol.phases import Phase
from gtep.protocol.replay import first_task_unit

TaskHook = Callable[[int, OrderingOutcome], None]  # run_ordering's on_task_end


def _running_score(done: list[dict[str, Any]], criterion: str | None = None) -> float:
    """H*'s criterion (the HM of the mean Acc and mean AvgAcc by default) over the orderings so far; 0 once any
    diverged (a defined value for searchers such as Optuna, which would otherwise mark the trial failed;
    selection excludes it)."""
    if any(r["status"] == "diverged" for r in done):
        return 0.0
    chosen = CRITERIA.get(criterion) if criterion else DEFAULT_CRITERION
    means = [sum(float(r.get(name, math.nan)) for r in done) / len(done) for name in chosen.components]
    return chosen.combine(means)


def process_start_time() -> float | None:
    """When this process started (seconds since the epoch), from /proc; None where there is no /proc."""
    try:
        stat = Path("/proc/self/stat").read_text()
        ticks = int(stat.rsplit(")", 1)[1].split()[19])  # field 22, starttime, after the command's parentheses
        uptime = float(Path("/proc/uptime").read_text().split()[0])  # both since boot, to 10 ms
        return time.time() - (uptime - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return None


def log_event(job: TrialJob, event: str, **fields: Any) -> None:
    """One line per unit event in <study>/events.jsonl: what ran where, what was reused or resumed."""
    if job.folders is None:
        return
    append_event(job.folders.events, event, job.phase, job.folders.attempt, **fields)


def append_event(path: Path, event: str, phase: str, attempt: str, **fields: Any) -> None:
    """A line of <study>/events.jsonl, from a worker (its units) or the driver (its phases)."""
    line = json.dumps({"time": time.time(), "event": event, "phase": phase, "attempt": attempt, "pid": os.getpid(),
                       **fields})
    with open(path, "a") as fh:  # O_APPEND: short lines from many processes do not interleave
        fh.write(line + "\n")


def _node_id() -> str:
    try:
        return ray.get_runtime_context().get_node_id()
    except Exception:  # noqa: BLE001 - outside Ray (direct calls in tests)
        return ""


def ordering_job(hparams: dict[str, Any], s: int, job: TrialJob) -> OrderingJob:
    return job.ordering(hparams, s)


def first_task_store(job: TrialJob) -> FirstTaskStore | None:
    folders = job.folders
    return FirstTaskStore(folders.first_task_dir) if folders and folders.first_task_dir else None


def _train_unit(set_index: int, hparams: dict[str, Any], s: int, phase_data: ImageSet, job: TrialJob,
                checkpoint: Path | None, on_task_end: TaskHook | None = None,
                fit_mode: FitMode | None = None) -> dict[str, Any]:
    torch.set_num_threads(job.resources.threads)
    started_at = int(time.time() * 1000)  # the ordering run's start in MLflow (it is written after training)
    with checkpoints_every(job.checkpoint_every_seconds):  # tasks of milliseconds are not each saved
        outcome = run_ordering(ordering_job(hparams, s, job), phase_data, on_task_end=on_task_end,
                               checkpoint=checkpoint, first_tasks=first_task_store(job), fit_mode=fit_mode)
    record = {"status": outcome.status, **outcome.metrics}
    record.setdefault("acc", float("nan"))
    record.setdefault("avg_acc", float("nan"))
    record.update({
        "ordering": int(s), "set_index": int(set_index), "class_order": outcome.class_order,
        "acc_matrix": [[None if math.isnan(v) else v for v in row] for row in outcome.acc_matrix],
        "test_counts": outcome.test_counts, "task_seconds": outcome.task_seconds,
        "params_total": outcome.params_total, "params_trainable": outcome.params_trainable,
        "train_seconds": outcome.train_seconds, "images_trained": outcome.images_trained, "message": outcome.message,
        "resumed_tasks": outcome.resumed_tasks, "first_task": outcome.first_task,
        "node": _node_id(), "device": outcome.device, "started_at": started_at,
        "finished_at": int(time.time() * 1000),
    })
    return record


def run_unit(set_index: int, hparams: dict[str, Any], s: int, phase_data: ImageSet,
             job: TrialJob, on_task_end: TaskHook | None = None, fit_mode: FitMode | None = None) -> dict[str, Any]:
    """Train one (set, ordering) unit, or return its record when an earlier attempt finished it. `fit_mode`: how its
    fits run (plain by default; a fused trial's lockstep gives each unit its own); what it says of them is in the
    unit's record and its unit_trained event (`fit_mode`)."""
    name = unit_name(set_index, hparams, s)
    folders = job.folders
    unit_file = folders.unit_dir / f"{name}.json" if folders else None
    if unit_file is not None and unit_file.exists():
        log_event(job, "unit_reused", set_index=set_index, ordering=int(s), node=_node_id())
        # it reaches the driver now (a scheduler's or a replay's arrival order); its training seconds are the
        # file's, counted once per file however many sets share it (protocol.replay.spent_seconds)
        trained = json.loads(unit_file.read_text())
        return {**trained, "unit_file": name, "finished_at": int(time.time() * 1000),
                "trained_at": trained.get("finished_at")}  # what MLflow stamps it with (tracking.log_ordering)
    checkpoint = folders.checkpoint_dir / f"{name}.pt" if folders and folders.checkpoint_dir else None
    placed = placed_device(set_index, s, job)
    job = job.on_device(placed.device)
    log_event(job, "unit_started", set_index=set_index, ordering=int(s), node=_node_id(),
              checkpoint=bool(checkpoint and checkpoint.exists()), gpu_ids=list(placed.gpu_ids), device=placed.device)
    record = {**_train_unit(set_index, hparams, int(s), phase_data, job, checkpoint, on_task_end, fit_mode),
              "unit_file": name, "gpu_ids": ",".join(placed.gpu_ids)}
    if fit_mode is not None:
        record["fit_mode"] = fit_mode.report()
    if placed.simulated:  # what MLflow's gtep.device says: the CPU it ran on, and the GPUs it stood in for
        record["device"] = f"{record['device']} (simulating GPU {record['gpu_ids']})"
    if unit_file is not None:
        write_atomic(unit_file, json.dumps(record))
    if checkpoint is not None and checkpoint.exists():
        checkpoint.unlink()  # the unit file is the record now; checkpoints can be large (RanPAC)
    log_event(job, "unit_trained", set_index=set_index, ordering=int(s), node=record["node"],
              resumed_tasks=record["resumed_tasks"], status=record["status"], first_task=record["first_task"],
              gpu_ids=list(placed.gpu_ids), images_trained=record.get("images_trained"),
              train_seconds=record.get("train_seconds"), fit_mode=record.get("fit_mode", {"mode": "plain"}))
    return record


def ray_gpu_ids() -> list[str]:
    """The GPU ids Ray gave this trial or task (its CUDA_VISIBLE_DEVICES); none outside Ray."""
    if not ray.is_initialized():
        return []
    return [str(i) for i in ray.get_gpu_ids()]


def placed_device(set_index: int, s: int, job: TrialJob) -> TrialDevice:
    """The unit's device from the GPUs Ray gave it (engine.device.trial_device). A GPU torch cannot see, with no
    simulation asked for, is logged as the unit's failure with its one-line reason before the trial fails."""
    try:
        return trial_device(job.scenario.device, ray_gpu_ids(), torch.cuda.is_available(), job.simulate_gpus)
    except GpuNotVisibleError as err:
        log_event(job, "unit_failed", set_index=set_index, ordering=int(s), node=_node_id(), message=str(err))
        raise


def unit_name(set_index: int, hparams: dict[str, Any], s: int) -> str:
    """The unit file's name: `set007-o2` for a set the study sampled up front; a set an adaptive searcher
    suggests has no index inside the trial, so its values name it (`hp1a2b3c4d-o2`): two suggestions of the
    same values share their units (same set, same ordering: the same result), two different sets never do."""
    if set_index >= 0:
        return f"set{set_index:03d}-o{int(s)}"
    return f"hp{trial_start(set_index, hparams):08x}-o{int(s)}"


def next_ordering(pending: list[int], hparams: dict[str, Any], job: TrialJob, start: int = 0) -> int:
    """The pending ordering to run next: one whose first task is stored, else one nobody trains, else wait on
    one. Concurrent trials so train different first tasks instead of queueing on one; each trial looks from
    its own `start` on, since trials starting together all see every first task free (a trial that looked
    from ordering 0 too would wait for the other's task 1 instead of training the next one)."""
    store = first_task_store(job)
    algorithm = ALGORITHMS.get(job.scenario.algorithm)
    if store is None or len(pending) == 1 or not algorithm.fixed_first_task:
        return pending[0]
    span = max(pending) + 1
    rotated = sorted(pending, key=lambda s: (s - start) % span)
    states = {}
    for s in rotated:
        spec = ordering_job(hparams, s, job)
        states[s] = store.state(first_task_key(spec, spec.dataset, hparams_reaching_first_task(algorithm, spec)))
    for wanted in ("ready", "free"):
        for s in rotated:
            if states[s] == wanted:
                return s
    return rotated[0]


def trial_start(set_index: int, hparams: dict[str, Any]) -> int:
    """Where a trial starts looking for its next ordering: its set's index, or (sets suggested by an adaptive
    searcher have none yet) a hash of its values that is the same in every process."""
    if set_index >= 0:
        return set_index
    return zlib.crc32(json.dumps(hparams, sort_keys=True, default=str).encode())


def partial_unit(outcome: OrderingOutcome, tasks_done: int) -> dict[str, Any]:
    """An unfinished ordering as a unit for the running score: Acc and AvgAcc of its first tasks (the accuracy
    matrix cut as the first-task protocol cuts it)."""
    if outcome.diverged:
        return {"status": "diverged", "acc": 0.0, "avg_acc": 0.0}
    unit = {"status": "finished", "acc_matrix": outcome.acc_matrix, "test_counts": outcome.test_counts,
            "task_seconds": outcome.task_seconds}
    return first_task_unit(unit, tasks_done)


def interim_reporter(done: list[dict[str, Any]], tasks: int, job: TrialJob) -> TaskHook:
    """search.fidelity tasks: after each task of an ordering but its last (whose unit is reported whole), the
    running score over the finished orderings and this one so far, at progress k + t/T (the schedulers' time) and
    tasks_done k*T + t (a pruner's step), with the training seconds of the unfinished ordering."""
    def on_task_end(task_index: int, outcome: OrderingOutcome) -> None:
        t = task_index + 1
        if t >= tasks:
            return
        partial = partial_unit(outcome, t)
        tune.report({"interim": True, "orderings_done": len(done), "tasks_done": len(done) * tasks + t,
                     "progress": len(done) + t / tasks, "score": _running_score([*done, partial], job.criterion),
                     "partial_seconds": float(sum(outcome.task_seconds))})
    return on_task_end


class HeldUnits:
    """A trial's finished units not reported yet: reported together once `every_seconds` have passed since the last
    report, and at the trial's last unit (TrialJob.report_every_seconds). A trial whose ordering raises reports
    what it holds before the error goes on (train_set), so the study still sees the orderings that finished; a
    unit held by a trial that is killed outright is not lost either: its unit file is written, and the trial's
    retry or a resume reports it (run_unit reuses it)."""

    def __init__(self, every_seconds: float) -> None:
        self.every_seconds = every_seconds
        self.units: list[dict[str, Any]] = []
        self.last_report = time.monotonic()

    def take(self, unit: dict[str, Any], last: bool) -> list[dict[str, Any]]:
        """The units to report now, this one last; none while they may still be held."""
        self.units.append(unit)
        if not last and time.monotonic() - self.last_report < self.every_seconds:
            return []
        return self.release()

    def release(self) -> list[dict[str, Any]]:
        """Every held unit, now (the trial's last report, or its ordering raised)."""
        units, self.units, self.last_report = self.units, [], time.monotonic()
        return units


def train_set(config: dict[str, Any], phase_data: ImageSet, job: TrialJob) -> None:
    """config: {"trial": {"set_index": i, "hparams": {...}} or "hparams": {...}, "orderings": [s, ...]};
    job: everything fixed for the phase (gtep/orchestration/trial_job.py). With `resources.parallel` > 1, that
    many orderings run at once as Ray tasks in the trial's placement group."""
    unit = config.get("trial", config)
    set_index = int(unit.get("set_index", -1))
    hparams = dict(unit["hparams"])
    pending = [int(s) for s in config["orderings"]]
    start = trial_start(set_index, hparams)
    done: list[dict[str, Any]] = []

    tasks = job.tasks

    held = HeldUnits(job.report_every_seconds)

    def send(units: list[dict[str, Any]]) -> None:
        if units:  # the earlier units ride along; the driver logs each as it would have alone
            tune.report({**units[-1], "earlier_units": units[:-1], "orderings_done": len(done),
                         "tasks_done": len(done) * tasks, "progress": float(len(done)),
                         "score": _running_score(done, job.criterion)})

    def report(record: dict[str, Any], last: bool) -> None:
        done.append(record)
        send(held.take(record, last))

    try:
        with owner_only():  # on a Ray that gtep did not start too: units, events, checkpoints, first tasks 0600/0700
            # when the trial began and when its worker process did: a phase's start, taken apart (paper_scale.py)
            log_event(job, "trial_started", set_index=set_index, process_started=process_start_time())
            _train_orderings(pending, set_index, hparams, start, phase_data, job, done, report)
    except Exception:
        send(held.release())  # the orderings that finished count for the set's status (never for its score)
        raise


def _train_orderings(pending: list[int], set_index: int, hparams: dict[str, Any], start: int,
                     phase_data: ImageSet, job: TrialJob, done: list[dict[str, Any]],
                     report: Callable[[dict[str, Any], bool], None]) -> None:
    """Trains a set's pending orderings, one at a time or `resources.parallel` at once, reporting each unit."""
    tasks = job.tasks
    parallel = job.resources.parallel
    if job.fuse_orderings and len(pending) > 1:
        _train_fused(pending, set_index, hparams, phase_data, job, report)
        return
    if parallel <= 1:
        per_task = interim_reporter(done, tasks, job) if job.fidelity == "tasks" else None
        while pending:
            s = next_ordering(pending, hparams, job, start)
            pending.remove(s)
            report(run_unit(set_index, hparams, s, phase_data, job, per_task), not pending)  # last?
        return
    remote = ray.remote(run_unit).options(num_cpus=job.resources.cpus_per_ordering,
                                          num_gpus=job.resources.gpus_per_ordering,
                                          max_retries=0)
    data_ref = ray.put(phase_data)
    running: dict[Any, int] = {}
    while pending or running:
        while pending and len(running) < parallel:
            s = next_ordering(pending, hparams, job, start)
            pending.remove(s)
            running[remote.remote(set_index, hparams, s, data_ref, job)] = s
        ready, _ = ray.wait(list(running), num_returns=1)
        for ref in ready:
            running.pop(ref)
            report(ray.get(ref), not pending and not running)  # the trial's last unit


def _train_fused(pending: list[int], set_index: int, hparams: dict[str, Any], phase_data: ImageSet, job: TrialJob,
                 report: Callable[[dict[str, Any], bool], None]) -> None:
    """The set's pending orderings trained as one fused network (gtep/engine/fusion.py): each ordering's unit runs
    as it runs alone (its unit file, checkpoint, first task and events), their fits fused; the units are reported
    in ordering order once all have finished (no per-task interim reports)."""
    from functools import partial

    def unit(s: int, fit_mode: FitMode) -> dict[str, Any]:
        return run_unit(set_index, hparams, s, phase_data, job, fit_mode=fit_mode)

    records = run_orderings([partial(unit, s) for s in pending], "fused", job.scenario.algorithm,
                            [f"ordering {s}" for s in pending])
    for i, record in enumerate(records):
        report(record, i == len(records) - 1)


def trainable_for(resolved: ResolvedExperiment, phase: Phase, folders: StudyFolders) -> Any:
    """The phase's Ray trainable (`phase` its record, as the runner holds it): train_set with the phase's data and
    job, and the resources a trial takes."""
    spec = resolved.phase(phase)
    # the phase's classes, and those its family's scenario shows besides them (FLUID's pretrain classes)
    extra = resolved.family.data_classes(resolved.config.scenario.family_options)
    data = resolve_dataset(spec.dataset).load().subset(sorted({*spec.classes, *extra}))
    compute = resolved.config.compute
    job = trial_job(resolved, phase, folders)
    # with_parameters puts the decoded arrays in Ray's object store once; trials on a node share them
    trainable = tune.with_parameters(train_set, phase_data=data, job=job)
    resources = job.resources
    if resources.parallel > 1:
        # The trial itself only waits; its orderings run as Ray tasks in bundles of the trial's placement group.
        ordering: dict[str, int | float] = {"CPU": resources.cpus_per_ordering, "GPU": resources.gpus_per_ordering}
        bundles: list[dict[str, int | float]] = [{"CPU": 0}]
        bundles += [{k: v for k, v in ordering.items() if v}] * resources.parallel
        return tune.with_resources(trainable, tune.PlacementGroupFactory(bundles))
    return tune.with_resources(trainable, {"cpu": compute.cpus_per_trial, "gpu": compute.gpus_per_trial})
