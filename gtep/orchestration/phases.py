"""The two phases of GTEP on Ray Tune (paper Algorithms 1-3), tracked in MLflow.

tune_phase:     draw R sets (manifest first), train each over S orderings of D^HT, select H*.
evaluate_phase: train H* over S orderings of D^E (one Ray trial per ordering), report mean and std.
original_phase, conventional_phase: the same machinery for the authors' values on D^E and for H* re-run
                on D^HT (the conventional protocol), each as its own labelled phase (fixed_set_phase).
"""
from __future__ import annotations

import json
import shutil
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
from ray import tune
from rich.console import Console

from gtep.config import ConfigError, ResolvedExperiment, with_added_defaults
from gtep.errors import StudyStopped
from gtep.orchestration.interrupt import Interruption, StudyInterrupted
from gtep.orchestration.journal import RUN_REF, TrackingJournal
from gtep.orchestration.ray_search import (
    ProgressCallback,
    check_resources,
    progress_bar,
    run_trials,
    searcher,
)
from gtep.orchestration.study import Manifest, StudyPaths, full_units, read_best, write_best
from gtep.orchestration.tracking import (
    UNITS_TAG,
    MlflowWriter,
    family_extra_metrics,
    ordering_result,
    phase_metrics,
    phase_note,
    scenario_tags,
    step_points,
    summarize_units,
)
from gtep.orchestration.tracking_store import finish_journal, open_journal
from gtep.orchestration.trainable import trainable_for
from gtep.orchestration.trial_job import study_folders
from gtep.protocol.families import ScenarioFamily
from gtep.protocol.replay import spent_seconds
from gtep.protocol.sampling import effective_hyperparameters, sample_sets
from gtep.protocol.selection import SetScore, score_set, select_best
from gtep.spaces import load_space


@dataclass
class PhaseOutcome:
    phase: str
    run_id: str
    set_index: int
    hparams: dict[str, Any]
    summary: dict[str, float]
    paths: StudyPaths
    extra: dict[str, Any] = field(default_factory=dict)


# ---------------------------------------------------------------- shared pieces


def common_params(resolved: ResolvedExperiment, phase: str) -> dict[str, Any]:
    cfg = resolved.config
    spec = resolved.phase(phase)
    return {"gtep.algorithm": cfg.algorithm, "gtep.backbone": cfg.backbone, "gtep.dataset": spec.dataset,
            "gtep.increments": "+".join(map(str, resolved.increments)), "gtep.seed": cfg.seed,
            "gtep.memory_size": cfg.training.memory_size, "gtep.epoch_scale": cfg.training.epoch_scale,
            "gtep.weights": str(resolved.weights) if resolved.weights else "",
            "gtep.augment": resolved.pipeline(phase).describe(), "gtep.scenario": cfg.scenario.describe(),
            "gtep.data_conversion": resolved.data_conversions.get("tune" if phase == "conventional" else
                                                                  "evaluate" if phase in ("original", "evaluate_sets")
                                                                  else phase, "")}


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
    import signal

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


def phase_tags(resolved: ResolvedExperiment, phase: str) -> dict[str, str]:
    """Tags that tell the phase runs apart in the UI: the data (dataset, D^HT or D^E, a digest of its classes)
    and how similar D^HT and D^E are (a matrix cell's own tag replaces it)."""
    import hashlib

    spec = resolved.phase(phase)
    role = "D^HT" if spec is resolved.tuning else "D^E"
    digest = hashlib.sha1(",".join(map(str, spec.classes)).encode()).hexdigest()[:10]
    return {"gtep.dataset": f"{spec.dataset} {role} ({len(spec.classes)} classes)", "gtep.data_role": role,
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


def begin_phase(resolved: ResolvedExperiment, journal: TrackingJournal, manifest: Manifest, phase: str,
                tags: dict[str, str], resume: bool, hparams: dict[str, Any] | None = None) -> tuple[str, str]:
    """The phase's attempt id and its MLflow run: new for a fresh phase, the same ones for a resumed one.
    The run is created now, while the store answers, so its id can go into best.yaml. `hparams`: the set a
    fixed-set phase runs, logged as the run's params (the tuning phase logs H*'s when it has selected it)."""
    cfg = resolved.config
    spec = resolved.phase(phase)
    previous = manifest.data["phases"].get(phase, {})
    if resume and previous.get("attempt"):
        attempt = previous["attempt"]
    else:
        attempt = uuid.uuid4().hex[:8]
        manifest.clear_units(phase)
    key = f"{phase}:{attempt}"
    journal.create_run(key, phase, tags={"gtep.phase": phase, "gtep.level": "phase", "gtep.study": cfg.study,
                                         "gtep.attempt": attempt, **UNITS_TAG, **phase_tags(resolved, phase), **tags})
    if resume and previous.get("attempt"):
        journal.reopen(key)
    # how H* is selected, on every phase run (the UI compares them); gtep.trials: the sets this phase trains
    search = {"gtep.trials": cfg.search.trials if phase == "tune" else 1, "gtep.searcher": cfg.search.searcher,
              "gtep.selection": cfg.search.selection, **tuning_protocol_params(cfg)}
    journal.log(key, params={**common_params(resolved, phase), "gtep.orderings": cfg.search.orderings, **search,
                             **(hparams or {})})
    journal.log_text(key, "classes.json", json.dumps({"phase": phase, "dataset": spec.dataset,
                                                       "classes": list(spec.classes),
                                                       "class_names": list(spec.class_names)}, indent=2))
    if journal.flush(force=True):
        raise ConfigError("--tracking-uri", f"cannot write to the MLflow store at {cfg.tracking_uri} "
                          f"({journal.last_error}); start it or give another --tracking-uri")
    run_id = journal.run_id(key)
    if run_id is None:  # the forced flush above applied create_run, or it raised
        raise RuntimeError(f"the journal has no MLflow run for {key} after flushing")
    return attempt, run_id


# ---------------------------------------------------------------- phase 1: tuning

def check_resumable(resolved: ResolvedExperiment, manifest: Manifest) -> None:
    """A resumed study must be the same study: the sets and units on disk belong to its config."""
    stored = with_added_defaults(manifest.data.get("config", {}))  # a study from before search.scheduler etc.
    current = json.loads(resolved.config.model_dump_json())
    for name in ("algorithm", "backbone", "scenario", "datasets", "search", "first_task", "training", "seed"):
        if stored.get(name) != current.get(name):
            raise ConfigError("--resume", f"the study in {manifest.path.parent} was started with another {name!r}; "
                              "resume it with its own config (leave --config out) or start a new --study")


class SetIndexer:
    """Which set a Ray trial trains: the index the manifest gave it (random search), or for an adaptive
    searcher's suggestion, a replayed set's index or a new one recorded as it is suggested."""

    def __init__(self, manifest: Manifest) -> None:
        self.manifest = manifest
        self.by_trial: dict[str, int] = {}

    def __call__(self, trial) -> int:
        if "trial" in trial.config:
            return int(trial.config["trial"]["set_index"])
        if trial.trial_id not in self.by_trial:
            hparams = dict(trial.config["hparams"])
            taken = set(self.by_trial.values())
            replayed = [s["index"] for s in self.manifest.data["sets"]
                        if s["hparams"] == hparams and s["index"] not in taken]
            self.by_trial[trial.trial_id] = replayed[0] if replayed else self.manifest.add_set(hparams)
        return self.by_trial[trial.trial_id]


def start_tuning(resolved: ResolvedExperiment, resume: bool, space) -> tuple[StudyPaths, Manifest, bool]:
    """The study's folder and manifest (the R sets on disk before any training); True when a resumed tuning
    phase had already finished."""
    cfg = resolved.config
    check_resources(resolved)
    paths, manifest = open_study(resolved, fresh=not resume)
    if resume:
        check_resumable(resolved, manifest)
        done = manifest.data["phases"].get("tune", {}).get("status") == "finished" and paths.best.exists()
        return paths, manifest, done
    if cfg.search.searcher == "random":
        manifest.set_sets(sample_sets(space, cfg.search.trials, cfg.seed))
    return paths, manifest, False


def stopped_sets(resolved: ResolvedExperiment, results: list, set_indices: list[int], writer: MlflowWriter,
                 console: Console, units: list[dict[str, Any]]) -> list[int]:
    """Sets a scheduler or pruner stopped early: their trial ended without an error before S orderings (with
    fidelity tasks, possibly inside its first ordering: it reported, but finished none). Said on the terminal
    with what they cost."""
    search = resolved.config.search
    S = search.orderings
    finished = {i: sum(r.set_index == i for r in results) for i in set_indices}
    stopped = sorted(i for i, n in finished.items() if search.stops_sets and n < S
                     and (n > 0 or i in writer.partial_seconds) and i not in writer.errors)
    if stopped:
        partial = sum(writer.partial_seconds.get(i, 0.0) for i in stopped)
        cost = sum(float(u.get("train_seconds") or 0) for u in units if u["set_index"] in stopped) + partial
        stopper = search.scheduler if search.scheduler != "none" else f"the {search.pruner} pruner"
        console.print(f"{len(stopped)} of {len(set_indices)} sets stopped early by {stopper} "
                      f"(never H*; they cost {cost:.0f} s of training): "
                      + ", ".join(f"set{i:03d} {finished[i]}/{S}" for i in stopped))
    return stopped


def ranked_sets_note(resolved: ResolvedExperiment, selection, best_index: int) -> list[str]:
    """The ten best sets as a markdown table for the tuning run's MLflow note."""
    chosen, S = resolved.config.search.selection, resolved.config.search.orderings
    ranked = sorted(selection.scores, key=lambda s: -s.score(chosen))[:10]
    top = [f"Sets by {resolved.criterion.description} ({chosen}, %):", "",
           "| set | Acc | AvgAcc | score | orderings |", "|---|---:|---:|---:|---|"]
    return top + [f"| set{s.set_index:03d}{' (H*)' if s.set_index == best_index else ''} | {100 * s.acc_mean:.2f} "
                  f"| {100 * s.avg_acc_mean:.2f} | {100 * s.score(chosen):.2f} | {s.finished_orderings}/{S} |"
                  for s in ranked]


def best_record(resolved: ResolvedExperiment, selection, hparams: dict[str, Any], summary: dict[str, Any],
                run_id: str) -> dict[str, Any]:
    """best.yaml: H* with what selected it."""
    cfg = resolved.config
    return {"study": cfg.study, "algorithm": cfg.algorithm, "backbone": cfg.backbone,
            "set_index": selection.best_index, "selection": cfg.search.selection,
            "criterion": resolved.criterion.name, "family": resolved.family.name,
            "score": float(selection.best.score(cfg.search.selection)),
            "acc": summary["acc"], "avg_acc": summary["avg_acc"], "tuning_run_id": run_id,
            "hparams": hparams, "effective": effective_hyperparameters(hparams)}


def score_rows(selection) -> list[dict[str, Any]]:
    return [{"set_index": s.set_index, "hmean_of_means": s.hmean_of_means, "mean_of_hmeans": s.mean_of_hmeans,
             "acc": s.acc_mean, "avg_acc": s.avg_acc_mean, "diverged_orderings": s.diverged_orderings,
             "orderings": s.orderings, "status": s.status} for s in selection.scores]


def fail_tuning(journal: TrackingJournal, phase_key: str, counts: dict[str, int], paths: StudyPaths,
                manifest: Manifest, console: Console) -> None:
    """No set could be selected: the phase run and the manifest say so before the error propagates."""
    journal.log(phase_key, counts, tags={"gtep.status": "failed"})
    journal.log_file(phase_key, paths.results("tune"))
    journal.terminate(phase_key, "FAILED")
    finish_journal(journal, paths, console)
    manifest.set_phase("tune", status="failed")


def tune_phase(resolved: ResolvedExperiment, console: Console, resume: bool = False,
               tags: dict[str, str] | None = None) -> PhaseOutcome:
    """Algorithm 2 and SelectBestHyperparameter of Algorithm 1. `tags` go on the phase run (a matrix cell's)."""
    cfg = resolved.config
    R, S = cfg.search.trials, cfg.search.orderings
    space = load_space(cfg.algorithm, resolved.space_path).space
    paths, manifest, finished_before = start_tuning(resolved, resume, space)
    if finished_before:
        return finished_tune_outcome(resolved, paths, manifest)
    journal = open_journal(resolved, paths)
    attempt, run_id = begin_phase(resolved, journal, manifest, "tune", dict(tags or {}), resume)
    phase_key = f"tune:{attempt}"
    manifest.set_phase("tune", mlflow_run_id=run_id, attempt=attempt, status="running",
                       dataset=resolved.tuning.dataset, classes=list(resolved.tuning.classes))
    writer = MlflowWriter(journal, phase_key, "tune", S, manifest, SetIndexer(manifest), manifest.hparams,
                          common_params(resolved, "tune"), family=resolved.family, criterion=resolved.criterion)
    param_space, search_alg, num_samples = searcher(resolved, manifest, space, S)
    with progress_bar(console) as progress, journal.in_background():
        bar = progress.add_task(f"tune {cfg.algorithm}", total=R * S, status="",
                                completed=len(manifest.units("tune")))
        trainable = trainable_for(resolved, "tune", study_folders(resolved, paths, "tune", attempt))
        interruption = run_trials(resolved, paths, "tune", attempt, trainable, param_space, search_alg, num_samples,
                                  [writer, ProgressCallback(progress, bar, manifest, "tune")], console)
    set_indices = [s["index"] for s in manifest.data["sets"]]
    if interruption.requested:
        raise stop_interrupted_phase("tune", phase_key, writer, journal, manifest, paths, console, interruption,
                                     set_indices, R * S)
    units = manifest.units("tune")
    results = [ordering_result(u) for u in units]
    stopped = stopped_sets(resolved, results, set_indices, writer, console, units)
    writer.close_unfinished(set_indices, interrupted=False, stopped=stopped)
    scores = [score_set(i, [r for r in results if r.set_index == i], S, resolved.criterion, i in stopped)
              for i in set_indices]
    write_results_csv(paths.results("tune"), units, manifest.hparams, scores, resolved.family)
    states = ("complete", "incomplete", "diverged") + (("stopped",) if cfg.search.stops_sets else ())
    counts = {f"sets_{state}": sum(s.status == state for s in scores) for state in states}
    manifest.set_phase("tune", stopped_sets=stopped)
    try:
        selection = select_best(results, cfg.search.selection, expected_orderings=S, sets=set_indices,
                                criterion=resolved.criterion, stopped=stopped)
    except Exception:
        fail_tuning(journal, phase_key, counts, paths, manifest, console)
        raise
    best_index = selection.best_index
    hparams = manifest.hparams(best_index)
    best_units = [u for u in units if u["set_index"] == best_index]
    summary = summarize_units(best_units, S, resolved.family, resolved.criterion)
    write_best(paths.best, best_record(resolved, selection, hparams, summary, run_id))
    manifest.set_phase("tune", status="finished", best_set_index=best_index, scores=score_rows(selection))
    note = phase_note("tune", phase_tags(resolved, "tune")["gtep.dataset"], summary, hparams,
                      f"H* = set{best_index:03d} of {len(selection.scores)}",
                      ranked_sets_note(resolved, selection, best_index))
    partial = sum(writer.partial_seconds.get(i, 0.0) for i in stopped)  # their last, unfinished orderings
    # the phase run carries H* as params too, so the UI compares it with the evaluation run that re-ran it
    # the same metric names as every phase run (no metric only one phase has: MLflow's compare view would show
    # NaN); which set H* is stays a tag, gtep.best_set_index
    journal.log(phase_key, {**phase_metrics(best_units, summary), "diverged": summary["diverged"],
                            "orderings": summary["orderings"], **counts,
                            **compute_metrics(paths, "tune", attempt, units, partial)},
                step_points(summary),
                params=hparams,
                tags={"gtep.best_set_index": str(best_index), "gtep.status": "finished", "mlflow.note.content": note,
                      "gtep.best_trial_run_id": RUN_REF + f"{phase_key}/set{best_index:03d}"})
    for path in (paths.manifest, paths.best, paths.results("tune")):
        journal.log_file(phase_key, path)
    journal.terminate(phase_key, "FINISHED")
    finish_journal(journal, paths, console)
    return PhaseOutcome("tune", run_id, best_index, hparams, summary, paths,
                        {"diverged_sets": counts["sets_diverged"], "incomplete_sets": counts["sets_incomplete"],
                         "trials": len(selection.scores)})


def finished_tune_outcome(resolved: ResolvedExperiment, paths: StudyPaths, manifest: Manifest) -> PhaseOutcome:
    """A resumed `gtep run` whose tuning phase had finished: H* as it was selected, nothing re-run."""
    best = read_best(paths.best)
    units = [u for u in manifest.units("tune") if u["set_index"] == best["set_index"]]
    return PhaseOutcome("tune", best["tuning_run_id"], int(best["set_index"]), best["hparams"],
                        summarize_units(units, resolved.config.search.orderings, resolved.family, resolved.criterion),
                        paths)


# ---------------------------------------------------------------- phase 2: evaluation


# The phases that train one fixed set over S orderings (Algorithm 3's shape), each with its own manifest entry,
# units folder and phase run. evaluate: H* on D^E (the protocol). original: the authors' reported values on D^E,
# the paper's "Original" beside H* (section 4.1, Figure 4, Table 7). conventional: H* on the tuning classes D^HT
# again, the practice section 3.1 criticises (tune and report on one scenario); it runs orderings S..2S-1, so it
# is a fresh re-run of the tuned scenario rather than a copy of the tuning units it was selected on.
FIXED_SET_PHASES = ("evaluate", "original", "conventional")


def fixed_orderings(phase: str, S: int) -> list[int]:
    """The class orderings a fixed-set phase runs: 0..S-1 on D^E; S..2S-1 for the conventional re-run on D^HT."""
    return list(range(S, 2 * S)) if phase == "conventional" else list(range(S))


def original_best(resolved: ResolvedExperiment) -> dict[str, Any]:
    """The `original` preset of the algorithm's search-space file, shaped like a best.yaml."""
    algorithm = resolved.config.algorithm
    presets = load_space(algorithm, resolved.space_path).presets
    if "original" not in presets:
        raise ConfigError("original", f"{resolved.space_path} has no 'original' preset for {algorithm}; add the "
                          "authors' values under presets.original, or leave the original phase out")
    return {"algorithm": algorithm, "set_index": -1, "hparams": dict(presets["original"]), "source": "preset:original"}


def set_label(phase: str, best: dict[str, Any]) -> str:
    """How a fixed-set phase names the set it runs: `H*` (selected by a tuning phase), `original` (the authors'
    values), else `set003`."""
    source = str(best.get("source") or "tuning")
    if source.startswith("preset:"):
        return source[len("preset:"):]
    if source == "tuning" and best.get("tuning_run_id"):
        return "H*"
    return f"set{int(best.get('set_index', -1)):03d}"


def finished_fixed_outcome(paths: StudyPaths, phase: str, previous: dict[str, Any]) -> PhaseOutcome:
    """A resumed phase that had finished with the same set and orderings: its result as recorded, nothing re-run."""
    return PhaseOutcome(phase, previous["mlflow_run_id"], int(previous.get("set_index", -1)),
                        dict(previous["hparams"]), dict(previous["summary"]), paths, {"reused": True})


def fixed_set_phase(resolved: ResolvedExperiment, best: dict[str, Any], console: Console, *, phase: str = "evaluate",
                    resume: bool = False, tags: dict[str, str] | None = None) -> PhaseOutcome:
    """Train one fixed set (`best`: a best.yaml or a preset) over S orderings as the labelled `phase`
    (FIXED_SET_PHASES); report mean and std over the orderings (paper Algorithm 3). With `resume`, a running
    phase continues its attempt and a finished one with the same set is returned as it was."""
    if phase not in FIXED_SET_PHASES:
        raise ValueError(f"phase {phase!r} is not one of {FIXED_SET_PHASES}")
    cfg = resolved.config
    S = cfg.search.orderings
    orderings = fixed_orderings(phase, S)
    check_resources(resolved)
    paths, manifest = open_study(resolved, fresh=False)
    spec = resolved.phase(phase)
    set_index = int(best.get("set_index", -1))
    hparams = dict(best["hparams"])
    previous = manifest.data["phases"].get(phase, {})
    same = previous.get("hparams") == hparams and previous.get("orderings", list(range(S))) == orderings
    if resume and same and previous.get("status") == "finished" and previous.get("summary"):
        return finished_fixed_outcome(paths, phase, previous)
    journal = open_journal(resolved, paths)
    run_tags = {"gtep.tuning_run_id": str(best.get("tuning_run_id") or ""),
                "gtep.hparams_source": best.get("source", "tuning"), **(tags or {})}
    resume = resume and same and previous.get("status") in ("running", "interrupted", "incomplete")
    attempt, run_id = begin_phase(resolved, journal, manifest, phase, run_tags, resume, hparams)
    phase_key = f"{phase}:{attempt}"
    manifest.set_phase(phase, mlflow_run_id=run_id, attempt=attempt, status="running", dataset=spec.dataset,
                       classes=list(spec.classes), set_index=set_index, hparams=hparams, orderings=orderings,
                       tuning_run_id=run_tags["gtep.tuning_run_id"], hparams_source=run_tags["gtep.hparams_source"])
    label = set_label(phase, best)
    writer = MlflowWriter(journal, phase_key, phase, S, manifest, lambda t: set_index, lambda _: hparams,
                          common_params(resolved, phase), trial_label=lambda _: label, family=resolved.family,
                          criterion=resolved.criterion)
    with progress_bar(console) as progress, journal.in_background():
        bar = progress.add_task(f"{phase} {cfg.algorithm}", total=S, status="", completed=len(manifest.units(phase)))
        interruption = run_trials(resolved, paths, phase, attempt,
                                  trainable_for(resolved, phase, study_folders(resolved, paths, phase, attempt)),
                                  {"trial": {"set_index": set_index, "hparams": hparams},
                                   "orderings": tune.grid_search([[s] for s in orderings])},
                                  None, 1, [writer, ProgressCallback(progress, bar, manifest, phase)], console)
    if interruption.requested:
        raise stop_interrupted_phase(phase, phase_key, writer, journal, manifest, paths, console, interruption,
                                     [set_index], S)
    writer.close_unfinished([set_index], interrupted=False)
    units = manifest.units(phase)
    summary = summarize_units(units, S, resolved.family, resolved.criterion)
    complete = len(units) == S
    status = "finished" if complete else "incomplete"
    score = score_set(set_index, [ordering_result(u) for u in units], S, resolved.criterion)
    write_results_csv(paths.results(phase), units, lambda _: hparams, [score], resolved.family)
    manifest.set_phase(phase, status=status, summary=summary)
    tags = {"gtep.status": status, "gtep.orderings": f"{len(units)}/{S}"}
    if not complete:
        tags["gtep.reason"] = f"{len(units)} of {S} orderings finished; the others' trials failed after their retries"
    tuned_by = run_tags["gtep.tuning_run_id"]
    link = [f"H* was selected by the [tuning run](#/experiments/{journal.state.experiment_id}/runs/{tuned_by})."] \
        if tuned_by else []
    tags["mlflow.note.content"] = phase_note(phase, phase_tags(resolved, phase)["gtep.dataset"], summary, hparams,
                                             label if label != "H*" else f"H* (set{set_index:03d} of the tuning run)",
                                             link)
    counts = {f"sets_{state}": int(score.status == state) for state in ("complete", "incomplete", "diverged")}
    journal.log(phase_key, {**phase_metrics(units, summary), **counts, **compute_metrics(paths, phase, attempt, units),
                            **{k: float(summary[k]) for k in ("diverged", "orderings") if pd.notna(summary[k])}},
                step_points(summary), tags=tags)
    for path in (paths.manifest, paths.results(phase)) + ((paths.best,) if paths.best.exists() else ()):
        journal.log_file(phase_key, path)
    journal.terminate(phase_key, "FINISHED" if complete and not summary["diverged"] else "FAILED")
    finish_journal(journal, paths, console)
    if not complete:
        raise PhaseIncomplete(paths.root, phase, len(units), S, summary, spec.dataset)
    return PhaseOutcome(phase, run_id, set_index, hparams, summary, paths)


def evaluate_phase(resolved: ResolvedExperiment, best: dict[str, Any], console: Console,
                   resume: bool = False, tags: dict[str, str] | None = None) -> PhaseOutcome:
    """Algorithm 3: H* (or the given set) over S orderings of D^E."""
    return fixed_set_phase(resolved, best, console, phase="evaluate", resume=resume, tags=tags)


def original_phase(resolved: ResolvedExperiment, console: Console, resume: bool = False,
                   tags: dict[str, str] | None = None) -> PhaseOutcome:
    """The algorithm's `original` preset over S orderings of D^E, beside H* (the paper's "Original", section 4.1)."""
    return fixed_set_phase(resolved, original_best(resolved), console, phase="original", resume=resume, tags=tags)


def conventional_phase(resolved: ResolvedExperiment, best: dict[str, Any], console: Console, resume: bool = False,
                       tags: dict[str, str] | None = None) -> PhaseOutcome:
    """The conventional protocol (section 3.1): H* evaluated on the classes it was tuned on, orderings S..2S-1."""
    return fixed_set_phase(resolved, best, console, phase="conventional", resume=resume, tags=tags)
