"""A finished study's folder as gtep replay reads it: its tuning units (with their accuracy matrices and task
seconds), S, the sets, H*, the criterion and what its evaluation phase measured (gtep/protocol/replay.py replays
them)."""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gtep.config import ConfigError, PrunerOptions
from gtep.orchestration.pruning import PrunerBook, make_pruner
from gtep.orchestration.study import full_units
from gtep.protocol.criteria import CRITERIA, DEFAULT_CRITERION, Criterion
from gtep.protocol.families import CLASS_INCREMENTAL, FAMILIES
from gtep.protocol.phases import EVALUATE, TUNE, phases_in_order
from gtep.protocol.regret import ProtocolRow, SetRanking, protocol_rows, rank_sets
from gtep.protocol.replay import ReplayOutcome, replay
from gtep.protocol.selection import SelectionRule


@dataclass(frozen=True)
class RecordedStudy:
    root: Path
    units: list[dict[str, Any]]
    orderings: int
    sets: list[int]
    best_index: int | None
    criterion: Criterion
    selection: SelectionRule
    evaluated: dict[int, dict[str, Any]]  # set index -> the evaluate phase's summary of it
    tasks: int | None = None  # T of a tuning ordering when the family reports per task (first_task can cut it)

    def evaluation_score(self, set_index: int | None) -> float | None:
        """The evaluation phase's score of a set (H*'s criterion over its mean metrics), when it was evaluated."""
        if set_index is None or set_index not in self.evaluated:
            return None
        summary = self.evaluated[set_index]
        return self.criterion.combine([float(summary.get(name, math.nan)) for name in self.criterion.components])

    @property
    def all_evaluated(self) -> bool:
        """Every tuned set has an evaluation summary (evaluation.sets: all, finished): the regret table's input."""
        return bool(self.sets) and set(self.sets) <= set(self.evaluated)

    def missing_evaluations(self) -> list[int]:
        return [i for i in self.sets if i not in self.evaluated]

    def evaluation_scores(self) -> dict[int, float]:
        """Each evaluated set's evaluation score; NaN for a set that diverged on D^E (as the report shows it)."""
        return {i: math.nan if float(summary.get("diverged") or 0) > 0 else float(self.evaluation_score(i) or 0.0)
                for i, summary in sorted(self.evaluated.items())}


def load_study(root: Path) -> RecordedStudy:
    """A study folder's tuning units (the unit files of its last tuning attempt; the manifest's units where a
    file is missing), its S, sets, H*, criterion and what its evaluation phase measured."""
    root = Path(root)
    manifest_path = root / "manifest.json"
    if not manifest_path.exists():
        raise FileNotFoundError(f"{root} has no manifest.json; give the folder of a study (OUTPUT/STUDY)")
    try:
        manifest = json.loads(manifest_path.read_text())
        if not isinstance(manifest, dict):
            raise ValueError(f"a JSON {type(manifest).__name__}, not the mapping gtep writes")
    except (ValueError, OSError) as err:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise ConfigError("study_dir", f"{manifest_path} is damaged ({str(err)[:120]}); restore it from a copy "
                          "or run the study again (gtep run): replay reads the study's records from it") from None
    try:
        return recorded_study(root, manifest)
    except (ValueError, TypeError, KeyError, AttributeError, yaml.YAMLError) as err:  # a record of another shape
        reason = f"{err.__class__.__name__}: {str(err)[:120]}"
        raise ConfigError("study_dir", f"{root} holds records gtep cannot read ({reason}) in manifest.json, "
                          "best.yaml or units/; restore them from a copy or run the study again (gtep run)") from None


def recorded_study(root: Path, manifest: dict[str, Any]) -> RecordedStudy:
    """The study `load_study` reads, from its manifest (a mapping) and the files beside it."""
    config = manifest.get("config", {})
    search = config.get("search", {})
    phases = manifest.get("phases", {})
    tune = phases.get(TUNE.name, {})
    orderings = int(search.get("orderings", 5))
    units = full_units(root, TUNE.name, str(tune.get("attempt", "")),
                       [u for key, u in manifest.get("units", {}).items() if key.startswith(f"{TUNE.name}/")])
    best_yaml = root / "best.yaml"
    best: dict[str, Any] = {}
    if best_yaml.exists():
        best = yaml.safe_load(best_yaml.read_text()) or {}
    name = best.get("criterion") or search.get("criterion")
    criterion = CRITERIA.get(name) if name else DEFAULT_CRITERION
    evaluated = {}
    evaluate = phases.get(EVALUATE.name, {})
    if evaluate.get("status") == "finished" and evaluate.get("summary"):
        evaluated[int(evaluate.get("set_index", -1))] = evaluate["summary"]
    for name in ranked_phases():  # the other sets (evaluation.sets: all); H*'s stays the evaluate phase's
        every = phases.get(name, {})
        if every.get("status") == "finished":
            evaluated.update({int(i): s for i, s in (every.get("summaries") or {}).items() if int(i) not in evaluated})
    best_index = tune.get("best_set_index", best.get("set_index"))
    return RecordedStudy(root, units, orderings, [int(s["index"]) for s in manifest.get("sets", [])],
                         None if best_index is None else int(best_index), criterion,
                         best.get("selection") or search.get("selection", "hmean_of_means"), evaluated,
                         tasks_to_cut(config, units))


def ranked_phases() -> list[str]:
    """The phases that evaluate every tuned set on D^E (their records say so: writes_regret), in report order."""
    return [phase.name for phase in phases_in_order() if phase.writes_regret]


def tasks_to_cut(config: dict[str, Any], units: list[dict[str, Any]]) -> int | None:
    """T of the tuning orderings when the study's family reports per task (its units carry accuracy matrices)."""
    family = config.get("scenario", {}).get("family", CLASS_INCREMENTAL)
    if family not in FAMILIES or not FAMILIES.get(family).reports_per_task:
        return None
    matrices = [u["acc_matrix"] for u in units if u.get("acc_matrix")]
    return len(matrices[0]) if matrices else None


def replay_study(study: RecordedStudy, rule: str, **options: Any) -> ReplayOutcome:
    return replay(study.units, study.orderings, study.sets, rule, criterion=study.criterion,
                  selection=study.selection, **options)


# Optuna's pruners in the regret table (their default options, search.pruner_options'), HyperBand among them: Ray's
# synchronous HyperBand brackets are not replayed, Optuna's HyperbandPruner is the same idea on the same axis
TABLE_PRUNERS = (("optuna-median", "median"), ("optuna-successive_halving", "successive_halving"),
                 ("optuna-hyperband", "hyperband"))


def protocol_table(study: RecordedStudy) -> list[ProtocolRow]:
    """Every protocol's row for a study whose every set was evaluated (gtep/protocol/regret.py)."""
    if not study.all_evaluated:
        missing = ", ".join(f"set{i:03d}" for i in study.missing_evaluations())
        raise ConfigError("study_dir", f"{study.root} has no evaluation of {missing}; the regret table needs every "
                          f"set evaluated: gtep evaluate --resume {study.root} --sets all")
    options = PrunerOptions()
    rules = [(name, "defaults", PrunerBook(make_pruner(pruner, options, study.orderings), study.orderings).report)
             for name, pruner in TABLE_PRUNERS]
    return protocol_rows(study.units, study.orderings, study.sets, study.evaluation_scores(),
                         best_index=study.best_index, criterion=study.criterion, selection=study.selection,
                         tasks=study.tasks, stop_rules=rules)


def set_ranking(study: RecordedStudy) -> SetRanking:
    """How the study's tuning scores of its sets agree with their evaluation scores (every set evaluated)."""
    tuning = replay(study.units, study.orderings, study.sets, "none", criterion=study.criterion,
                    selection=study.selection).scores
    return rank_sets(tuning, study.evaluation_scores(), study.best_index)


def replay_pruned(study: RecordedStudy, pruner: str, options: PrunerOptions) -> ReplayOutcome:
    """The study's results in arrival order through Optuna's `pruner` (search.pruner), as a live run decides."""
    book = PrunerBook(make_pruner(pruner, options, study.orderings), study.orderings)
    return replay(study.units, study.orderings, study.sets, f"optuna-{pruner}", criterion=study.criterion,
                  selection=study.selection, stop_rule=book.report)
