"""A study's plan (gtep/protocol/phases.py, study_phases): which phases a study runs and in which order, one pure
record built from the study's choices, for `gtep run`, `gtep evaluate` and a matrix's cells alike. No Ray, no
training: the plan is data (tests/orchestration/test_study_plan.py runs one)."""
from __future__ import annotations

import pytest

from gtep.matrix import MatrixConfig
from gtep.protocol.phases import (
    CONVENTIONAL,
    EVALUATE,
    EVALUATE_SETS,
    ORIGINAL,
    PHASES,
    PROTOCOLS,
    TUNE,
    Phase,
    PhaseSequence,
    register_phase,
    study_phases,
)

CANONICAL = ["tune", "evaluate", "evaluate_sets", "conventional", "original"]


def test_one_canonical_order_whatever_is_asked_for():
    everything = study_phases("conventional", with_original=True, every_set=True)
    assert everything.names == CANONICAL
    assert [p.step for p in everything] == sorted(p.step for p in everything)
    assert study_phases().names == ["tune", "evaluate"]
    assert study_phases("first_task").names == ["tune", "evaluate"]  # first_task changes how tune compares sets
    assert study_phases(with_original=True).names == ["tune", "evaluate", "original"]
    assert study_phases(every_set=True).names == ["tune", "evaluate", "evaluate_sets"]
    # the same phases asked for in another order, or by name (a matrix file, a state file): the same plan
    assert study_phases(asked=["original", "conventional", "tune", "evaluate"]) == study_phases(
        "conventional", with_original=True)
    assert study_phases(asked=[ORIGINAL, CONVENTIONAL]).phases == (TUNE, EVALUATE, CONVENTIONAL, ORIGINAL)


def test_gtep_evaluate_plans_the_phases_after_tuning():
    assert study_phases(evaluate_only=True).phases == (EVALUATE,)
    assert study_phases(evaluate_only=True, every_set=True).phases == (EVALUATE, EVALUATE_SETS)
    assert study_phases("conventional", evaluate_only=True).phases == (CONVENTIONAL,)  # in place of evaluate
    with pytest.raises(ValueError, match="conventional"):
        study_phases("conventional", evaluate_only=True, every_set=True)


def test_a_plan_is_a_record_read_by_name_or_by_phase():
    plan = study_phases("conventional", with_original=True, every_set=True)
    assert isinstance(plan, PhaseSequence) and len(plan) == 5 and list(plan) == list(plan.phases)
    assert "original" in plan and ORIGINAL in plan and "no such phase" not in plan
    assert plan.summarized() == [TUNE, EVALUATE, CONVENTIONAL, ORIGINAL]  # evaluate_sets has no summary row
    assert plan.ran_by(CANONICAL) and plan.ran_by([*CANONICAL, "older"]) and not plan.ran_by(CANONICAL[:-1])
    with pytest.raises(ValueError, match="not a protocol"):
        study_phases("tuned")
    with pytest.raises(KeyError, match="unknown phase 'nope'"):
        study_phases(asked=["nope"])
    assert set(PROTOCOLS) == {"gtep", "conventional", "first_task"}


def test_the_matrix_asks_for_its_phases_in_the_plan_order():
    """What a matrix file asks for (protocol, original) is the plan `gtep run` makes of the same choices."""
    for protocol in ("gtep", "conventional"):
        for original in (False, True):
            split = {"split": {"dataset": "synthetic:classes=12", "classes_per_phase": 6}}
            matrix = MatrixConfig.model_validate(
                {"matrix": "m", "algorithms": ["replay"], "scenarios": {"s": "3x2"}, "original": original,
                 "protocol": protocol, "pairings": {"p": {"similarity": "high", "datasets": split}}})
            assert matrix.phases() == study_phases(protocol, with_original=original).names


# A phase added to a study's plan (docs/extending.md, "Adding a phase to a study's plan"): its record's `step`
# places it; asked for, it runs after the phases whose step is lower
AUDIT = Phase("audit", "audited", "D^E", many_sets=False, order=7, step=3, ordering_block=2, column="audited")


@pytest.fixture
def audit_phase():
    register_phase(AUDIT)
    yield AUDIT
    PHASES._entries.pop(AUDIT.name)  # noqa: SLF001 - the test's own registration, undone


def test_a_phase_added_to_the_plan_takes_its_place_by_step(audit_phase):
    plan = study_phases("conventional", with_original=True, every_set=True, asked=["audit"])
    # step 3 ties with conventional's: the built-in phase first (the sort is stable), then the added one
    assert plan.names == ["tune", "evaluate", "evaluate_sets", "conventional", "audit", "original"]
    assert study_phases(asked=[audit_phase]).names == ["tune", "evaluate", "audit"]
    assert study_phases(evaluate_only=True, asked=[audit_phase]).names == ["evaluate", "audit"]
    assert Phase("later", "later", "D^E", many_sets=False, order=8).step > ORIGINAL.step  # by default: last
