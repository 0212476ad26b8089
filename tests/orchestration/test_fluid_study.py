"""A tiny FLUID study through `gtep run` on Ray: a backbone pretrained by the pretrain section on classes kept
out of both phases, both phases' streams, H* by mean per-class accuracy, every run tagged with the fluid
family, FLUID's metrics (GMACs beside every score) in MLflow."""
from pathlib import Path

import pytest

from tests.studies import assert_best_set, assert_tagged, own_ray, run_study, tiny_config

# a Ray study of its own: in the `slow` group, which .ci/run runs after the default one
pytestmark = pytest.mark.slow

R, S = 2, 2
SPACE = {"algorithm": "fluid_et", "space": {"lr": [0.1, 0.01], "update_every": [20], "epochs": [1],
                                            "batch_size": [16], "detector": ["mdt"], "threshold": [2.1]},
         "presets": {"original": {"lr": 0.1, "update_every": 20, "epochs": 1}}}


def study_config(root: Path) -> dict:
    return tiny_config(
        "fluid-tiny", "fluid_et", root, R, S,
        pretrain={"classes": [0, 1, 2], "epochs": 1},
        scenario={"family": "fluid", "fluid": {
            "pretrain_classes": [0, 1, 2], "n_pretrain_classes": 2, "n_novel_classes": 4, "total_samples": 60,
            "per_class_cap": 20, "head_cut": 10, "window": 20}},
        datasets={"split": {"dataset": "synthetic:classes=13,train=20,test=10", "classes": list(range(3, 13)),
                            "classes_per_phase": 5}},
        training={"memory_size": 0}, seed=1)


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    root = tmp_path_factory.mktemp("fluid")
    with own_ray():
        yield run_study(root, study_config(root), SPACE, columns=200)


def test_h_star_is_the_set_with_the_best_mean_per_class_accuracy(study):
    assert_best_set(study["folder"], "fluid", "mean_per_class_acc", "mean_per_class_acc",
                                  {"mean_per_class_acc", "overall_acc", "unseen_auroc", "gmacs_total", "set_score"})


def test_every_run_is_tagged_fluid_and_logs_scores_with_compute(study):
    runs = study["runs"]
    assert_tagged(runs, "fluid", "mean_per_class_acc")
    orderings = [r for r in runs if r.data.tags["gtep.level"] == "ordering"]
    assert len(orderings) == R * S + S
    for run in orderings:
        metrics = run.data.metrics
        assert {"mean_per_class_acc", "overall_acc", "novel_head_acc", "unseen_auroc", "gmacs_inference",
                "gmacs_update", "gmacs_total", "head_cut"} <= set(metrics)
        assert 0 <= metrics["mean_per_class_acc"] <= 100  # percent
        assert 0 < metrics["gmacs_total"] < 10 and metrics["head_cut"] == 10  # as they are, not percent
    phases = {r.data.tags["gtep.phase"]: r for r in runs if r.data.tags["gtep.level"] == "phase"}
    assert set(phases) == {"tune", "evaluate"}
    for run in phases.values():
        assert {"mean_per_class_acc", "mean_per_class_acc_std", "gmacs_total", "score"} <= set(run.data.metrics)


def test_the_weights_were_pretrained_before_the_phases(study):
    assert "pretraining resnet8 on 3 classes" in study["output"]
    assert "fluid 2 pretrain+4 novel classes" in study["output"]
