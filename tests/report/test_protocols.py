"""`gtep report`'s tuning protocols side by side, from a hand-built store (no MLflow): one algorithm tuned three
ways (full gtep with a conventional phase, the first-task protocol, gtep with ASHA), each study's H*, what the
protocol reports, the evaluation-phase score of its H* and its compute relative to the full study's."""
import math

import pandas as pd
import pytest

from gtep.reporting import build
from gtep.reporting import protocols as tp
from gtep.reporting.collect import StoreData
from tests.report.test_summary import GROUP, ordering_rows, phase

HM = lambda a, b: 2 * a * b / (a + b)  # noqa: E731


def protocol_store(with_full: bool = True) -> StoreData:
    """Algorithm `a` in three studies (and `b` in one, tuned one way only). Each tuning phase has H* = set 1; the
    units are (acc, avg_acc) per ordering."""
    plan = {  # study: (params, compute_seconds, H*'s tuning units, evaluation units, conventional units)
        "a-full": ({"protocol": "gtep", "scheduler": "none"}, 100.0,
                   [(0.8, 0.9), (0.8, 0.9)], [(0.5, 0.6), (0.5, 0.6)], [(0.9, 0.9), (0.9, 0.9)]),
        "a-first": ({"protocol": "first_task", "protocol_tasks": "1", "scheduler": "none"}, 30.0,
                    [(0.95, 0.95), (0.95, 0.95)], [(0.4, 0.5), (0.6, 0.5)], None),
        "a-asha": ({"protocol": "gtep", "scheduler": "asha", "sets_complete": 1.0, "sets_stopped": 3.0}, 55.0,
                   [(0.8, 0.9), (0.8, 0.9)], [(0.5, 0.6), (0.5, 0.6)], None),
        "b": ({}, math.nan, [(0.3, 0.4), (0.3, 0.4)], [(0.2, 0.3), (0.2, 0.3)], None),
    }
    if not with_full:
        del plan["a-full"]
    phases, trials, orderings = [], [], []
    for study, (params, compute, tuned, evaluated, conventional) in plan.items():
        algorithm = study.split("-")[0]
        counts = {"sets_complete": 4.0, "sets_incomplete": 0.0, "sets_diverged": 0.0}
        phases.append(phase(f"T{study}", study, "tune", algorithm, "D1", best_trial_run_id=f"T{study}/1",
                            best_set_index_tag="1", best_set_index=1.0, compute_seconds=compute,
                            **{**counts, **params}))
        phases.append(phase(f"E{study}", study, "evaluate", algorithm, "D2", **params))
        trials.append({"run_id": f"T{study}/1", "phase_run_id": f"T{study}", "set_index": 1, "status": "FINISHED",
                       "start_time": 1, "hmean": HM(*tuned[0]), "mean_of_hmeans": HM(*tuned[0]),
                       "diverged_orderings": 0.0, "orderings": 2.0})
        orderings += ordering_rows(f"T{study}/1", f"T{study}", 1, tuned)
        orderings += ordering_rows(f"E{study}/0", f"E{study}", -1, evaluated)
        if conventional:
            phases.append(phase(f"C{study}", study, "conventional", algorithm, "D1", **params))
            orderings += ordering_rows(f"C{study}/0", f"C{study}", -1, conventional)
    orderings = pd.DataFrame(orderings)
    orderings["hmean"] = [HM(a, b) for a, b in zip(orderings["acc"], orderings["avg_acc"])]
    hparams = pd.DataFrame([{"trial_run_id": t["run_id"], "name": "lr", "value": "0.1"} for t in trials])
    steps = pd.DataFrame(columns=["run_id", "t", "acc"])
    return StoreData(pd.DataFrame(phases), pd.DataFrame(trials), hparams, orderings, steps)


@pytest.fixture(scope="module")
def report():
    return build.build_frames(protocol_store())


def rows(report) -> pd.DataFrame:
    frame = report.protocols
    return frame[frame["algorithm"] == "a"].set_index("protocol")


def test_each_study_is_a_protocol_row_with_its_h_star_scores_and_compute(report):
    a = rows(report)
    assert set(a.index) == {"gtep", "conventional", "first_task (k=1)", "gtep + asha"}
    first = a.loc["first_task (k=1)"]
    assert first["study"] == "a-first" and first["best_set_index"] == 1
    assert first["tuning_score"] == pytest.approx(0.95)
    # its H* re-trained on D^E: the HM of the mean Acc (0.5) and AvgAcc (0.5), std over the orderings' HMs
    assert first["evaluation_score"] == pytest.approx(0.5) and first["reported_score"] == pytest.approx(0.5)
    assert first["evaluation_std"] == pytest.approx(abs(HM(0.4, 0.5) - HM(0.6, 0.5)) / 2)
    assert first["compute_seconds"] == 30.0 and first["compute_ratio"] == pytest.approx(0.3)
    assert a.loc["gtep + asha", "compute_ratio"] == pytest.approx(0.55) and a.loc["gtep + asha", "sets_stopped"] == 3


def test_the_conventional_row_reports_h_star_on_the_tuning_data(report):
    a = rows(report)
    conventional, full = a.loc["conventional"], a.loc["gtep"]
    assert conventional["study"] == full["study"] == "a-full"
    assert conventional["reported_score"] == pytest.approx(0.9)  # what a paper tuning on D^HT would publish
    assert conventional["evaluation_score"] == full["evaluation_score"] == pytest.approx(HM(0.5, 0.6))
    assert conventional["compute_ratio"] == full["compute_ratio"] == 1.0


def test_the_table_shows_algorithms_with_two_protocols_or_more(report):
    compared = tp.compared(build._part(report.protocols, GROUP))
    assert set(compared["algorithm"]) == {"a"}  # b was tuned one way only
    table = tp.protocol_table(compared)
    assert table.at["a: first_task (k=1)", "x gtep"] == "0.30"
    assert table.at["a: first_task (k=1)", "evaluation"] == "50.00 (5.05)"
    assert table.at["a: gtep + asha", "sets (stopped)"] == "4 (3)"
    assert table.at["a: conventional", "reported"] == "90.00"
    # the reference first, then the cheaper protocols by their H*'s evaluation score
    assert list(table.index) == ["a: gtep", "a: conventional", "a: gtep + asha", "a: first_task (k=1)"]
    heading = [h for h, _, _ in build.group_sections(report, GROUP)]
    assert tp.PROTOCOLS_HEADING in heading


def test_without_a_full_gtep_study_the_ratio_is_unknown_and_an_old_run_sums_its_orderings():
    report = build.build_frames(protocol_store(with_full=False))
    a = rows(report)
    assert a["compute_ratio"].isna().all()
    b = report.protocols.set_index("algorithm").loc["b"]
    assert b["protocol"] == "gtep"  # a run older than the protocol params
    assert b["compute_seconds"] == pytest.approx(10.0 + 11.0)  # its H*'s two ordering runs (train_seconds)
    assert tp.protocol_table(tp.compared(report.protocols)).at["a: first_task (k=1)", "x gtep"] == "-"


@pytest.mark.parametrize("params, name", [
    ({}, "gtep"), ({"protocol": "first_task", "protocol_tasks": "2"}, "first_task (k=2)"),
    ({"protocol": "gtep", "scheduler": "hyperband"}, "gtep + hyperband"),
    ({"protocol": "conventional", "scheduler": "none"}, "gtep"),  # tuned as gtep; its conventional phase is a row
    ({"protocol": "first_task", "protocol_tasks": "1", "scheduler": "asha"}, "first_task (k=1) + asha"),
])
def test_protocol_names(params, name):
    assert tp.protocol_name(pd.Series(params, dtype=object)) == name
