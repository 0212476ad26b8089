"""A tiny IIRC study through `gtep run` on Ray, with a test-only multi-label learner the workers import from
GTEP_PLUGINS: H* chosen by mean pw-JS, every run tagged with the iirc family, pw-JS metrics in MLflow."""
import importlib
import sys
from pathlib import Path

import pytest

from tests.studies import accuracy_artifact, assert_best_set, assert_tagged, own_ray, run_study, tiny_config

# a Ray study of its own (~80 s): in the `slow` group, which .ci/run runs after the default one
pytestmark = pytest.mark.slow

PLUGIN = "tests.engine.multilabel_learner"
R, S = 2, 2
SPACE = {"algorithm": "tiny_multilabel", "space": {"lr": [0.05, 0.01], "epochs": [2], "batch_size": [16],
                                                    "scheduler": ["constant"]}}


def study_config(root: Path) -> dict:
    return tiny_config(
        "iirc-tiny", "tiny_multilabel", root, R, S,
        # groups group0..group3 of 4 classes; each phase: 2 superclasses + 8 subclasses, tasks of 1, 3, 3, 3
        scenario={"family": "iirc", "iirc": {"first_task_superclasses": 1, "classes_per_task": 3}},
        datasets={"split": {"dataset": "synthetic:classes=16,train=10,test=4", "by": "group",
                            "tuning_groups": ["group0", "group1"]}},
        first_task={"epochs": 2, "milestones": [1], "batch_size": 16}, training={"memory_size": 0}, seed=2)


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    """Ray's workers import the learner from GTEP_PLUGINS, which they inherit when Ray starts here; the driver
    imports it too, and it leaves the registry afterwards."""
    learners = importlib.import_module(PLUGIN)
    patch = pytest.MonkeyPatch()
    patch.setenv("GTEP_PLUGINS", PLUGIN)
    root = tmp_path_factory.mktemp("iirc")
    try:
        with own_ray():
            yield run_study(root, study_config(root), SPACE, columns=200)
    finally:
        patch.undo()
        learners.unregister()
        sys.modules.pop(PLUGIN, None)


def test_h_star_is_the_set_with_the_best_mean_pw_js(study):
    assert_best_set(study["folder"], "iirc", "mean_pw_js", "mean_pw_js",
                                  {"pw_js", "mean_pw_js", "js", "exact_match", "set_score"})


def test_every_run_is_tagged_iirc_and_logs_pw_js(study):
    runs = study["runs"]
    assert len(runs) == 1 + R + R * S + 1 + 1 + S
    assert_tagged(runs, "iirc", "mean_pw_js")
    orderings = [r for r in runs if r.data.tags["gtep.level"] == "ordering"]
    for run in orderings:
        assert {"pw_js", "mean_pw_js", "js", "exact_match", "acc", "avg_acc"} <= set(run.data.metrics)
        assert 0 <= run.data.metrics["mean_pw_js"] <= 100
        assert len(accuracy_artifact(run)["acc_matrix"]) == 4
    phases = {r.data.tags["gtep.phase"]: r for r in runs if r.data.tags["gtep.level"] == "phase"}
    assert set(phases) == {"tune", "evaluate"}
    for run in phases.values():
        assert {"pw_js", "mean_pw_js", "mean_pw_js_std", "score"} <= set(run.data.metrics)
        assert run.data.metrics["score"] == pytest.approx(run.data.metrics["mean_pw_js"], abs=1e-3)


def test_the_terminal_names_the_scenario_and_criterion(study):
    assert "iirc 1 superclasses+3/task (groups)" in study["output"]
    assert "H* by mean_pw_js" in study["output"]
