"""What a phase hands each of its Ray trials, as one typed, frozen object (the trainable: trainable.py).

A trial's job is the engine's own `OrderingJob` for the phase (hparams and ordering filled per unit), the
resources each ordering takes, the study folders where units, checkpoints, first tasks and events live, and the
two values the running score needs. Every field is set from the resolved config here: nothing is read back
from string keys with a default that would hide a missing one.
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gtep.algorithms import ALGORITHMS
from gtep.config import ResolvedExperiment
from gtep.engine import FirstTaskSpec, OrderingJob
from gtep.engine.device import choose_device
from gtep.engine.fusion import fusion_wanted
from gtep.orchestration.study import StudyPaths
from gtep.protocol.phases import Phase, as_phase


@dataclass(frozen=True)
class OrderingResources:
    """How many orderings of a trial run at once, and what each of them takes (threads included)."""

    parallel: int
    cpus_per_ordering: float
    gpus_per_ordering: float
    threads: int


@dataclass(frozen=True)
class StudyFolders:
    """Where trials leave finished units, checkpoints and events: the study folder, shared by all nodes."""

    unit_dir: Path
    events: Path
    attempt: str
    checkpoint_dir: Path | None = None
    first_task_dir: Path | None = None


@dataclass(frozen=True)
class TrialJob:
    """Everything fixed for a phase's trials. `scenario` is the engine's job with no hparams and ordering 0."""

    phase: str
    scenario: OrderingJob
    criterion: str
    fidelity: str  # "tasks": a running score after each task too (search.fidelity, tuning phase only)
    resources: OrderingResources
    folders: StudyFolders | None = None
    # units finished within this many seconds of the last report go to the driver in one report (0: each alone)
    report_every_seconds: float = 0.0
    # an ordering's per-task checkpoint once this many seconds have passed since its last (0: after every task)
    checkpoint_every_seconds: float = 0.0
    # compute.simulate_gpus: a trial given GPUs that torch cannot see trains on the CPU (engine.device.trial_device)
    simulate_gpus: bool = False
    # compute.fuse_orderings as it applies to this phase's trials: the orderings trained as one fused network
    fuse_orderings: bool = False

    def ordering(self, hparams: dict[str, Any], s: int) -> OrderingJob:
        """The engine's job for one (set, ordering) unit."""
        return dataclasses.replace(self.scenario, hparams=dict(hparams), ordering=int(s))

    def on_device(self, device: str) -> "TrialJob":
        """This job with its units trained on `device` (a trial whose GPUs are simulated: 'cpu')."""
        if device == self.scenario.device:
            return self
        return dataclasses.replace(self, scenario=dataclasses.replace(self.scenario, device=device))

    @property
    def tasks(self) -> int:
        """T of an ordering: the scenario's tasks, or k with the first-task protocol."""
        return int(self.scenario.max_tasks or len(self.scenario.increments))


def ordering_resources(resolved: ResolvedExperiment) -> OrderingResources:
    compute = resolved.config.compute
    parallel = compute.parallel_orderings(resolved.config.search.orderings)
    cpus = compute.cpus_per_ordering or compute.cpus_per_trial
    gpus = compute.gpus_per_ordering if compute.gpus_per_ordering is not None else compute.gpus_per_trial
    if parallel == 1:
        cpus, gpus = compute.cpus_per_trial, compute.gpus_per_trial
    return OrderingResources(parallel, cpus, gpus, max(1, int(cpus)))


def study_folders(resolved: ResolvedExperiment, paths: StudyPaths, phase: Phase, attempt: str) -> StudyFolders:
    tag = f"{phase.name}-{attempt}"
    return StudyFolders(
        unit_dir=paths.root / "units" / tag, events=paths.root / "events.jsonl", attempt=attempt,
        checkpoint_dir=paths.root / "checkpoints" / tag if resolved.config.compute.checkpoints else None,
        first_task_dir=paths.first_tasks if resolved.config.training.reuse_first_task else None)


def trials_device(resolved: ResolvedExperiment) -> str:
    """The device the driver names for the study's trials (engine.device.choose_device: 'auto' is CUDA for a trial
    with GPUs, the CPU for one without); whether torch sees it is the worker's to check (trainable.placed_device)."""
    cfg = resolved.config
    return choose_device(cfg.training.device, None, trial_gpus=cfg.compute.gpus_per_trial)


def phase_scenario(resolved: ResolvedExperiment, phase: Phase) -> OrderingJob:
    """The engine's job of the phase, every field from the config (hparams and ordering set per unit)."""
    cfg = resolved.config
    device = trials_device(resolved)
    spec = resolved.phase(phase)
    first_task = FirstTaskSpec(**{**cfg.first_task.model_dump(), "milestones": tuple(cfg.first_task.milestones)})
    family_options = {k: v for k, v in cfg.scenario.family_options.items() if k != "increments"}
    return OrderingJob(
        algorithm=cfg.algorithm, hparams={}, backbone=cfg.backbone, increments=tuple(resolved.increments),
        classes=tuple(spec.classes), seed=cfg.seed, ordering=0, memory_size=cfg.training.memory_size,
        first_task=first_task, epoch_scale=cfg.training.epoch_scale, augment=resolved.pipeline(phase).describe(),
        device=device, weights=str(Path(resolved.weights).resolve()) if resolved.weights else None,
        dataset=spec.dataset, mixed_precision=cfg.training.mixed_precision, compile=cfg.training.compile,
        family=cfg.scenario.family, family_options=tuple(sorted(family_options.items())),
        # the first-task protocol (Lee et al. 2024): the tuning phase compares sets on the first k tasks only
        max_tasks=cfg.search.protocol_tasks if phase.selects_best and cfg.search.protocol == "first_task"
        else None)


def trial_job(resolved: ResolvedExperiment, phase: Phase | str, folders: StudyFolders | None = None) -> TrialJob:
    """What every trial of the phase (its record, or its name) shares; `folders` are the study's unit, checkpoint
    and event paths. The job carries the phase's name, as the unit files and the store do."""
    search = resolved.config.search
    phase = as_phase(phase)
    return TrialJob(phase=phase.name, scenario=phase_scenario(resolved, phase), criterion=resolved.criterion.name,
                    fidelity=search.fidelity if phase.selects_best else "orderings",
                    resources=ordering_resources(resolved), folders=folders,
                    report_every_seconds=report_every_seconds(resolved, phase),
                    checkpoint_every_seconds=max(0.0, float(os.environ.get("GTEP_CHECKPOINT_EVERY_SECONDS", 10.0))),
                    simulate_gpus=resolved.config.compute.simulate_gpus,
                    fuse_orderings=fused_orderings(resolved))


def fused_orderings(resolved: ResolvedExperiment) -> bool:
    """Whether a trial's orderings train as one fused network (compute.fuse_orderings; gtep/engine/fusion.py)."""
    cfg = resolved.config
    return fusion_wanted(cfg.compute.fuse_orderings, ALGORITHMS.get(cfg.algorithm), trials_device(resolved),
                         cfg.compute.parallel_orderings(cfg.search.orderings))


def report_every_seconds(resolved: ResolvedExperiment, phase: Phase) -> float:
    """How long a trial may hold finished units before reporting them. A function trainable's `tune.report` waits
    until the driver has taken the result: one round trip per unit, a third of a trial's time when units take a
    tenth of a second (the paper-scale rehearsal). Units that train for a second or more are reported one by one
    as before; a scheduler or a pruner, which decide after every ordering, always get every ordering alone.
    GTEP_REPORT_EVERY_SECONDS, 1 by default; 0 reports every unit alone."""
    search = resolved.config.search
    decides_per_ordering = phase.selects_best and (search.scheduler != "none" or search.pruner != "none"
                                                or search.fidelity == "tasks")
    return 0.0 if decides_per_ordering else max(0.0, float(os.environ.get("GTEP_REPORT_EVERY_SECONDS", 1.0)))


