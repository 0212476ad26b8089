"""Which tuning shortcut is safe: with every tuned set evaluated on D^E (`evaluation.sets: all`), how well the tuning
phase ranks the sets, and what each cheaper protocol loses (its regret) and saves (its compute), training nothing.

- `rank_sets`: Kendall's tau-b and Spearman's rho between the sets' tuning and evaluation scores (sets that
  diverged in either phase left out), H*'s evaluation rank and H*'s regret.
- `protocol_rows`: for each protocol (gtep/protocol/replay.py's rules, and any stop rule such as Optuna's pruners,
  made by the caller), the set it picks, its compute relative to the full study and its regret on D^E.

Regret = the best evaluated set's score minus the picked set's, in the units of the scores (fractions; the tables
print points). A picked set that diverged on D^E scores 0: a protocol that picks it has lost everything. Random
choice is the floor: its expected regret over the sets, for no tuning compute.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from gtep.protocol.criteria import DEFAULT_CRITERION, Criterion
from gtep.protocol.metrics import kendall_tau_b
from gtep.protocol.replay import ReplayOutcome, StopRule, replay
from gtep.protocol.selection import SelectionRule
from gtep.protocol.ties import average_ranks, competition_ranks, same_score, top_group

ASHA_SETTINGS = ((1, 2.0), (1, 4.0))  # (grace period, reduction factor): keep the top half, or the top quarter
FIRST_TASK_K = (1, 2, 3)
CONVENTIONAL_NOTE = ("tunes on D^E itself: its compute is the full study's on D^E, and its reported score is "
                     "optimistic (selected on the data it reports)")
RANDOM_NOTE = "the floor: expected regret of a set drawn at random, no tuning"
TIE_RULE = "lowest set index"  # select_best's rule among tied scores (gtep/protocol/selection.py)
# why a field of a stored table is null (JSON has no NaN: JavaScript's JSON.parse refuses it)
NULL_REASONS = {"kendall_tau": "fewer than two sets scored in both phases, or one phase's scores all equal",
                "spearman_rho": "fewer than two sets scored in both phases, or one phase's scores all equal",
                "regret": "no pick: the protocol does not apply, picked no set, or its pick is a tie (see note)",
                "fraction": "the protocol does not apply to this study (see note)"}


def spearman_rho(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman's rho (1904): Pearson's correlation of the average ranks, scores within gtep/protocol/ties.py's
    tolerance tied. Pairs with a NaN are dropped; NaN when fewer than two remain or either side is constant."""
    a, b = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    keep = ~(np.isnan(a) | np.isnan(b))
    a, b = a[keep], b[keep]
    if a.size < 2:
        return float("nan")
    ra, rb = average_ranks(a), average_ranks(b)
    ra, rb = ra - ra.mean(), rb - rb.mean()
    denominator = math.sqrt(float(np.sum(ra * ra) * np.sum(rb * rb)))
    return float(np.sum(ra * rb) / denominator) if denominator > 0 else float("nan")


@dataclass(frozen=True)
class SetRanking:
    """How the tuning phase's scores of the sets agree with their evaluation scores (fractions)."""
    sets: int  # sets evaluated on D^E
    ranked: int  # of them, those scored in both phases (neither diverged): the correlations' sample
    diverged: tuple[int, ...]  # sets that diverged in either phase: left out of the correlations
    kendall_tau: float
    spearman_rho: float
    best_index: int | None  # H*
    best_rank: int | None  # H*'s evaluation rank, 1 = the best evaluation score (None: H* diverged on D^E)
    regret: float  # best evaluation score - H*'s (0 for a diverged H*: it scores 0)

    def as_dict(self) -> dict[str, Any]:
        return {"sets": self.sets, "ranked": self.ranked, "diverged": list(self.diverged),
                "kendall_tau": self.kendall_tau, "spearman_rho": self.spearman_rho, "best_index": self.best_index,
                "best_rank": self.best_rank, "regret": self.regret}


def regret_of(picked: int | None, evaluation: Mapping[int, float]) -> float:
    """The best evaluation score minus the picked set's; a set that diverged on D^E (NaN) scores 0. NaN when the
    protocol picked nothing."""
    if picked is None or picked not in evaluation:
        return float("nan")
    return best_score(evaluation) - score_or_zero(evaluation[picked])


def score_or_zero(score: float) -> float:
    return 0.0 if math.isnan(score) else float(score)


def best_score(evaluation: Mapping[int, float]) -> float:
    return max((score_or_zero(s) for s in evaluation.values()), default=float("nan"))


def rank_sets(tuning: Mapping[int, float], evaluation: Mapping[int, float], best_index: int | None) -> SetRanking:
    """`tuning`, `evaluation`: each set's score in the phase (NaN: it diverged there, or could not be scored)."""
    sets = sorted(evaluation)
    diverged = tuple(i for i in sets if math.isnan(tuning.get(i, math.nan)) or math.isnan(evaluation[i]))
    x = [tuning.get(i, math.nan) for i in sets]
    y = [evaluation[i] for i in sets]
    rank = None
    if best_index is not None and best_index in evaluation and not math.isnan(evaluation[best_index]):
        # a set diverged on D^E scores 0; a set tied with H* (within tolerance) does not rank above it
        ranks = competition_ranks([score_or_zero(evaluation[i]) for i in sets])
        rank = int(ranks[sets.index(best_index)])
    return SetRanking(len(sets), len(sets) - len(diverged), diverged, kendall_tau_b(x, y), spearman_rho(x, y),
                      best_index, rank, regret_of(best_index, evaluation))


@dataclass(frozen=True)
class ProtocolRow:
    """One protocol with its options: the set it picks, its tuning compute relative to the full study, its regret on
    D^E (fraction units) and a note (why a row is not applicable, or what its numbers mean)."""
    protocol: str
    options: str
    picked: int | None
    fraction: float
    regret: float
    note: str = ""
    tied: int = 0  # sets sharing the top score under the rule when more than one (the pick is then undefined)

    def as_dict(self) -> dict[str, Any]:
        return {"protocol": self.protocol, "options": self.options, "picked": self.picked, "fraction": self.fraction,
                "regret": self.regret, "note": self.note, "tied": self.tied}


def tied_at_top(scores: Mapping[int, float], picked: int | None) -> list[int]:
    """The sets whose score ties the picked set's (gtep/protocol/ties.py's tolerance), the pick among them; [] for
    no pick."""
    if picked is None or picked not in scores or math.isnan(scores[picked]):
        return []
    top = scores[picked]
    return [i for i, s in sorted(scores.items()) if same_score(s, top)]


def outcome_row(protocol: str, options: str, outcome: ReplayOutcome, evaluation: Mapping[int, float],
                reference: bool = False) -> ProtocolRow:
    """A protocol's row. A pick decided by a tie (several sets at the top score: with the paper's fixed first-task
    recipe every set sharing task 1 scores the same at k = 1) is no pick: the row reads picked null, regret null
    and says which sets tie and what the tie rule (TIE_RULE) would have taken; `reference` (the full study) keeps
    its pick, which is the study's H*, and says that a tie decided it."""
    if outcome.best_index is None:
        return ProtocolRow(protocol, options, None, outcome.fraction, math.nan, "no set eligible")
    regret = regret_of(outcome.best_index, evaluation)
    tied = tied_at_top(outcome.scores, outcome.best_index)
    if len(tied) < 2:
        return ProtocolRow(protocol, options, outcome.best_index, outcome.fraction, regret)
    names = ", ".join(f"set{i:03d}" for i in tied)
    rule = f"the tie rule ({TIE_RULE}) takes set{outcome.best_index:03d}, regret {100 * regret:.2f} points"
    if reference:
        return ProtocolRow(protocol, options, outcome.best_index, outcome.fraction, regret,
                           f"decided by a tie of {len(tied)} sets ({names}): {rule}", len(tied))
    return ProtocolRow(protocol, options, None, outcome.fraction, math.nan,
                       f"undefined: a tie of {len(tied)} sets at the top score ({names}); {rule}", len(tied))


def json_ready(value: Any) -> Any:
    """A table as standard JSON: every NaN or infinity becomes null (JSON has no NaN, and JavaScript's JSON.parse
    refuses it), and a mapping that gets one says why beside it, in `nulls` (NULL_REASONS, or the row's note)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        out = {str(k): json_ready(v) for k, v in value.items()}
        nulled = [str(k) for k, v in value.items() if isinstance(v, float) and not math.isfinite(v)]
        if nulled and "nulls" not in out:
            out["nulls"] = {k: NULL_REASONS.get(k, "not a finite number") for k in nulled}
        return out
    if isinstance(value, (list, tuple)):
        return [json_ready(v) for v in value]
    return value


def conventional_row(evaluation: Mapping[int, float]) -> ProtocolRow:
    """Tuning on the evaluation data: the set best on D^E, by definition no regret, at the full study's compute."""
    scored = {i: score_or_zero(s) for i, s in evaluation.items()}
    picked = min(top_group(scored), default=None)  # the tie rule: the lowest index among the tied best
    return ProtocolRow("conventional", "tuned on D^E", picked, 1.0, regret_of(picked, evaluation), CONVENTIONAL_NOTE)


def random_row(evaluation: Mapping[int, float]) -> ProtocolRow:
    best = best_score(evaluation)
    expected = float(np.mean([best - score_or_zero(s) for s in evaluation.values()])) if evaluation else math.nan
    return ProtocolRow("random", "uniform over sets", None, 0.0, expected, RANDOM_NOTE)


def protocol_rows(units: list[dict[str, Any]], orderings: int, sets: Iterable[int], evaluation: Mapping[int, float],
                  *, best_index: int | None = None, criterion: Criterion = DEFAULT_CRITERION,
                  selection: SelectionRule = "hmean_of_means", tasks: int | None = None,
                  stop_rules: Sequence[tuple[str, str, StopRule]] = ()) -> list[ProtocolRow]:
    """Every protocol's row over a study's tuning `units` and its sets' `evaluation` scores (every set evaluated).
    `tasks`: T of a tuning ordering when the family reports per task (first_task needs it; None: not applicable).
    `stop_rules`: (protocol, options, rule) of the caller's other rules (Optuna's pruners), each rule fresh."""
    sets = list(sets)
    common: dict[str, Any] = {"criterion": criterion, "selection": selection}
    full = replay(units, orderings, sets, "none", **common)
    rows = [outcome_row("gtep (full)", f"R={len(sets)}, S={orderings}", full, evaluation, reference=True),
            conventional_row(evaluation)]
    if best_index is not None and full.best_index != best_index:  # the study's own H* is the reference
        rows[0] = ProtocolRow(rows[0].protocol, rows[0].options, best_index, 1.0, regret_of(best_index, evaluation))
    for grace, factor in ASHA_SETTINGS:
        options = f"grace {grace}, reduction {factor:g}"
        if grace >= orderings:
            rows.append(ProtocolRow("asha", options, None, math.nan, math.nan, f"needs more than {grace} orderings"))
            continue
        outcome = replay(units, orderings, sets, "asha", grace_period=grace, reduction_factor=factor, **common)
        rows.append(outcome_row("asha", options, outcome, evaluation))
    for protocol, options, rule in stop_rules:
        rows.append(outcome_row(protocol, options, replay(units, orderings, sets, protocol, stop_rule=rule, **common),
                                evaluation))
    for k in FIRST_TASK_K:
        if tasks is None or k >= tasks:
            why = "the family has no tasks to cut" if tasks is None else f"k is not below the scenario's {tasks} tasks"
            rows.append(ProtocolRow("first_task", f"k={k}", None, math.nan, math.nan, f"not applicable: {why}"))
            continue
        outcome = replay(units, orderings, sets, "first_task", protocol_tasks=k, **common)
        rows.append(outcome_row("first_task", f"k={k}", outcome, evaluation))
    rows.append(random_row(evaluation))
    return rows
