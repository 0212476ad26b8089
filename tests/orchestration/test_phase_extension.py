"""Adding a phase (docs/extending.md, "Adding a phase"): a toy phase defined and registered here, nowhere else, is
run end to end through Ray by the one runner, and tracking, the reports and replay read it from its record alone.

`repeat`: one fixed set (the authors' values, the `original` preset) again on D^E, on the fresh orderings 2S..3S-1.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest
from mlflow.tracking import MlflowClient
from rich.console import Console

import gtep
from gtep.orchestration.phases import FixedSetRunner, original_best, run_phase
from gtep.orchestration.ray_search import ray_session
from gtep.orchestration.replay import ranked_phases, recorded_study
from gtep.protocol.phases import (
    PHASES,
    Phase,
    fixed_set_phases,
    phase_named,
    phases_in_order,
    register_phase,
    reported_phases,
)
from gtep.reporting import summary as sm
from gtep.reporting.tables import paper_table
from tests.orchestration.test_phases import config
from tests.report.test_summary import GROUP, hand_store, ordering_rows, phase

REPEAT = Phase("repeat", "repeated", "D^E", many_sets=False, order=5, ordering_block=2, column="repeated",
               line_style=":", title="The original preset again on D^E (fresh orderings)")
# a phase of many sets that ranks them on D^E, as evaluate_sets does
RERANK = Phase("rerank", "reranked", "D^E", many_sets=True, order=6, writes_regret=True)


@pytest.fixture
def toy_phases():
    """The toy phases registered for one test and taken out again, so no other test sees them."""
    for toy in (REPEAT, RERANK):
        register_phase(toy)
    yield
    for toy in (REPEAT, RERANK):
        PHASES._entries.pop(toy.name)  # noqa: SLF001 - the test's own registrations, undone


@pytest.mark.usefixtures("toy_phases")
def test_the_record_of_a_registered_phase_drives_reports_and_replay(tmp_path):
    """No Ray: each reader of phases takes the toy phase from its record (order, column, data, sets, regret)."""
    assert phase_named("repeat") is REPEAT and phase_named("no such phase") is None
    assert [p.name for p in phases_in_order()][-2:] == ["repeat", "rerank"]
    assert reported_phases()[-1] is REPEAT and RERANK not in reported_phases()  # RERANK has no summary row
    assert REPEAT in fixed_set_phases() and RERANK not in fixed_set_phases()
    assert REPEAT.orderings(2) == [4, 5] and REPEAT.results_csv == "repeat_results.csv"
    assert REPEAT.header == "repeated (D^E)" and not REPEAT.on_tuning_data
    with pytest.raises(ValueError, match="registered twice"):
        register_phase(REPEAT)

    # the report: the toy phase's column after the built-in ones, from its orderings
    store = hand_store()
    store.phases = pd.concat([store.phases, pd.DataFrame([phase("Ra", "a", "repeat", "a", "D2")])], ignore_index=True)
    store.orderings = pd.concat([store.orderings, pd.DataFrame(ordering_rows("Ra/0", "Ra", -1,
                                                                             [(0.5, 0.6), (0.7, 0.8)]))],
                                ignore_index=True)
    summary = sm.phase_summaries(store)
    table = paper_table(summary[summary["scenario"] == GROUP[0]], sm.gaps(summary))
    assert list(table.columns[:4]) == ["tuning (D^HT)", "HM tuning (D^HT)", "evaluation (D^E)", "HM evaluation (D^E)"]
    assert table.at["a", "repeated (D^E)"] == "60.00 (10.00) / 70.00 (10.00)"
    assert table.at["b", "repeated (D^E)"] == "-"  # b has no repeat phase
    assert list(table.columns).index("repeated (D^E)") > list(table.columns).index("evaluation (D^E)")
    assert set(summary.loc[summary["phase"] == "repeat", "label"]) == {"a"}

    # replay: the sets a regret-writing phase evaluated count as evaluated, as evaluate_sets' do
    assert ranked_phases() == ["evaluate_sets", "rerank"]
    manifest = {"config": {"search": {"orderings": 2}}, "sets": [{"index": 0}, {"index": 1}],
                "phases": {"tune": {"attempt": "x", "best_set_index": 0, "status": "finished"},
                           "evaluate": {"status": "finished", "set_index": 0, "summary": {"acc": 0.5}},
                           "rerank": {"status": "finished", "summaries": {"1": {"acc": 0.4}}}}, "units": {}}
    assert recorded_study(tmp_path, manifest).evaluated == {0: {"acc": 0.5}, 1: {"acc": 0.4}}


@pytest.mark.usefixtures("local_ray", "toy_phases")
def test_a_phase_registered_from_a_test_runs_end_to_end(tmp_path):
    """The toy phase through Ray with the one runner (one set, S=1: one trial), then read back as every phase is:
    its manifest entry, results CSV, MLflow phase run and ordering run, and `gtep report`'s summary and table."""
    cfg = gtep.experiment(config(study="repeat"), output=tmp_path / "out")
    resolved = gtep.check(cfg, Console(quiet=True))
    best = original_best(resolved)
    with ray_session(resolved.config.compute.ray_address):
        outcome = run_phase(FixedSetRunner(REPEAT, best), resolved, Console(quiet=True))
    assert outcome.phase == "repeat" and outcome.hparams == best["hparams"] and outcome.summary["orderings"] == 1

    folder = Path(resolved.config.study_dir)
    entry = json.loads((folder / "manifest.json").read_text())["phases"]["repeat"]
    assert entry["status"] == "finished" and entry["orderings"] == [2]  # ordering_block 2, S = 1
    assert entry["dataset"] == resolved.evaluation.dataset and entry["classes"] == list(resolved.evaluation.classes)
    assert entry["hparams_source"] == "preset:original" and entry["mlflow_run_id"] == outcome.run_id
    rows = pd.read_csv(folder / "repeat_results.csv")
    assert list(rows["ordering"]) == [2] and list(rows["set_status"]) == ["complete"]

    client = MlflowClient(tracking_uri=resolved.config.tracking_uri)
    run = client.get_run(outcome.run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == "repeat"
    assert run.data.tags["gtep.phase"] == "repeat" and run.data.tags["gtep.level"] == "phase"
    assert run.data.tags["gtep.data_role"] == "D^E" and run.data.tags["gtep.status"] == "finished"
    assert run.data.params["gtep.trials"] == "1" and math.isfinite(run.data.metrics["acc"])
    orderings = client.search_runs([run.info.experiment_id], "tags.`gtep.level` = 'ordering'")
    assert [o.info.run_name for o in orderings] == ["repeat/o2"]  # one set: its orderings named after the phase

    report = gtep.report(["repeat"], output=tmp_path / "out")
    assert list(report.summary["phase"]) == ["repeat"]
    assert any("repeated (D^E)" in table.columns for table in report.tables.values())
