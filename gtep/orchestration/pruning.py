"""Optuna's pruners on the orderings axis (search.pruner), for a live tuning phase and for `gtep replay`.

A set's running score after k of its S orderings (the trainable's `score`, H*'s criterion over those orderings)
is an Optuna intermediate value at step k. `PrunerBook` keeps one in-memory Optuna study whose trials are the
sets, reports each value and asks the pruner; a set finishing its S orderings is told COMPLETE (the median and
percentile pruners compare against finished sets), a pruned one PRUNED. The same book decides in the live
scheduler (`OptunaPruningScheduler`, a Ray Tune scheduler that stops the trial) and in a replay over the results
a study recorded, so a replay with a pruner shows what a live run in the same arrival order would have done.
The book is the pruner's own study, apart from the searcher's: a pruned trial reaches the searcher as Ray
reports any stopped trial (its last running score), as with ASHA.
"""
from __future__ import annotations

import logging
from typing import Any, Hashable

import optuna
from ray.tune.schedulers import FIFOScheduler, TrialScheduler

from gtep.config import PrunerOptions


def make_pruner(name: str, options: PrunerOptions, orderings: int) -> optuna.pruners.BasePruner:
    """search.pruner and its options as an Optuna pruner; max resource = S orderings."""
    if name == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=options.n_startup_trials,
                                           n_warmup_steps=options.n_warmup_steps)
    if name == "percentile":
        return optuna.pruners.PercentilePruner(options.percentile, n_startup_trials=options.n_startup_trials,
                                               n_warmup_steps=options.n_warmup_steps)
    if name == "successive_halving":
        return optuna.pruners.SuccessiveHalvingPruner(min_resource=options.min_resource,
                                                      reduction_factor=options.reduction_factor)
    if name == "hyperband":
        return optuna.pruners.HyperbandPruner(min_resource=options.min_resource, max_resource=orderings,
                                              reduction_factor=options.reduction_factor)
    raise ValueError(f"unknown pruner {name!r}")


class PrunerBook:
    """One Optuna trial per set (any hashable key: a set index, a Ray trial id)."""

    def __init__(self, pruner: optuna.pruners.BasePruner, orderings: int) -> None:
        optuna.logging.set_verbosity(logging.WARNING)  # one line per trial otherwise
        self.orderings = orderings
        # a fixed name: Optuna's Hyperband puts a trial in a bracket by a hash of the study's name and the trial's
        # number, and an unnamed study gets a random one, so the same study replayed twice chose differently
        self.study = optuna.create_study(study_name="gtep-pruner-book", direction="maximize", pruner=pruner)
        self.trials: dict[Hashable, optuna.Trial] = {}
        self.pruned: set[Hashable] = set()

    def report(self, key: Hashable, step: int, score: float) -> bool:
        """The set's running score after `step` orderings; True when the pruner stops it (never at step S,
        where the set is complete and told so)."""
        if key in self.pruned:
            return True
        trial = self.trials.get(key)
        if trial is None:
            trial = self.trials[key] = self.study.ask()
        trial.report(float(score), step)
        if step >= self.orderings:
            self.study.tell(trial, float(score), state=optuna.trial.TrialState.COMPLETE)
            return False
        if trial.should_prune():
            self.study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            self.pruned.add(key)
            return True
        return False


class OptunaPruningScheduler(FIFOScheduler):
    """A Ray Tune scheduler that asks a PrunerBook after every result (time_attr orderings_done, metric score)."""

    def __init__(self, pruner: optuna.pruners.BasePruner, steps: int, step_key: str = "orderings_done") -> None:
        """`steps`: a complete set's last step (S, or S x T with step_key tasks_done)."""
        super().__init__()
        self.book = PrunerBook(pruner, steps)
        self.step_key = step_key

    def on_trial_result(self, tune_controller: Any, trial: Any, result: dict[str, Any]) -> str:
        if self.step_key not in result or "score" not in result:
            return TrialScheduler.CONTINUE
        stop = self.book.report(trial.trial_id, int(result[self.step_key]), float(result["score"]))
        return TrialScheduler.STOP if stop else TrialScheduler.CONTINUE

    def debug_string(self) -> str:
        return f"Optuna pruning: {len(self.book.pruned)} of {len(self.book.trials)} sets pruned"
