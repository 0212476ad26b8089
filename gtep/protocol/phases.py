"""The phases of a study as records: what each one trains, on which data, and what it writes.

GTEP (paper Algorithms 1-3) has a tuning phase on D^HT (draw R sets, select H*) and an evaluation phase on D^E
(H* over S fresh orderings). gtep adds phases of the same two shapes: `original` (the authors' values on D^E, the
paper's "Original", section 4.1), `conventional` (H* re-run on D^HT, the practice section 3.1 criticises) and
`evaluate_sets` (every other tuned set on D^E, so the protocols' regret can be measured, gtep/protocol/regret.py).

A phase is defined once, here: the orchestration runs any phase from its record (gtep/orchestration/phases.py,
run_phase), and tracking, replay and the reports read the record instead of comparing phase names. A new phase is
one record registered in PHASES plus its runner (docs/extending.md, "Adding a phase").
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

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


def reported_phases() -> list[Phase]:
    """The phases with a summary row (one set over S orderings, or H* of the tuning phase), in report order."""
    return [phase for phase in phases_in_order() if phase.column]


def fixed_set_phases() -> list[Phase]:
    """The phases that train one set over S orderings (Algorithm 3's shape), in report order."""
    return [phase for phase in phases_in_order() if not phase.many_sets]


TUNE = register_phase(Phase("tune", "tuning", "D^HT", many_sets=True, order=0, selects_best=True,
                            column="tuning", curve_title="tuning phase: H* on D^HT", line_style="--"))
# H* on the tuning classes again, orderings S..2S-1: a fresh re-run of the tuned scenario, not a copy of the units
# it was selected on (the conventional protocol, section 3.1)
CONVENTIONAL = register_phase(Phase("conventional", "conventional", "D^HT", many_sets=False, order=1,
                                    ordering_block=1, column="conventional", line_style="-.",
                                    title="Conventional protocol: H* on the tuning classes (fresh orderings)"))
EVALUATE = register_phase(Phase("evaluate", "evaluation", "D^E", many_sets=False, order=2, column="evaluation",
                                curve_title="evaluation phase: H* on D^E", title="Evaluation phase"))
ORIGINAL = register_phase(Phase("original", "original", "D^E", many_sets=False, order=3, column="Original",
                                line_style=":", title="Original preset on the evaluation phase"))
EVALUATE_SETS = register_phase(Phase("evaluate_sets", "every set", "D^E", many_sets=True, order=4,
                                     writes_regret=True))
