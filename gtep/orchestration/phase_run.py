"""One function runs any phase (run_phase), from its record (gtep/protocol/phases.py) and a PhaseRunner's hooks.

The shape every phase shares: check resources, open the study, reuse a finished phase or resume a running one, open
the journal and the phase run (begin_phase), mark the phase running in the manifest, train on Ray Tune with the MLflow
writer and a progress bar, record an interruption as such, close the trial runs that did not finish, then finish.
A runner says only what differs: what it trains (PhaseRunner.plan: the sets, the parameter space, the writer's
arguments, the manifest's fields) and how it ends (PhaseRunner.finish: select H*, summarize one set, rank every set);
the steps every phase ends with (results CSV, manifest, the phase run's metrics, files and end, the journal) are
PhaseRun's, written once.

A phase's runner is found through one mapping, RUNNERS (phase name -> a factory of its runner), so a study's plan
(gtep/protocol/phases.py, study_phases) runs phase by phase with run_plan (gtep/orchestration/study_plan.py).
"""
from __future__ import annotations

import hashlib
import json
import shutil
import signal
import uuid
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import pandas as pd
from rich.console import Console

from gtep.config import ConfigError, ResolvedExperiment
from gtep.errors import StudyStopped
from gtep.orchestration.interrupt import Interruption, StudyInterrupted
from gtep.orchestration.journal import TrackingJournal
from gtep.orchestration.ray_search import ProgressCallback, check_resources, progress_bar, run_trials
from gtep.orchestration.study import Manifest, StudyPaths, full_units
from gtep.orchestration.tracking import UNITS_TAG, MlflowWriter, family_extra_metrics, scenario_tags
from gtep.orchestration.tracking_store import finish_journal, open_journal
from gtep.orchestration.trainable import append_event, trainable_for
from gtep.orchestration.trial_job import study_folders
from gtep.protocol.families import ScenarioFamily
from gtep.protocol.phases import Phase
from gtep.protocol.replay import spent_seconds
from gtep.protocol.selection import SetScore
from gtep.registry import Registry


@dataclass
class PhaseOutcome:
    phase: str
    run_id: str
    set_index: int
    hparams: dict[str, Any]
    summary: dict[str, float]
    paths: StudyPaths
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class PhasePlan:
    """What a phase trains, decided before its run starts.

    sets: the sets it trains (None: every set the manifest holds when Ray returns; an adaptive searcher adds them).
    total_units: (set, ordering) units in all, for the progress bar and an interruption's count.
    param_space, search_alg, num_samples: the Ray Tune search (search_alg None: the grid of param_space).
    set_of_trial, hparams_of, trial_label: the MLflow writer's (which set a trial trains, its values, its name).
    run_tags: the phase run's tags (with the caller's); hparams: the set a fixed-set phase logs as the run's params.
    manifest_fields: what the manifest's phase entry records beside its run, attempt, status and data.
    resume: continue the phase's last attempt (its finished units are reused) rather than start a new one."""

    sets: list[int] | None
    total_units: int
    param_space: dict[str, Any]
    set_of_trial: Callable[[Any], int]
    hparams_of: Callable[[int], dict[str, Any]]
    progress_label: str
    resume: bool
    run_tags: dict[str, str] = field(default_factory=dict)
    hparams: dict[str, Any] | None = None
    manifest_fields: dict[str, Any] = field(default_factory=dict)
    trial_label: Callable[[int], str] | None = None
    search_alg: Any = None
    num_samples: int = 1


@dataclass
class PhaseRun:
    """A phase whose trials have returned, as its runner's finish hook sees it; `close` ends it as every phase
    ends."""

    phase: Phase
    resolved: ResolvedExperiment
    console: Console
    paths: StudyPaths
    manifest: Manifest
    journal: TrackingJournal
    writer: MlflowWriter
    plan: PhasePlan
    attempt: str
    run_id: str
    sets: list[int]
    stopped: list[int] = field(default_factory=list)

    @property
    def phase_key(self) -> str:
        return f"{self.phase.name}:{self.attempt}"

    @property
    def results_file(self) -> Path:
        return self.paths.results(self.phase)

    def close(self, units: list[dict[str, Any]], hparams_of: Callable[[int], dict[str, Any]], scores: list[SetScore],
              status: str, metrics: dict[str, float], run_status: str,
              steps: list[tuple[str, float, int]] | None = None, params: dict[str, Any] | None = None,
              tags: dict[str, str] | None = None, files: tuple[Path, ...] = (), **manifest_fields: Any) -> None:
        """What every phase does at its end: its results CSV (one row per unit), its manifest entry (`status` and
        `manifest_fields`), the phase run's metrics, params, tags and files (the results CSV and `files`), the run
        ended with `run_status` (FINISHED, FAILED), the journal written to the store."""
        self.write_results(units, hparams_of, scores)
        self.manifest.set_phase(self.phase.name, status=status, **manifest_fields)
        self.end(metrics, run_status, steps, params, tags, files)

    def write_results(self, units: list[dict[str, Any]], hparams_of: Callable[[int], dict[str, Any]],
                      scores: list[SetScore]) -> None:
        """The phase's results CSV: one row per (set, ordering) unit (write_results_csv)."""
        write_results_csv(self.results_file, units, hparams_of, scores, self.resolved.family)

    def end(self, metrics: dict[str, float], run_status: str, steps: list[tuple[str, float, int]] | None = None,
            params: dict[str, Any] | None = None, tags: dict[str, str] | None = None,
            files: tuple[Path, ...] = ()) -> None:
        """The phase run's metrics, params, tags and files (the results CSV first), its end, the journal flushed."""
        self.journal.log(self.phase_key, metrics, steps or (), params=params, tags=tags)
        for path in (self.results_file, *files):
            self.journal.log_file(self.phase_key, path)
        self.journal.terminate(self.phase_key, run_status)
        finish_journal(self.journal, self.paths, self.console)

    def incomplete(self, finished: int, expected: int, summary: dict[str, float] | None = None) -> "PhaseIncomplete":
        """The error a phase raises when fewer units than expected finished (never a result)."""
        return PhaseIncomplete(self.paths.root, self.phase.name, finished, expected, summary or {},
                               self.resolved.phase(self.phase).dataset)


class PhaseRunner(ABC):
    """A phase's hooks for run_phase (Optuna's samplers are the model: one shape, a few duties overridden). A runner
    serves one call of run_phase, so `plan` may keep on it what `finish` needs (H*, the sets)."""

    def __init__(self, phase: Phase) -> None:
        self.phase = phase

    @abstractmethod
    def plan(self, resolved: ResolvedExperiment, paths: StudyPaths, manifest: Manifest, resume: bool,
             tags: dict[str, str], console: Console) -> PhasePlan | PhaseOutcome:
        """What the phase trains; or, for a resumed phase that had finished, its outcome as recorded."""

    def stopped_sets(self, run: PhaseRun) -> list[int]:
        """Sets a scheduler or pruner stopped early (their trial runs close as stopped, not failed)."""
        return []

    @abstractmethod
    def finish(self, run: PhaseRun) -> PhaseOutcome:
        """Results CSV, manifest, the phase run's metrics, tags and files, its end (PhaseRun.close); the outcome."""


# A phase's runner, made when the plan reaches the phase: from its record, the experiment and H* (the set the tuning
# phase selected, or the one `gtep evaluate` was given; None before the tuning phase has run).
RunnerFactory = Callable[[Phase, ResolvedExperiment, "dict[str, Any] | None"], PhaseRunner]
RUNNERS: Registry[RunnerFactory] = Registry("phase runner")


def register_runner(phase: Phase) -> Callable[[RunnerFactory], RunnerFactory]:
    """Register the factory of a phase's runner under the phase's name (twice is an error)."""
    return RUNNERS.register(phase.name)


def runner_for(phase: Phase, resolved: ResolvedExperiment, best: dict[str, Any] | None = None) -> PhaseRunner:
    """The runner of a phase of the plan, from the one mapping RUNNERS."""
    if phase.name not in RUNNERS:
        raise KeyError(f"phase {phase.name!r} has no runner; register one with register_runner "
                       "(docs/extending.md, \"Adding a phase to a study's plan\")")
    return RUNNERS.get(phase.name)(phase, resolved, best)


def run_phase(runner: PhaseRunner, resolved: ResolvedExperiment, console: Console, resume: bool = False,
              tags: dict[str, str] | None = None) -> PhaseOutcome:
    """Run any phase on Ray Tune, tracked in MLflow. `tags` go on the phase run (a matrix cell's)."""
    phase, S = runner.phase, resolved.config.search.orderings
    check_resources(resolved)
    paths, manifest = open_study(resolved, fresh=phase.selects_best and not resume)
    plan = runner.plan(resolved, paths, manifest, resume, dict(tags or {}), console)
    if isinstance(plan, PhaseOutcome):
        return plan
    journal = open_journal(resolved, paths)
    attempt, run_id = begin_phase(resolved, journal, manifest, phase, plan.run_tags, plan.resume, plan.hparams)
    phase_key = f"{phase.name}:{attempt}"
    phase_event(paths, "phase_started", phase.name, attempt)
    spec = resolved.phase(phase)
    manifest.set_phase(phase.name, mlflow_run_id=run_id, attempt=attempt, status="running", dataset=spec.dataset,
                       classes=list(spec.classes), **plan.manifest_fields)
    writer = MlflowWriter(journal, phase_key, phase, S, manifest, plan.set_of_trial, plan.hparams_of,
                          common_params(resolved, phase), trial_label=plan.trial_label, family=resolved.family,
                          criterion=resolved.criterion)
    with progress_bar(console) as progress, journal.in_background():
        bar = progress.add_task(plan.progress_label, total=plan.total_units, status="",
                                completed=len(manifest.units(phase.name)))
        trainable = trainable_for(resolved, phase, study_folders(resolved, paths, phase, attempt))
        interruption = run_trials(resolved, paths, phase, attempt, trainable, plan.param_space, plan.search_alg,
                                  plan.num_samples, [writer, ProgressCallback(progress, bar, manifest, phase)],
                                  console)
        phase_event(paths, "phase_trials_done", phase.name, attempt)
    phase_event(paths, "phase_writes_done", phase.name, attempt, pending=len(journal.pending))
    sets = plan.sets if plan.sets is not None else [s["index"] for s in manifest.data["sets"]]
    if interruption.requested:
        raise stop_interrupted_phase(phase.name, phase_key, writer, journal, manifest, paths, console, interruption,
                                     sets, plan.total_units)
    run = PhaseRun(phase, resolved, console, paths, manifest, journal, writer, plan, attempt, run_id, sets)
    run.stopped = runner.stopped_sets(run)
    writer.close_unfinished(sets, interrupted=False, stopped=run.stopped)
    outcome = runner.finish(run)
    phase_event(paths, "phase_finished", phase.name, attempt)
    return outcome


def phase_event(paths: StudyPaths, event: str, phase: str, attempt: str, **fields: Any) -> None:
    """The driver's side of <study>/events.jsonl (the workers write the units'): when a phase started, when its
    trials were done, when its MLflow writes were drained and when it ended, so that where a study's time goes
    between its units can be told apart (benchmarks/paper_scale.py's overhead breakdown)."""
    append_event(paths.root / "events.jsonl", event, phase, attempt, **fields)


# ---------------------------------------------------------------- what every phase writes the same way


def common_params(resolved: ResolvedExperiment, phase: Phase) -> dict[str, Any]:
    """The params of every phase, trial and ordering run. Data conversions are recorded per data role (the tuning
    or the evaluation classes' loader), so a phase on D^HT shows the tuning data's."""
    cfg = resolved.config
    spec = resolved.phase(phase)
    return {"gtep.algorithm": cfg.algorithm, "gtep.backbone": cfg.backbone, "gtep.dataset": spec.dataset,
            "gtep.increments": "+".join(map(str, resolved.increments)), "gtep.seed": cfg.seed,
            "gtep.memory_size": cfg.training.memory_size, "gtep.epoch_scale": cfg.training.epoch_scale,
            "gtep.weights": str(resolved.weights) if resolved.weights else "",
            "gtep.augment": resolved.pipeline(phase).describe(), "gtep.scenario": cfg.scenario.describe(),
            "gtep.data_conversion": resolved.data_conversions.get(spec.phase, "")}


def open_study(resolved: ResolvedExperiment, fresh: bool) -> tuple[StudyPaths, Manifest]:
    cfg = resolved.config
    paths = StudyPaths(cfg.study_dir.resolve())
    if fresh:  # a new study run replaces Ray's storage and the old units; MLflow and the journal keep the history
        for folder in (paths.ray_storage, paths.root / "units", paths.root / "checkpoints", paths.first_tasks):
            if folder.exists():
                shutil.rmtree(folder)
    if not fresh and paths.manifest.exists():
        return paths, Manifest.load(paths.manifest)
    header = {"study": cfg.study, "algorithm": cfg.algorithm, "seed": cfg.seed,
              "config": json.loads(cfg.model_dump_json()), "space": str(resolved.space_path)}
    return paths, Manifest.create(paths.manifest, header)


class PhaseIncomplete(StudyStopped):
    """A fixed-set phase that ended with fewer than S orderings: flagged everywhere, never a result."""

    def __init__(self, study_dir: Path, phase: str, finished: int, expected: int, summary: dict[str, float],
                 dataset: str) -> None:
        self.study_dir, self.phase, self.summary, self.dataset = study_dir, phase, summary, dataset
        super().__init__(f"the {phase} phase is incomplete: {finished} of {expected} orderings finished (the others' "
                         "trials failed after their retries); its mean over what finished is not a result")

    def describe(self, command: str) -> str:
        return f"{self}. Run the missing orderings with: gtep {command} --resume {self.study_dir}"


def write_results_csv(path: Path, units: list[dict[str, Any]], hparams_of, scores: list[SetScore],
                      family: ScenarioFamily | None = None) -> None:
    """One row per (set, ordering) unit, and one per set that has none; every row says whether its set is
    complete (k/S finished orderings), so a set that cannot be H* is visible as such. A scenario family's own
    metrics are columns after the common ones."""
    by_set = {s.set_index: s for s in scores}
    extra = family_extra_metrics(family) if family is not None else ()
    rows = []
    for u in units:
        row = {k: u.get(k) for k in ("set_index", "ordering", "status", "acc", "avg_acc", "hmean", "forgetting",
                                      "old_acc", "new_acc", *extra, "params_total", "params_trainable",
                                      "train_seconds")}
        rows.append({**row, **set_columns(by_set.get(u["set_index"])),
                     **{f"h.{k}": v for k, v in hparams_of(u["set_index"]).items()}})
    for score in scores:
        if score.orderings == 0:
            rows.append({"set_index": score.set_index, "ordering": None, "status": "missing", **set_columns(score),
                         **{f"h.{k}": v for k, v in hparams_of(score.set_index).items()}})
    pd.DataFrame(rows).to_csv(path, index=False)


def set_columns(score: SetScore | None) -> dict[str, Any]:
    if score is None:
        return {}
    return {"set_status": score.status, "set_orderings": f"{score.finished_orderings}/{score.expected_orderings}",
            "set_score": score.hmean_of_means, "criterion": score.criterion}


def stop_interrupted_phase(phase: str, phase_key: str, writer: MlflowWriter, journal: TrackingJournal,
                           manifest: Manifest, paths: StudyPaths, console: Console, interruption: Interruption,
                           set_indices: list[int], total: int) -> StudyInterrupted:
    """Record an interrupted phase as such: units saved, open trial runs and the phase run KILLED with
    gtep.status=interrupted, the manifest's phase `interrupted`, the journal flushed. Further stop signals
    are ignored meanwhile (a few quick local writes), so what was written stays consistent."""
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        writer.close_unfinished(set_indices, interrupted=True)
        manifest.save_units(force=True)
        manifest.set_phase(phase, status="interrupted")
        journal.log(phase_key, tags={"gtep.status": "interrupted"})
        journal.terminate(phase_key, "KILLED")
        finish_journal(journal, paths, console)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return StudyInterrupted(paths.root, phase, interruption.signum or signal.SIGINT, len(manifest.units(phase)), total)


def phase_tags(resolved: ResolvedExperiment, phase: Phase) -> dict[str, str]:
    """Tags that tell the phase runs apart in the UI: the data (dataset, D^HT or D^E, a digest of its classes)
    and how similar D^HT and D^E are (a matrix cell's own tag replaces it)."""
    spec = resolved.phase(phase)
    digest = hashlib.sha1(",".join(map(str, spec.classes)).encode()).hexdigest()[:10]
    return {"gtep.dataset": f"{spec.dataset} {phase.data} ({len(spec.classes)} classes)", "gtep.data_role": phase.data,
            "gtep.classes_digest": digest,
            "gtep.similarity": "high" if resolved.tuning.dataset == resolved.evaluation.dataset else "low",
            **scenario_tags(resolved.family, resolved.criterion)}


def tuning_protocol_params(cfg) -> dict[str, Any]:
    """How the study's H* was tuned, on every phase run (gtep report puts the protocols side by side): the
    protocol, k for first_task, and the scheduler (or Optuna pruner, optuna-<name>) that stopped sets early."""
    search = cfg.search
    stopper = search.scheduler if search.pruner == "none" else f"optuna-{search.pruner}"
    return {"gtep.protocol": search.protocol, "gtep.protocol_tasks": search.protocol_tasks if search.protocol ==
            "first_task" else "", "gtep.scheduler": stopper}


def compute_metrics(paths: StudyPaths, phase: str, attempt: str, units: list[dict[str, Any]],
                    partial_seconds: float = 0.0) -> dict[str, float]:
    """compute_seconds: the training seconds a phase spent, all its sets and orderings (a first task reused from
    the store counted once, where it was trained: protocol.replay.spent_seconds, over the unit files' task
    seconds; `partial_seconds`: orderings stopped before their last task); the same meaning on every phase run,
    so the tuning protocols' costs compare."""
    spent = spent_seconds(full_units(paths.root, phase, attempt, units))
    return {"compute_seconds": float(spent + partial_seconds)}


def begin_phase(resolved: ResolvedExperiment, journal: TrackingJournal, manifest: Manifest, phase: Phase,
                tags: dict[str, str], resume: bool, hparams: dict[str, Any] | None = None) -> tuple[str, str]:
    """The phase's attempt id and its MLflow run: new for a fresh phase, the same ones for a resumed one.
    The run is created now, while the store answers, so its id can go into best.yaml. `hparams`: the set a
    fixed-set phase runs, logged as the run's params (the tuning phase logs H*'s when it has selected it)."""
    cfg = resolved.config
    spec = resolved.phase(phase)
    previous = manifest.data["phases"].get(phase.name, {})
    if resume and previous.get("attempt"):
        attempt = previous["attempt"]
    else:
        attempt = uuid.uuid4().hex[:8]
        manifest.clear_units(phase.name)
    key = f"{phase.name}:{attempt}"
    journal.create_run(key, phase.name, tags={"gtep.phase": phase.name, "gtep.level": "phase", "gtep.study": cfg.study,
                                              "gtep.attempt": attempt, **UNITS_TAG, **phase_tags(resolved, phase),
                                              **tags})
    if resume and previous.get("attempt"):
        journal.reopen(key)
    # how H* is selected, on every phase run (the UI compares them); gtep.trials: the sets this phase draws
    search = {"gtep.trials": cfg.search.trials if phase.selects_best else 1, "gtep.searcher": cfg.search.searcher,
              "gtep.selection": cfg.search.selection, **tuning_protocol_params(cfg)}
    journal.log(key, params={**common_params(resolved, phase), "gtep.orderings": cfg.search.orderings, **search,
                             **(hparams or {})})
    journal.log_text(key, "classes.json", json.dumps({"phase": phase.name, "dataset": spec.dataset,
                                                       "classes": list(spec.classes),
                                                       "class_names": list(spec.class_names)}, indent=2))
    if journal.flush(force=True):
        raise ConfigError("--tracking-uri", f"cannot write to the MLflow store at {cfg.tracking_uri} "
                          f"({journal.last_error}); start it or give another --tracking-uri")
    run_id = journal.run_id(key)
    if run_id is None:  # the forced flush above applied create_run, or it raised
        raise RuntimeError(f"the journal has no MLflow run for {key} after flushing")
    return attempt, run_id
