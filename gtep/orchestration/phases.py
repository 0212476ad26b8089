"""The phases of GTEP on Ray Tune (paper Algorithms 1-3), tracked in MLflow, each a runner for run_phase
(gtep/orchestration/phase_run.py) over its record (gtep/protocol/phases.py).

tune_phase:     draw R sets (manifest first), train each over S orderings of D^HT, select H* (TuneRunner).
evaluate_phase: train H* over S orderings of D^E (one Ray trial per ordering), report mean and std.
original_phase, conventional_phase: the same runner (FixedSetRunner) for the authors' values on D^E and for H*
                re-run on D^HT (the conventional protocol), each as its own labelled phase.
"""
from __future__ import annotations

import json
import math
from typing import Any

import pandas as pd
from ray import tune
from rich.console import Console

from gtep.config import ConfigError, ResolvedExperiment, with_added_defaults
from gtep.orchestration.importance import IMPORTANCE_TAG, fanova_importance, importance_tag
from gtep.orchestration.journal import RUN_REF
from gtep.orchestration.phase_run import (
    PhaseIncomplete,
    PhaseOutcome,
    PhasePlan,
    PhaseRun,
    PhaseRunner,
    compute_metrics,
    phase_tags,
    register_runner,
    run_phase,
    runner_for,
)
from gtep.orchestration.ray_search import searcher
from gtep.orchestration.study import Manifest, StudyPaths, read_best, write_best
from gtep.orchestration.tracking import (
    MlflowWriter,
    ordering_result,
    percent,
    phase_metrics,
    phase_note,
    step_points,
    summarize_units,
)
from gtep.protocol.phases import CONVENTIONAL, EVALUATE, ORIGINAL, TUNE, Phase
from gtep.protocol.sampling import effective_hyperparameters, sample_sets
from gtep.protocol.selection import score_set, select_best
from gtep.protocol.ties import competition_ranks
from gtep.spaces import load_space

__all__ = ["PhaseIncomplete", "PhaseOutcome", "FixedSetRunner", "TuneRunner", "conventional_phase", "evaluate_phase",
           "original_phase", "original_best", "run_phase", "tune_phase"]


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
    # scores within gtep/protocol/ties.py's tolerance share a rank and are listed by set index, H* first among them
    ranks = competition_ranks([s.score(chosen) for s in selection.scores])
    order = sorted(range(len(ranks)), key=lambda n: (math.inf if math.isnan(ranks[n]) else ranks[n],
                                                     selection.scores[n].set_index))
    ranked = [selection.scores[n] for n in order][:10]
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


def phase_importance(resolved: ResolvedExperiment, selection, hparams_of) -> dict[str, str]:
    """The gtep.importance tag of a finished tuning phase: fANOVA over its sets' selection scores (the complete
    sets'; the others are NaN and left out), fitted here once so that a report over many studies reads it instead
    of fitting a forest per phase. A fit that fails leaves no tag: the report then fits it itself."""
    rule = resolved.config.search.selection
    ordered = sorted(selection.scores, key=lambda s: s.set_index)
    # each score as a report reads it back from the trial run (percent, 4 decimals, over 100): fANOVA's forest
    # breaks ties between equally good splits on the scores' last bits, and the tag must be the report's own fit
    points = [({name: str(value) for name, value in hparams_of(s.set_index).items()},
               percent(s.score(rule)) / 100.0 if s.usable else math.nan) for s in ordered]
    try:
        found = fanova_importance(points)
    except Exception:  # noqa: BLE001 - an analysis, never a reason for a finished phase to fail
        return {}
    return {IMPORTANCE_TAG: importance_tag(found, rule, sum(1 for _, score in points if not math.isnan(score)))}


def fail_tuning(run: PhaseRun, counts: dict[str, int]) -> None:
    """No set could be selected: the phase run and the manifest say so before the error propagates."""
    run.end(dict(counts), "FAILED", tags={"gtep.status": "failed"})
    run.manifest.set_phase(run.phase.name, status="failed")


class TuneRunner(PhaseRunner):
    """Algorithm 2 and SelectBestHyperparameter of Algorithm 1: the R sets (drawn into the manifest before any
    training, or suggested by an adaptive searcher) over S orderings of D^HT; H* into best.yaml."""

    def __init__(self, space: Any, phase: Phase = TUNE) -> None:
        """`space`: the algorithm's search space (gtep.spaces), loaded before the study folder is touched."""
        super().__init__(phase)
        self.space = space

    def plan(self, resolved: ResolvedExperiment, paths: StudyPaths, manifest: Manifest, resume: bool,
             tags: dict[str, str], console: Console) -> PhasePlan | PhaseOutcome:
        cfg = resolved.config
        R, S = cfg.search.trials, cfg.search.orderings
        space = self.space
        if resume:
            check_resumable(resolved, manifest)
            if manifest.data["phases"].get(self.phase.name, {}).get("status") == "finished" and paths.best.exists():
                return finished_tune_outcome(resolved, paths, manifest)
        elif cfg.search.searcher == "random":
            manifest.set_sets(sample_sets(space, R, cfg.seed))
        param_space, search_alg, num_samples = searcher(resolved, manifest, space, S)
        return PhasePlan(sets=None, total_units=R * S, param_space=param_space, search_alg=search_alg,
                         num_samples=num_samples, set_of_trial=SetIndexer(manifest), hparams_of=manifest.hparams,
                         progress_label=f"{self.phase.name} {cfg.algorithm}", resume=resume, run_tags=tags)

    def stopped_sets(self, run: PhaseRun) -> list[int]:
        units = run.manifest.units(self.phase.name)
        return stopped_sets(run.resolved, [ordering_result(u) for u in units], run.sets, run.writer, run.console,
                            units)

    def finish(self, run: PhaseRun) -> PhaseOutcome:
        resolved, paths, manifest, phase_key = run.resolved, run.paths, run.manifest, run.phase_key
        cfg, name, stopped, set_indices = resolved.config, self.phase.name, run.stopped, run.sets
        S = cfg.search.orderings
        units = manifest.units(name)
        results = [ordering_result(u) for u in units]
        scores = [score_set(i, [r for r in results if r.set_index == i], S, resolved.criterion, i in stopped)
                  for i in set_indices]
        run.write_results(units, manifest.hparams, scores)
        states = ("complete", "incomplete", "diverged") + (("stopped",) if cfg.search.stops_sets else ())
        counts = {f"sets_{state}": sum(s.status == state for s in scores) for state in states}
        manifest.set_phase(name, stopped_sets=stopped)
        try:
            selection = select_best(results, cfg.search.selection, expected_orderings=S, sets=set_indices,
                                    criterion=resolved.criterion, stopped=stopped)
        except Exception:
            fail_tuning(run, counts)
            raise
        best_index = selection.best_index
        hparams = manifest.hparams(best_index)
        best_units = [u for u in units if u["set_index"] == best_index]
        summary = summarize_units(best_units, S, resolved.family, resolved.criterion)
        write_best(paths.best, best_record(resolved, selection, hparams, summary, run.run_id))
        note = phase_note(name, phase_tags(resolved, self.phase)["gtep.dataset"], summary, hparams,
                          f"H* = set{best_index:03d} of {len(selection.scores)}",
                          ranked_sets_note(resolved, selection, best_index))
        partial = sum(run.writer.partial_seconds.get(i, 0.0) for i in stopped)  # their last, unfinished orderings
        # the phase run carries H* as params too, so the UI compares it with the evaluation run that re-ran it
        # the same metric names as every phase run (no metric only one phase has: MLflow's compare view would show
        # NaN); which set H* is stays a tag, gtep.best_set_index
        metrics = {**phase_metrics(best_units, summary), "diverged": summary["diverged"],
                   "orderings": summary["orderings"], **counts,
                   **compute_metrics(paths, name, run.attempt, units, partial)}
        # fANOVA's fit (a second or two) before the manifest says finished: a study killed between the two is
        # resumed as finished, and the phase run must be ended by then (run.end journals it right after)
        importance = phase_importance(resolved, selection, manifest.hparams)
        manifest.set_phase(name, status="finished", best_set_index=best_index, scores=score_rows(selection))
        run.end(metrics, "FINISHED", step_points(summary), params=hparams, files=(paths.manifest, paths.best),
                tags={"gtep.best_set_index": str(best_index), "gtep.status": "finished",
                      "mlflow.note.content": note, **importance,
                      "gtep.best_trial_run_id": RUN_REF + f"{phase_key}/set{best_index:03d}"})
        return PhaseOutcome(name, run.run_id, best_index, hparams, summary, paths,
                            {"diverged_sets": counts["sets_diverged"], "incomplete_sets": counts["sets_incomplete"],
                             "trials": len(selection.scores)})


def tune_phase(resolved: ResolvedExperiment, console: Console, resume: bool = False,
               tags: dict[str, str] | None = None) -> PhaseOutcome:
    """Algorithm 2 and SelectBestHyperparameter of Algorithm 1. `tags` go on the phase run (a matrix cell's)."""
    return run_phase(runner_for(TUNE, resolved), resolved, console, resume, tags)


def finished_tune_outcome(resolved: ResolvedExperiment, paths: StudyPaths, manifest: Manifest) -> PhaseOutcome:
    """A resumed `gtep run` whose tuning phase had finished: H* as it was selected, nothing re-run."""
    best = read_best(paths.best)
    units = [u for u in manifest.units(TUNE.name) if u["set_index"] == best["set_index"]]
    return PhaseOutcome(TUNE.name, best["tuning_run_id"], int(best["set_index"]), best["hparams"],
                        summarize_units(units, resolved.config.search.orderings, resolved.family, resolved.criterion),
                        paths)


# ---------------------------------------------------------------- phase 2: evaluation


# The phases that train one fixed set over S orderings (Algorithm 3's shape), each with its own manifest entry,
# units folder and phase run. evaluate: H* on D^E (the protocol). original: the authors' reported values on D^E,
# the paper's "Original" beside H* (section 4.1, Figure 4, Table 7). conventional: H* on the tuning classes D^HT
# again, orderings S..2S-1 (their records, gtep/protocol/phases.py, say which data and orderings).


def original_best(resolved: ResolvedExperiment) -> dict[str, Any]:
    """The `original` preset of the algorithm's search-space file, shaped like a best.yaml."""
    algorithm = resolved.config.algorithm
    presets = load_space(algorithm, resolved.space_path).presets
    if "original" not in presets:
        raise ConfigError("original", f"{resolved.space_path} has no 'original' preset for {algorithm}; add the "
                          "authors' values under presets.original, or leave the original phase out")
    return {"algorithm": algorithm, "set_index": -1, "hparams": dict(presets["original"]), "source": "preset:original"}


def set_label(best: dict[str, Any]) -> str:
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


class FixedSetRunner(PhaseRunner):
    """Train one fixed set (`best`: a best.yaml or a preset) over the phase's S orderings (one Ray trial per
    ordering); report mean and std over them (paper Algorithm 3). With `resume`, a running phase continues its
    attempt and a finished one with the same set is returned as it was."""

    def __init__(self, phase: Phase, best: dict[str, Any]) -> None:
        if phase.many_sets:
            raise ValueError(f"phase {phase.name!r} trains several sets, not one")
        super().__init__(phase)
        self.best, self.set_index, self.hparams = best, int(best.get("set_index", -1)), dict(best["hparams"])
        self.label = set_label(best)

    def plan(self, resolved: ResolvedExperiment, paths: StudyPaths, manifest: Manifest, resume: bool,
             tags: dict[str, str], console: Console) -> PhasePlan | PhaseOutcome:
        S, name, best = resolved.config.search.orderings, self.phase.name, self.best
        orderings = self.phase.orderings(S)
        previous = manifest.data["phases"].get(name, {})
        same = previous.get("hparams") == self.hparams and previous.get("orderings", list(range(S))) == orderings
        if resume and same and previous.get("status") == "finished" and previous.get("summary"):
            return finished_fixed_outcome(paths, name, previous)
        run_tags = {"gtep.tuning_run_id": str(best.get("tuning_run_id") or ""),
                    "gtep.hparams_source": best.get("source", "tuning"), **tags}
        set_index, hparams = self.set_index, self.hparams
        return PhasePlan(
            sets=[set_index], total_units=S,
            param_space={"trial": {"set_index": set_index, "hparams": hparams},
                         "orderings": tune.grid_search([[s] for s in orderings])},
            set_of_trial=lambda trial: set_index, hparams_of=lambda _: hparams, trial_label=lambda _: self.label,
            progress_label=f"{name} {resolved.config.algorithm}",
            resume=resume and same and previous.get("status") in ("running", "interrupted", "incomplete"),
            run_tags=run_tags, hparams=hparams,
            manifest_fields={"set_index": set_index, "hparams": hparams, "orderings": orderings,
                             "tuning_run_id": run_tags["gtep.tuning_run_id"],
                             "hparams_source": run_tags["gtep.hparams_source"]})

    def finish(self, run: PhaseRun) -> PhaseOutcome:
        resolved, paths, journal = run.resolved, run.paths, run.journal
        name, set_index, hparams, label = self.phase.name, self.set_index, self.hparams, self.label
        S = resolved.config.search.orderings
        units = run.manifest.units(name)
        summary = summarize_units(units, S, resolved.family, resolved.criterion)
        complete = len(units) == S
        status = "finished" if complete else "incomplete"
        score = score_set(set_index, [ordering_result(u) for u in units], S, resolved.criterion)
        tags = {"gtep.status": status, "gtep.orderings": f"{len(units)}/{S}"}
        if not complete:
            tags["gtep.reason"] = (f"{len(units)} of {S} orderings finished; the others' trials failed after their "
                                   "retries")
        tuned_by = run.plan.run_tags["gtep.tuning_run_id"]
        link = [f"H* was selected by the [tuning run](#/experiments/{journal.state.experiment_id}/runs/{tuned_by})."] \
            if tuned_by else []
        tags["mlflow.note.content"] = phase_note(name, phase_tags(resolved, self.phase)["gtep.dataset"], summary,
                                                 hparams, label if label != "H*" else
                                                 f"H* (set{set_index:03d} of the tuning run)", link)
        counts = {f"sets_{state}": int(score.status == state) for state in ("complete", "incomplete", "diverged")}
        metrics = {**phase_metrics(units, summary), **counts, **compute_metrics(paths, name, run.attempt, units),
                   **{k: float(summary[k]) for k in ("diverged", "orderings") if pd.notna(summary[k])}}
        run.close(units, lambda _: hparams, [score], status, metrics,
                  "FINISHED" if complete and not summary["diverged"] else "FAILED", step_points(summary), tags=tags,
                  files=(paths.manifest,) + ((paths.best,) if paths.best.exists() else ()), summary=summary)
        if not complete:
            raise run.incomplete(len(units), S, summary)
        return PhaseOutcome(name, run.run_id, set_index, hparams, summary, paths)


def evaluate_phase(resolved: ResolvedExperiment, best: dict[str, Any], console: Console,
                   resume: bool = False, tags: dict[str, str] | None = None) -> PhaseOutcome:
    """Algorithm 3: H* (or the given set) over S orderings of D^E."""
    return run_phase(runner_for(EVALUATE, resolved, best), resolved, console, resume, tags)


def original_phase(resolved: ResolvedExperiment, console: Console, resume: bool = False,
                   tags: dict[str, str] | None = None) -> PhaseOutcome:
    """The algorithm's `original` preset over S orderings of D^E, beside H* (the paper's "Original", section 4.1)."""
    return run_phase(runner_for(ORIGINAL, resolved), resolved, console, resume, tags)


def conventional_phase(resolved: ResolvedExperiment, best: dict[str, Any], console: Console, resume: bool = False,
                       tags: dict[str, str] | None = None) -> PhaseOutcome:
    """The conventional protocol (section 3.1): H* evaluated on the classes it was tuned on, orderings S..2S-1."""
    return run_phase(runner_for(CONVENTIONAL, resolved, best), resolved, console, resume, tags)


# ---------------------------------------------------------------- each phase's runner, in the one mapping RUNNERS


@register_runner(TUNE)
def tuning_runner(phase: Phase, resolved: ResolvedExperiment, best: dict[str, Any] | None) -> PhaseRunner:
    """The tuning phase over the algorithm's search space, loaded before the study folder is touched."""
    return TuneRunner(load_space(resolved.config.algorithm, resolved.space_path).space, phase)


def tuned_set_runner(phase: Phase, resolved: ResolvedExperiment, best: dict[str, Any] | None) -> PhaseRunner:
    """A phase that runs H* (the set the tuning phase selected, or the one given) over S orderings."""
    if best is None:
        raise ValueError(f"the {phase.name} phase runs H*, and there is none yet: tune first, or give a set")
    return FixedSetRunner(phase, best)


def original_runner(phase: Phase, resolved: ResolvedExperiment, best: dict[str, Any] | None) -> PhaseRunner:
    """The algorithm's `original` preset over S orderings (whatever H* is)."""
    return FixedSetRunner(phase, original_best(resolved))


register_runner(EVALUATE)(tuned_set_runner)
register_runner(CONVENTIONAL)(tuned_set_runner)
register_runner(ORIGINAL)(original_runner)
