"""A tiny FSCIL study through `gtep run`: H* chosen by the gAcc AUC, every run tagged with its family and
criterion, FSCIL's metrics in MLflow, the results CSVs and the terminal table."""
import pytest

from tests.studies import CONFIG as TINY_CONFIG
from tests.studies import accuracy_artifact, assert_best_set, assert_tagged, run_study

R, S = 3, 2
# the session's tiny replay study (tests/studies.py: R = 3, S = 2, its first task and compute) as an FSCIL one
CONFIG = {
    **TINY_CONFIG, "study": "fscil-tiny",
    "scenario": {"family": "fscil", "fscil": {"base_classes": 4, "ways": 2, "shots": 3, "sessions": 2}},
    "datasets": {"split": {"dataset": "synthetic:classes=18,train=20,test=6", "classes_per_phase": 8, "seed": 1}},
    "training": {"memory_size": 16, "epoch_scale": 0.02}, "seed": 2,
}


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    return run_study(tmp_path_factory.mktemp("fscil"), CONFIG, columns=200)


def test_h_star_is_the_set_with_the_best_gacc_auc(study):
    _, units = assert_best_set(study["folder"], "fscil", "gacc_auc", "gacc_auc",
                                             {"gacc_auc", "aacc", "novel_acc", "set_score", "criterion"})
    assert set(units["criterion"]) == {"gacc_auc"}


def test_every_run_is_tagged_and_logs_fscils_metrics_in_percent(study):
    runs = study["runs"]
    assert len(runs) == 1 + R + R * S + 1 + 1 + S  # tune, its trials and orderings; evaluate, its trial, orderings
    assert_tagged(runs, "fscil", "gacc_auc")
    orderings = [r for r in runs if r.data.tags["gtep.level"] == "ordering"]
    for run in orderings:
        accuracy = accuracy_artifact(run)
        assert {"gacc_auc", "aacc", "novel_acc", "kr"} <= set(run.data.metrics)
        assert 0 <= run.data.metrics["gacc_auc"] <= 100
        assert len(accuracy["acc_matrix"]) == 3
        history = study["client"].get_metric_history(run.info.run_id, "gacc_alpha")
        assert sorted(m.step for m in history) == list(range(13))
    for trial in [r for r in runs if r.data.tags["gtep.level"] == "trial"]:
        m = trial.data.metrics  # hmean keeps its meaning (Acc, AvgAcc); score is the criterion, gAcc AUC
        assert m["hmean"] == pytest.approx(2 * m["acc"] * m["avg_acc"] / (m["acc"] + m["avg_acc"]), abs=1e-3)
        assert m["score"] == pytest.approx(m["gacc_auc"], abs=1e-3)
    phases = {r.data.tags["gtep.phase"]: r for r in runs if r.data.tags["gtep.level"] == "phase"}
    assert set(phases) == {"tune", "evaluate"}
    for run in phases.values():
        assert {"gacc_auc", "gacc_auc_std", "aacc", "score"} <= set(run.data.metrics)
        assert run.data.metrics["score"] == pytest.approx(run.data.metrics["gacc_auc"], abs=1e-3)
        assert len(study["client"].get_metric_history(run.info.run_id, "gacc_alpha")) == 13


def test_the_terminal_shows_the_familys_metrics_beside_acc(study):
    output = study["output"]
    assert "fscil 4+2x2-way 3-shot" in output
    assert "gAcc AUC (%)" in output and "aAcc (%)" in output
    assert "H* by gacc_auc" in output
