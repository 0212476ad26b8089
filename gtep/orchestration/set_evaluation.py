"""Every tuned set evaluated (evaluation.sets: all, `gtep evaluate --sets all`): after the evaluate phase has
trained H* over the S orderings of D^E, the `evaluate_sets` phase trains every other set the tuning phase drew
over the same orderings, so each set's evaluation score is known. It is a phase of its own (manifest entry, units
folder, phase run with a trial run per set tagged gtep.set_index, ordering runs under it), so H*'s evaluate phase,
its rows and the study's headline are unchanged. A resume continues its attempt (finished units are reused).

At its end it measures what the issue asks of GTEP itself and of the cheaper protocols (gtep/protocol/regret.py):
the rank agreement of the sets between the phases, H*'s evaluation rank and regret (metrics of its phase run), and
the regret table of every protocol (protocol_regret.json, in the study folder and on the phase run).
"""
from __future__ import annotations

import json
import math
from typing import Any

from ray import tune
from rich.console import Console

from gtep.config import ConfigError, ResolvedExperiment
from gtep.orchestration.journal import TrackingJournal
from gtep.orchestration.phase_run import (
    PhaseOutcome,
    PhasePlan,
    PhaseRun,
    PhaseRunner,
    compute_metrics,
    register_runner,
    run_phase,
    runner_for,
)
from gtep.orchestration.replay import load_study, protocol_table, set_ranking
from gtep.orchestration.study import Manifest, StudyPaths, write_atomic
from gtep.orchestration.tracking import ordering_result, summarize_units
from gtep.protocol.phases import EVALUATE, EVALUATE_SETS, REGRET_FILE, TUNE, Phase
from gtep.protocol.regret import json_ready
from gtep.protocol.selection import score_set


def sets_to_evaluate(manifest: Manifest) -> tuple[int, list[int]]:
    """(H*, the other tuned sets): refused unless the tuning phase selected H* and the evaluate phase trained it."""
    phases = manifest.data["phases"]
    tuned, evaluated = phases.get(TUNE.name, {}), phases.get(EVALUATE.name, {})
    if tuned.get("status") != "finished" or tuned.get("best_set_index") is None:
        raise ConfigError("evaluation.sets", f"all evaluates every set of a finished tuning phase, and "
                          f"{manifest.path.parent} has none; run gtep tune first")
    best = int(tuned["best_set_index"])
    if evaluated.get("status") != "finished" or int(evaluated.get("set_index", -1)) != best:
        raise ConfigError("evaluation.sets", "all evaluates the other sets beside H*'s finished evaluation; "
                          "run gtep evaluate (H*) first")
    return best, [int(s["index"]) for s in manifest.data["sets"] if int(s["index"]) != best]


class EverySetRunner(PhaseRunner):
    """Every tuned set but H* over the S orderings of D^E (one Ray trial per set); at the end the set ranking and
    the protocols' regret table. With `resume`, a running phase continues and a finished one is returned."""

    def __init__(self, phase: Phase = EVALUATE_SETS) -> None:
        super().__init__(phase)
        self.best: int = -1
        self.sets: list[int] = []

    def plan(self, resolved: ResolvedExperiment, paths: StudyPaths, manifest: Manifest, resume: bool,
             tags: dict[str, str], console: Console) -> PhasePlan | PhaseOutcome:
        S, name = resolved.config.search.orderings, self.phase.name
        self.best, self.sets = best, sets = sets_to_evaluate(manifest)
        previous = manifest.data["phases"].get(name, {})
        same = previous.get("sets") == sets and previous.get("orderings") == self.phase.orderings(S)
        if resume and same and previous.get("status") == "finished":
            if previous.get("ranking"):
                console.print(ranking_line(previous["ranking"]))
            return PhaseOutcome(name, previous["mlflow_run_id"], best, manifest.hparams(best), {}, paths,
                                {"reused": True, "ranking": previous.get("ranking", {})})
        run_tags = {"gtep.tuning_run_id": str(manifest.data["phases"][TUNE.name].get("mlflow_run_id", "")),
                    "gtep.best_set_index": str(best), **tags}
        return PhasePlan(
            sets=sets, total_units=len(sets) * S,
            param_space={"trial": tune.grid_search([{"set_index": i, "hparams": manifest.hparams(i)} for i in sets]),
                         "orderings": self.phase.orderings(S)},
            set_of_trial=lambda trial: int(trial.config["trial"]["set_index"]), hparams_of=manifest.hparams,
            progress_label=f"evaluate every set {resolved.config.algorithm}",
            resume=resume and same and previous.get("status") in ("running", "interrupted", "incomplete"),
            run_tags=run_tags,
            manifest_fields={"sets": sets, "orderings": self.phase.orderings(S), "best_set_index": best})

    def finish(self, run: PhaseRun) -> PhaseOutcome:
        """The sets' results CSV and summaries; when every set finished, the ranking and the regret table too."""
        resolved, paths, manifest, journal = run.resolved, run.paths, run.manifest, run.journal
        phase_key = run.phase_key
        name, best, sets = self.phase.name, self.best, self.sets
        S = resolved.config.search.orderings
        units = manifest.units(name)
        by_set = {i: [u for u in units if u["set_index"] == i] for i in sets}
        scores = [score_set(i, [ordering_result(u) for u in by_set[i]], S, resolved.criterion) for i in sets]
        run.write_results(units, manifest.hparams, scores)
        summaries = {str(i): summarize_units(by_set[i], S, resolved.family, resolved.criterion) for i in sets}
        complete = all(len(by_set[i]) == S for i in sets)
        counts = {f"sets_{state}": sum(s.status == state for s in scores) for state in ("complete", "incomplete",
                                                                                          "diverged")}
        manifest.set_phase(name, status="finished" if complete else "incomplete", summaries=summaries)
        metrics: dict[str, float] = {**counts, **compute_metrics(paths, name, run.attempt, units)}
        tags = {"gtep.status": "finished" if complete else "incomplete",
                "gtep.orderings": f"{sum(len(u) for u in by_set.values())}/{len(sets) * S}"}
        ranking: dict[str, Any] = {}
        if complete:
            ranking = write_regret(paths, journal, phase_key)
            manifest.set_phase(name, ranking=ranking)
            metrics.update(ranking_metrics(ranking))
        else:
            tags["gtep.reason"] = "some sets' orderings failed after their retries; resume to run them"
        run.end(metrics, "FINISHED" if complete else "FAILED", tags=tags)
        if not complete:
            raise run.incomplete(sum(len(u) for u in by_set.values()), len(sets) * S)
        run.console.print(ranking_line(ranking))
        return PhaseOutcome(name, run.run_id, best, manifest.hparams(best), {}, paths, {"ranking": ranking})


def evaluate_sets_phase(resolved: ResolvedExperiment, console: Console, resume: bool = False,
                        tags: dict[str, str] | None = None) -> PhaseOutcome:
    """Train every tuned set but H* over the S orderings of D^E, then write the set ranking and the protocols'
    regret table (EverySetRunner)."""
    return run_phase(runner_for(EVALUATE_SETS, resolved), resolved, console, resume, tags)


@register_runner(EVALUATE_SETS)
def every_set_runner(phase: Phase, resolved: ResolvedExperiment, best: dict[str, Any] | None) -> PhaseRunner:
    """Every tuned set but H* (the manifest says which) on D^E."""
    return EverySetRunner(phase)


def write_regret(paths: StudyPaths, journal: TrackingJournal, phase_key: str) -> dict[str, Any]:
    """The set ranking and the regret table, from the study folder as replay reads it; in protocol_regret.json."""
    study = load_study(paths.root)
    ranking = set_ranking(study).as_dict()
    table = {"study": paths.root.name, "criterion": study.criterion.name, "ranking": ranking,
             "protocols": [row.as_dict() for row in protocol_table(study)]}
    write_atomic(paths.root / REGRET_FILE, json.dumps(json_ready(table), indent=1, default=str))
    journal.log_file(phase_key, paths.root / REGRET_FILE)
    return ranking


def ranking_metrics(ranking: dict[str, Any]) -> dict[str, float]:
    """The ranking as the phase run's metrics (finite ones: MLflow refuses no NaN, but a report reads NaN as absent)."""
    values = {"kendall_tau": ranking["kendall_tau"], "spearman_rho": ranking["spearman_rho"],
              "best_eval_rank": ranking["best_rank"], "best_regret": ranking["regret"],
              "sets_ranked": ranking["ranked"]}
    return {k: float(v) for k, v in values.items() if v is not None and math.isfinite(float(v))}


def ranking_line(ranking: dict[str, Any]) -> str:
    """What the terminal prints after every set was evaluated."""
    rank = ranking.get("best_rank")
    return (f"every set evaluated: Kendall's tau {ranking['kendall_tau']:.2f}, Spearman's rho "
            f"{ranking['spearman_rho']:.2f} over {ranking['ranked']} sets; H* ranks "
            f"{rank if rank is not None else 'last (diverged)'} of {ranking['sets']} on D^E, regret "
            f"{100 * ranking['regret']:.2f} points")
