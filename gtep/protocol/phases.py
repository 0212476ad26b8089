"""The phases of a study as records: what each one trains, on which data, and what it writes.

GTEP (paper Algorithms 1-3) has a tuning phase on D^HT (draw R sets, select H*) and an evaluation phase on D^E
(H* over S fresh orderings). gtep adds phases of the same two shapes: `original` (the authors' values on D^E, the
paper's "Original", section 4.1), `conventional` (H* re-run on D^HT, the practice section 3.1 criticises) and
`evaluate_sets` (every other tuned set on D^E, so the protocols' regret can be measured, gtep/protocol/regret.py).

A phase is defined once, here: the orchestration runs any phase from its record (gtep/orchestration/phases.py,
run_phase), and tracking, replay and the reports read the record instead of comparing phase names. A new phase is
one record registered in PHASES plus its runner (docs/extending.md, "Adding a phase").

Which phases a study runs, and in which order, is one record too: a PhaseSequence, built by `study_phases` from the
study's choices (the protocol, with_original, evaluation.sets, the phases a matrix file asks for). `gtep run`,
`gtep evaluate`, a matrix's cells, their resume and the reports read it; the order is the phases' `step`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Iterator, Literal

from gtep.registry import Registry

DataRole = Literal["D^HT", "D^E"]
REGRET_FILE = "protocol_regret.json"  # what a phase that writes_regret leaves in the study folder and on its run


@dataclass(frozen=True)
class Phase:
    """A phase of a study.

    name: its key in the manifest, the units folder, the results CSV and the MLflow tag gtep.phase.
    label: the word the API and the matrix use for its result ("tuning", "evaluation").
    data: D^HT (the tuning classes, resolved.tuning) or D^E (the evaluation classes, resolved.evaluation).
    many_sets: it trains several sets (a trial run per set, orderings named under it), or one fixed set.
    selects_best: the tuning phase: a fresh run of it starts the study (the R sets drawn into the manifest), a
        searcher suggests and a scheduler may stop its sets, and it writes H* to best.yaml.
    writes_regret: at its end it ranks every set on D^E and writes REGRET_FILE (gtep report reads it).
    ordering_block: the class orderings it runs are block*S .. block*S+S-1 (1: fresh orderings of D^HT).
    order: where it stands in reports, the tuning data first, then unseen data.
    step: where it runs in a study's plan (study_phases): tune, evaluate, evaluate_sets, conventional, original;
        a phase added to a study runs after them by default.
    column: its word in report columns and legends ("Original (D^E)"); empty: it has no summary row (every set's).
    curve_title: the title of its accuracy-curve panel; empty: no panel.
    line_style: its line in the gAcc(alpha) plot (matplotlib's; the paper draws tuning dashed).
    title: the heading the API prints over its summary.
    """

    name: str
    label: str
    data: DataRole
    many_sets: bool
    order: int
    selects_best: bool = False
    writes_regret: bool = False
    ordering_block: int = 0
    column: str = ""
    curve_title: str = ""
    line_style: str = "-"
    title: str = ""
    step: int = 10

    @property
    def results_csv(self) -> str:
        """Its results file in the study folder: one row per (set, ordering)."""
        return f"{self.name}_results.csv"

    @property
    def header(self) -> str:
        """Its column in the paper's tables: 'tuning (D^HT)'."""
        return f"{self.column} ({self.data})"

    @property
    def on_tuning_data(self) -> bool:
        return self.data == "D^HT"

    def orderings(self, S: int) -> list[int]:
        """The class orderings it runs."""
        return list(range(self.ordering_block * S, (self.ordering_block + 1) * S))


PHASES: Registry[Phase] = Registry("phase")


def register_phase(phase: Phase) -> Phase:
    """Add a phase under its own name (twice is an error)."""
    return PHASES.register(phase.name)(phase)


def phases_in_order() -> list[Phase]:
    """Every registered phase in report order."""
    return sorted((PHASES.get(name) for name in PHASES), key=lambda phase: (phase.order, phase.name))


def phase_named(name: str) -> Phase | None:
    """The record of a phase name read from a store or a folder; None for a name no phase has (an older study's)."""
    return PHASES.get(name) if name in PHASES else None


def as_phase(phase: Phase | str) -> Phase:
    """A phase's record: itself, or the record of a name read from a store, a state file or a test."""
    return phase if isinstance(phase, Phase) else PHASES.get(phase)


def reported_phases() -> list[Phase]:
    """The phases with a summary row (one set over S orderings, or H* of the tuning phase), in report order."""
    return [phase for phase in phases_in_order() if phase.column]


def fixed_set_phases() -> list[Phase]:
    """The phases that train one set over S orderings (Algorithm 3's shape), in report order."""
    return [phase for phase in phases_in_order() if not phase.many_sets]


TUNE = register_phase(Phase("tune", "tuning", "D^HT", many_sets=True, order=0, step=0, selects_best=True,
                            column="tuning", curve_title="tuning phase: H* on D^HT", line_style="--"))
# H* on the tuning classes again, orderings S..2S-1: a fresh re-run of the tuned scenario, not a copy of the units
# it was selected on (the conventional protocol, section 3.1)
CONVENTIONAL = register_phase(Phase("conventional", "conventional", "D^HT", many_sets=False, order=1, step=3,
                                    ordering_block=1, column="conventional", line_style="-.",
                                    title="Conventional protocol: H* on the tuning classes (fresh orderings)"))
EVALUATE = register_phase(Phase("evaluate", "evaluation", "D^E", many_sets=False, order=2, step=1, column="evaluation",
                                curve_title="evaluation phase: H* on D^E", title="Evaluation phase"))
ORIGINAL = register_phase(Phase("original", "original", "D^E", many_sets=False, order=3, step=4, column="Original",
                                line_style=":", title="Original preset on the evaluation phase"))
EVALUATE_SETS = register_phase(Phase("evaluate_sets", "every set", "D^E", many_sets=True, order=4, step=2,
                                     writes_regret=True))


# ---------------------------------------------------------------- a study's plan

PROTOCOLS = ("gtep", "conventional", "first_task")  # how H* is tuned and reported (search.protocol, --protocol)


@dataclass(frozen=True)
class PhaseSequence:
    """The phases a study runs, in the order it runs them (their `step`): one record for `gtep run`, `gtep
    evaluate`, a matrix's cells, their resume and the reports (build it with study_phases)."""

    phases: tuple[Phase, ...]

    def __iter__(self) -> Iterator[Phase]:
        return iter(self.phases)

    def __len__(self) -> int:
        return len(self.phases)

    def __contains__(self, phase: object) -> bool:
        """A phase record, or a phase name (as a store or a state file holds it)."""
        return phase in self.phases or phase in self.names

    @property
    def names(self) -> list[str]:
        """The phases' names, in order: what a matrix's state file records."""
        return [phase.name for phase in self.phases]

    def summarized(self) -> list[Phase]:
        """The phases with a summary row (one set over S orderings, or H* of the tuning phase), in run order."""
        return [phase for phase in self.phases if phase.column]

    def ran_by(self, names: Iterable[str]) -> bool:
        """Every phase of the plan is among `names` (the phases a finished matrix cell recorded)."""
        return set(self.names) <= set(names)


def study_phases(protocol: str = "gtep", *, with_original: bool = False, every_set: bool = False,
                 evaluate_only: bool = False, asked: Iterable[Phase | str] = ()) -> PhaseSequence:
    """The phases a study runs, in order, from its choices: tune, evaluate (H* on D^E), evaluate_sets with
    `every_set` (evaluation.sets: all), conventional with protocol "conventional" (H* re-run on D^HT), original
    with `with_original` (the authors' values on D^E); then every phase `asked` for (records or names: a matrix
    file's phases, a phase a plugin adds), each once. `evaluate_only`: H* is given or tuned already (`gtep
    evaluate`): no tuning phase, and protocol "conventional" runs H* on D^HT in place of the evaluation on D^E."""
    if protocol not in PROTOCOLS:
        raise ValueError(f"{protocol!r} is not a protocol; choose from {', '.join(PROTOCOLS)}")
    conventional = protocol == "conventional"
    if evaluate_only:
        if every_set and conventional:
            raise ValueError("every set is evaluated on D^E beside H*, not under the conventional protocol")
        chosen = [CONVENTIONAL] if conventional else [EVALUATE]
    else:
        chosen = [TUNE, EVALUATE] + [CONVENTIONAL] * conventional
    chosen += [EVALUATE_SETS] * every_set + [ORIGINAL] * with_original
    chosen += [phase if isinstance(phase, Phase) else PHASES.get(phase) for phase in asked]
    unique = list({phase.name: phase for phase in chosen}.values())
    return PhaseSequence(tuple(sorted(unique, key=lambda phase: phase.step)))
