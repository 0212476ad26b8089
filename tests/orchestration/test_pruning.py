"""Optuna's pruners on the orderings axis (search.pruner): the config's checks, the book's decisions (Optuna's own
pruners, fed the running scores), the Ray Tune scheduler that acts on them, and `gtep replay --pruner` over a
recorded study; a pruned set is never H*. The live tuning phase with a pruner is in test_cheap_study.py (slow)."""
from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
from ray.tune.schedulers import TrialScheduler
from typer.testing import CliRunner

from gtep.cli import app
from gtep.config import ConfigError, PrunerOptions, validate_config
from gtep.orchestration.pruning import OptunaPruningScheduler, PrunerBook, make_pruner
from gtep.orchestration.replay import RecordedStudy, replay_pruned
from gtep.protocol.criteria import DEFAULT_CRITERION
from tests.orchestration.test_phases import config
from tests.protocol.test_cheap_tuning import study

# set 3 starts far below the others and ends best (mean 0.7); set 4 is the best of the rest (0.65)
SCORES = {0: [0.5, 0.5, 0.5], 1: [0.6, 0.6, 0.6], 2: [0.58, 0.58, 0.58], 3: [0.1, 1.0, 1.0], 4: [0.65, 0.65, 0.65]}


def recorded(scores: dict[int, list[float]]) -> RecordedStudy:
    return RecordedStudy(root=Path("."), units=study(scores), orderings=3, sets=list(scores),
                         best_index=None, criterion=DEFAULT_CRITERION, selection="hmean_of_means", evaluated={})


@pytest.mark.parametrize("search, words", [
    ({"pruner": "median"}, ["search.pruner median", "optuna-tpe"]),  # the random searcher
    ({"pruner": "median", "searcher": "optuna-tpe", "scheduler": "asha", "orderings": 3}, ["not both"]),
])
def test_a_pruner_needs_an_optuna_searcher_and_no_scheduler(search, words):
    with pytest.raises(ConfigError) as err:
        validate_config(config(search=search), "test")
    assert err.value.field == "search" and all(w in str(err.value) for w in words), err.value


@pytest.mark.parametrize("options, field", [({"percentile": 100}, "search.pruner_options.percentile"),
                                            ({"reduction_factor": 1}, "search.pruner_options.reduction_factor"),
                                            ({"warmup": 1}, "search.pruner_options.warmup")])
def test_bad_pruner_options_name_their_field(options, field):
    with pytest.raises(ConfigError) as err:
        validate_config(config(search={"pruner": "percentile", "searcher": "optuna-tpe", "pruner_options": options}),
                        "test")
    assert err.value.field == field, err.value


def test_the_median_pruner_stops_a_set_below_the_finished_sets_median_at_the_same_ordering():
    book = PrunerBook(make_pruner("median", PrunerOptions(n_startup_trials=2), 3), orderings=3)
    for key, values in ((0, [0.5, 0.5, 0.5]), (1, [0.6, 0.6, 0.6])):
        assert not any(book.report(key, step, v) for step, v in enumerate(values, start=1))
    assert book.report(2, 1, 0.3)  # below the median (0.55) of the two finished sets after one ordering
    assert book.report(2, 2, 0.9)  # once pruned, it stays pruned
    assert not book.report(3, 1, 0.58) and not book.report(3, 2, 0.58)
    assert not book.report(3, 3, 0.1)  # its last ordering: complete, never stopped there
    assert book.pruned == {2}


def test_no_set_is_pruned_before_the_startup_sets_have_finished():
    book = PrunerBook(make_pruner("median", PrunerOptions(n_startup_trials=2), 3), orderings=3)
    assert not book.report("a", 1, 0.9) and not book.report("b", 1, 0.0) and not book.report("c", 1, 0.0)


def test_the_scheduler_stops_the_trial_the_book_prunes():
    scheduler = OptunaPruningScheduler(make_pruner("median", PrunerOptions(n_startup_trials=1), 3), 3)
    good, bad = SimpleNamespace(trial_id="good"), SimpleNamespace(trial_id="bad")
    decisions = [scheduler.on_trial_result(None, good, {"orderings_done": k, "score": 0.8}) for k in (1, 2, 3)]
    assert decisions == [TrialScheduler.CONTINUE] * 3
    assert scheduler.on_trial_result(None, bad, {"orderings_done": 1, "score": 0.2}) == TrialScheduler.STOP
    assert scheduler.on_trial_result(None, bad, {"training_iteration": 1}) == TrialScheduler.CONTINUE
    assert "1 of 2 sets pruned" in scheduler.debug_string()


@pytest.mark.parametrize("pruner", ["median", "percentile", "successive_halving", "hyperband"])
def test_a_replay_with_any_pruner_never_selects_a_pruned_set(pruner):
    outcome = replay_pruned(recorded(SCORES), pruner, PrunerOptions(n_startup_trials=1, percentile=50.0))
    assert outcome.best_index is not None and outcome.best_index not in outcome.stopped
    for i in outcome.stopped:
        assert math.isnan(outcome.scores[i])
    assert (outcome.fraction < 1) == bool(outcome.stopped)  # a stopped set's later orderings are not trained


def test_a_hyperband_replay_decides_the_same_each_time():
    """Optuna's Hyperband brackets hash the study's name: an unnamed (randomly named) book made the same recorded
    study replay to different stops and compute from one `gtep replay` to the next."""
    scores = {i: [0.3 + 0.05 * ((7 * i) % 11), 0.4 + 0.03 * i, 0.5] for i in range(12)}
    options = PrunerOptions(min_resource=1, reduction_factor=2)
    outcomes = {(o.stopped, o.fraction, o.best_index)
                for o in (replay_pruned(recorded(scores), "hyperband", options) for _ in range(8))}
    assert len(outcomes) == 1


def test_a_median_replay_stops_the_late_bloomer_and_spends_less():
    outcome = replay_pruned(recorded(SCORES), "median", PrunerOptions(n_startup_trials=2))
    # sets 0, 1, 2 finish first; set 3's first ordering (0.1) is below their median (0.58): pruned, although
    # its mean over all three (0.7) is the study's best; H* is then set 4, the price of stopping early
    assert outcome.stopped == (3,)
    assert outcome.best_index == 4
    assert outcome.fraction == pytest.approx(13 / 15)


def test_replay_command_with_a_pruner(tmp_path):
    root = tmp_path / "study"
    (root / "units").mkdir(parents=True)
    units = study(SCORES)
    manifest = {"config": {"search": {"orderings": 3}}, "sets": [{"index": i} for i in SCORES],
                "phases": {"tune": {"best_set_index": 3, "attempt": "x"}},
                "units": {f"tune/{u['set_index']}/{u['ordering']}": u for u in units}}
    (root / "manifest.json").write_text(json.dumps(manifest))
    runner = CliRunner()
    shown = runner.invoke(app, ["replay", str(root), "--pruner", "median", "--pruner-option", "n_startup_trials=2"])
    assert shown.exit_code == 0, shown.output
    assert "replay the median pruner of study: H* = set004 (the full study's: set003)" in shown.output
    assert "86.7% of the full study" in shown.output and "stopped early: 1 of 5 sets (set003)" in shown.output
    for args, option in ((["--pruner", "mean"], "--pruner"), (["--pruner", "median", "--pruner-option", "x=1"],
                                                                 "--pruner-option"),
                         (["--pruner", "median", "--pruner-option", "percentile=200"], "--pruner-option"),
                         (["--pruner-option", "n_startup_trials=1"], "--pruner-option"),
                         (["--pruner", "median", "--scheduler", "first_task"], "--pruner")):
        refused = runner.invoke(app, ["replay", str(root), *args])
        assert refused.exit_code == 2 and option in refused.output, (args, refused.output)
