"""Issue 34's paper-scale rehearsal, scaled down (benchmarks/paper_scale.py --run): a matrix of zero-cost learners
run through `gtep matrix --parallel-cells 2` on a two-node Ray cluster with the MLflow server on PostgreSQL (from
tests/with-postgres.sh; sqlite without it), the server restarted at a quarter of the units and the driver's whole
process group SIGKILLed at half of them, then resumed with the same command; the same matrix run again without
faults into a store of its own. Asserts the invariants only, never timings: every unit trained once, no finished
unit re-run, one ordering run per unit and no duplicate run, nothing left in a journal, the same H* per cell and
the same report as the uninterrupted run, the report complete."""
from __future__ import annotations

import os

import pytest

from tests.helpers import benchmark_imports

pytestmark = pytest.mark.cluster



@pytest.fixture(scope="module")
def rehearsal(tmp_path_factory):
    if not os.environ.get("GTEP_TEST_POSTGRES_URI") and os.environ.get("CI"):
        pytest.fail("GTEP_TEST_POSTGRES_URI is not set: run the tests through tests/with-postgres.sh")
    with benchmark_imports():
        import paper_scale

        folder = tmp_path_factory.mktemp("paper-scale")
        # 2 studies of R = 15 sets x S = 2 orderings and their evaluations: 64 units, enough for a server restart
        # at a quarter of them and a SIGKILL at half with units still to run (200 units cost 2 minutes more)
        options = paper_scale.Options(folder, scale=0.5, algorithms=2, cells=1, parallel_cells=2, ui=False,
                                      report_sequential=False)
        figures = paper_scale.rehearse(options)
        yield paper_scale, figures, folder


def test_the_rehearsal_holds_every_invariant(rehearsal):
    paper_scale, figures, folder = rehearsal
    verdicts = paper_scale.verdicts(figures)
    assert {"no finished unit re-run", "same H* as the uninterrupted run",
            "same report as the uninterrupted run"} <= set(verdicts)  # the faults and the reference did happen
    failed = [name for name, ok in verdicts.items() if not ok]
    assert not failed, f"{failed}: see {folder}/figures.json"
    assert (folder / "figures.json").exists()


def test_the_faults_happened_mid_matrix(rehearsal):
    _, figures, _ = rehearsal
    units = figures["matrix"]["units"]
    assert 0 < figures["first_run"]["killed_at_units"] < units
    assert figures["first_run"]["server_restart"]["at_units"] < figures["first_run"]["killed_at_units"]
    resume = figures["resume"]
    assert resume["units_trained_by_resume"] == units - resume["units_trained_before_kill"] > 0


def test_the_time_is_slot_time_with_the_report_and_the_faults_apart(rehearsal):
    _, figures, _ = rehearsal
    time = figures["time"]
    assert time["units"] == figures["matrix"]["units"] and time["slots"] == 2
    assert time["report_s"] > 0, "the matrix's report after its cells is timed apart"
    assert time["faults_s"]["resume_start_s"] > 0 and time["faults_s"]["server_down_s"] >= 5
    assert time["cells_s"] == round(time["wall_s"] - time["report_s"], 1)
    assert time["slot_time_lost_per_unit_with_faults_ms"] > time["slot_time_lost_per_unit_ms"] > 0
    assert 0 < time["slot_busy_share"] < 1


def test_the_driver_memory_is_checked_from_its_first_units_to_its_last(rehearsal):
    _, figures, _ = rehearsal
    checks = figures["memory_check"]
    assert set(checks) == {"run_1", "run_2"}, "the killed run and its resume"
    for check in checks.values():
        assert check["measured"] and 0 < check["after_units"] < check["units_at_end"]
        assert check["growth_below_100_mib"], check


def test_the_report_covers_every_cell(rehearsal):
    _, figures, folder = rehearsal
    assert figures["report"]["files"]
    text = "\n".join(p.read_text() for p in (folder / "report").glob("*.csv"))
    for algorithm in ("ps_replay", "ps_icarl"):
        assert algorithm in text
    assert figures["store"]["runs_by_level"]["phase"] == 2 * figures["matrix"]["studies"]
