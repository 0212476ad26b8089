"""The study plan as the orchestration runs it (gtep/orchestration/study_plan.py, run_plan): `gtep run` (gtep.run),
`gtep evaluate` (gtep.evaluate) and a matrix's cells (run_cell) take their phases and their order from the one
record, study_phases (gtep/protocol/phases.py), and find each phase's runner through the one mapping RUNNERS.

No Ray is started and nothing trains: run_phase is replaced by a recorder that returns an outcome, so what is
checked is which runners run, in which order, with which set. The phases on Ray: tests/orchestration/
test_phases.py, test_matrix.py; a phase added and run end to end: test_phase_extension.py. Adding a phase to a
study's plan is docs/extending.md's "Adding a phase to a study's plan", whose block this file runs.
"""
from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path

import pytest
from rich.console import Console

import gtep
import gtep.api as api
from gtep.matrix import MatrixCell, MatrixConfig, ResolvedCell
from gtep.orchestration import study_plan
from gtep.orchestration.matrix import run_cell
from gtep.orchestration.phase_run import RUNNERS, PhaseOutcome, runner_for
from gtep.orchestration.phases import FixedSetRunner, TuneRunner
from gtep.orchestration.set_evaluation import EverySetRunner
from gtep.orchestration.study import StudyPaths
from gtep.protocol.phases import PHASES, TUNE, phases_in_order, study_phases

H_STAR = {"algorithm": "replay", "set_index": 0, "hparams": {"lr": 0.1}, "tuning_run_id": "tuned"}
SUMMARY = {"acc": 0.5, "acc_std": 0.0, "avg_acc": 0.6, "avg_acc_std": 0.0, "hmean": 0.4, "orderings": 1,
           "expected": 1, "diverged": 0}


def config(tmp_path: Path, **fields):
    doc = {"study": "plan", "algorithm": "replay", "backbone": "resnet8", "scenario": {"increments": "3x2"},
           "datasets": {"split": {"dataset": "synthetic:classes=12,train=16,test=6", "classes_per_phase": 6}},
           "search": {"trials": 1, "orderings": 1}, "training": {"memory_size": 12, "epoch_scale": 0.01}}
    return gtep.experiment(doc, output=tmp_path / "out", fields=fields)


@pytest.fixture
def recorded(monkeypatch, tmp_path):
    """run_phase and best.yaml replaced: each call records (phase, runner class, the set it runs) and returns an
    outcome, so the plan runs in order without Ray."""
    calls: list[tuple[str, str, dict | None]] = []

    def run_phase(runner, resolved, console, resume=False, tags=None):
        calls.append((runner.phase.name, type(runner).__name__, getattr(runner, "best", None)))
        return PhaseOutcome(runner.phase.name, f"run-{runner.phase.name}", 0, {"lr": 0.1}, dict(SUMMARY),
                            StudyPaths(tmp_path / "study"))

    monkeypatch.setattr(study_plan, "run_phase", run_phase)
    monkeypatch.setattr(study_plan, "read_best", lambda path: dict(H_STAR))
    monkeypatch.setattr(api, "_ray", lambda resolved, console: nullcontext())  # Ray is not started
    return calls


def test_every_phase_has_its_runner_in_the_one_mapping(tmp_path):
    resolved = gtep.check(config(tmp_path), Console(quiet=True))
    assert set(RUNNERS.names()) == {p.name for p in phases_in_order()}
    kinds = {p.name: type(runner_for(p, resolved, H_STAR)).__name__ for p in phases_in_order()}
    assert kinds == {"tune": TuneRunner.__name__, "evaluate": FixedSetRunner.__name__,
                     "conventional": FixedSetRunner.__name__, "original": FixedSetRunner.__name__,
                     "evaluate_sets": EverySetRunner.__name__}
    with pytest.raises(ValueError, match="runs H"):  # a phase that runs H* before any was tuned or given
        runner_for(PHASES.get("evaluate"), resolved, None)


def test_gtep_run_and_a_matrix_cell_run_the_same_phases_in_the_same_order(tmp_path, recorded):
    """`gtep run --protocol conventional --with-original` and a matrix cell asking for the same phases (a matrix
    file with protocol: conventional, original: true) run one plan: tune, evaluate, conventional, original."""
    cfg = config(tmp_path)
    result = gtep.run(cfg, protocol="conventional", with_original=True, quiet=True)
    by_run = [name for name, _, _ in recorded]
    assert by_run == study_phases("conventional", with_original=True).names
    assert by_run == ["tune", "evaluate", "conventional", "original"]
    assert list(result.extra) == ["conventional", "original"] and result.tuning.phase == "tune"
    assert [best for name, _, best in recorded if name in ("evaluate", "conventional")] == [H_STAR, H_STAR]
    assert recorded[-1][2]["source"] == "preset:original"  # the authors' values, not H*

    recorded.clear()
    asked = MatrixConfig.model_validate(
        {"matrix": "m", "algorithms": ["replay"], "scenarios": {"s": "3x2"}, "original": True,
         "protocol": "conventional",
         "pairings": {"p": {"similarity": "high",
                            "datasets": {"split": {"dataset": "synthetic:classes=12", "classes_per_phase": 6}}}}}
    ).phases()
    cell = MatrixCell("m", "m-replay-s-p", "replay", "s", "p", "high", cfg)
    hmeans = run_cell(ResolvedCell(cell, gtep.check(cfg, Console(quiet=True))), asked, Console(quiet=True), False)
    by_cell = [name for name, _, _ in recorded]
    assert by_cell == by_run
    assert list(hmeans) == ["tune", "evaluate", "conventional", "original"]


def test_every_set_runs_after_evaluate_in_run_evaluate_and_a_cell(tmp_path, recorded):
    cfg = config(tmp_path, **{"evaluation.sets": "all"})
    gtep.run(cfg, protocol="conventional", quiet=True)
    assert [name for name, _, _ in recorded] == ["tune", "evaluate", "evaluate_sets", "conventional"]

    recorded.clear()
    cell = MatrixCell("m", "m-replay-s-p", "replay", "s", "p", "high", cfg)
    hmeans = run_cell(ResolvedCell(cell, gtep.check(cfg, Console(quiet=True))), ["tune", "evaluate", "conventional"],
                      Console(quiet=True), False)
    assert [name for name, _, _ in recorded] == ["tune", "evaluate", "evaluate_sets", "conventional"]
    assert list(hmeans) == ["tune", "evaluate", "conventional"]  # evaluate_sets has no summary of its own


def test_gtep_evaluate_runs_the_plan_after_tuning_with_the_given_set(tmp_path, recorded):
    cfg = config(tmp_path)
    result = gtep.evaluate(cfg, best=dict(H_STAR["hparams"]), protocol="conventional", quiet=True)
    assert [(name, kind) for name, kind, _ in recorded] == [("conventional", FixedSetRunner.__name__)]
    assert recorded[0][2]["hparams"] == H_STAR["hparams"] and result.phase == "conventional"


# ---------------------------------------------------------------- docs/extending.md, "Adding a phase to a study's plan"


@pytest.fixture
def audit_phase():
    """The docs' block, run here: a phase and its runner registered, taken out again after the test."""
    from gtep.orchestration.phase_run import register_runner
    from gtep.orchestration.phases import FixedSetRunner, original_best
    from gtep.protocol.phases import Phase, register_phase

    # the original preset again on D^E, on fresh orderings 2S..3S-1, right after the conventional phase
    AUDIT = register_phase(Phase(
        "audit", "audited", "D^E", many_sets=False, order=7, step=3, ordering_block=2,
        column="audited", title="The original preset again on D^E (fresh orderings)"))

    @register_runner(AUDIT)
    def audit_runner(phase, resolved, best):
        return FixedSetRunner(phase, original_best(resolved))

    yield AUDIT
    PHASES._entries.pop("audit")  # noqa: SLF001 - the test's own registrations, undone
    RUNNERS._entries.pop("audit")  # noqa: SLF001


def test_a_phase_added_to_the_plan_runs_in_its_place(tmp_path, recorded, audit_phase):
    resolved = gtep.check(config(tmp_path), Console(quiet=True))
    plan = study_phases("conventional", with_original=True, asked=["audit"])
    outcomes = study_plan.run_plan(plan, resolved, Console(quiet=True))
    assert [name for name, _, _ in recorded] == ["tune", "evaluate", "conventional", "audit", "original"]
    assert list(outcomes) == plan.names and recorded[3][2]["source"] == "preset:original"
    assert recorded[0][1] == TuneRunner.__name__ and TUNE in plan
