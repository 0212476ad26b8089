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

    def evaluation_score(self, set_index: int | None) -> float | None:
        """The evaluation phase's score of a set (H*'s criterion over its mean metrics), when it was evaluated."""
        if set_index is None or set_index not in self.evaluated:
            return None
        summary = self.evaluated[set_index]
        return self.criterion.combine([float(summary.get(name, math.nan)) for name in self.criterion.components])


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
    tune = manifest.get("phases", {}).get("tune", {})
    orderings = int(search.get("orderings", 5))
    units = full_units(root, "tune", str(tune.get("attempt", "")),
                       [u for key, u in manifest.get("units", {}).items() if key.startswith("tune/")])
    best_yaml = root / "best.yaml"
    best: dict[str, Any] = {}
    if best_yaml.exists():
        best = yaml.safe_load(best_yaml.read_text()) or {}
    name = best.get("criterion") or search.get("criterion")
    criterion = CRITERIA.get(name) if name else DEFAULT_CRITERION
    evaluated = {}
    evaluate = manifest.get("phases", {}).get("evaluate", {})
    if evaluate.get("status") == "finished" and evaluate.get("summary"):
        evaluated[int(evaluate.get("set_index", -1))] = evaluate["summary"]
    best_index = tune.get("best_set_index", best.get("set_index"))
    return RecordedStudy(root, units, orderings, [int(s["index"]) for s in manifest.get("sets", [])],
                         None if best_index is None else int(best_index), criterion,
                         best.get("selection") or search.get("selection", "hmean_of_means"), evaluated)


def replay_study(study: RecordedStudy, rule: str, **options: Any) -> ReplayOutcome:
    return replay(study.units, study.orderings, study.sets, rule, criterion=study.criterion,
                  selection=study.selection, **options)


def replay_pruned(study: RecordedStudy, pruner: str, options: PrunerOptions) -> ReplayOutcome:
    """The study's results in arrival order through Optuna's `pruner` (search.pruner), as a live run decides."""
    book = PrunerBook(make_pruner(pruner, options, study.orderings), study.orderings)
    return replay(study.units, study.orderings, study.sets, f"optuna-{pruner}", criterion=study.criterion,
                  selection=study.selection, stop_rule=book.report)
