"""A tiny CFSL study through `gtep run` on Ray: the backbone pretrained once on held-out classes (the pretrain
section), H* chosen by mean target accuracy, every run tagged with the cfsl family, CFSL metrics in MLflow."""
from pathlib import Path

import pytest

from tests.studies import accuracy_artifact, assert_best_set, assert_tagged, own_ray, run_study, tiny_config

# a Ray study of its own: in the `slow` group, which .ci/run runs after the default one
pytestmark = pytest.mark.slow

R, S, TASKS = 2, 2, 3
SPACE = {"algorithm": "cfsl_prototypes", "space": {"prototype_update": ["mean"], "metric": ["euclidean", "cosine"]}}


def study_config(root: Path) -> dict:
    return tiny_config(
        "cfsl-tiny", "cfsl_prototypes", root, R, S,
        pretrain={"classes": [16, 17, 18, 19], "epochs": 1, "batch_size": 16},
        scenario={"family": "cfsl", "cfsl": {"support_sets": 4, "ways": 2, "shots": 1, "target_shots": 2,
                                             "class_change_interval": 2, "tasks_per_ordering": TASKS}},
        datasets={"split": {"dataset": "synthetic:classes=20,train=10,test=4", "classes": list(range(16))}}, seed=2)


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    root = tmp_path_factory.mktemp("cfsl")
    with own_ray():
        yield run_study(root, study_config(root), SPACE, columns=220)


def test_the_backbone_is_pretrained_once_and_used_by_both_phases(study):
    assert study["output"].count("pretraining resnet8 on 4 classes") == 1
    phases = [r for r in study["runs"] if r.data.tags["gtep.level"] == "phase"]
    weights = {r.data.params["gtep.weights"] for r in phases}
    assert len(phases) == 2 and len(weights) == 1
    cached = Path(weights.pop())  # under $GTEP_CACHE/pretrained (tests/conftest.py sets it), else OUTPUT/pretrained
    assert cached.exists() and cached.parent.name == "pretrained" and cached.name.startswith("resnet8-")


def test_h_star_is_the_set_with_the_best_mean_target_accuracy(study):
    assert_best_set(study["folder"], "cfsl", "mean_target_acc", "target_acc",
                                  {"target_acc", "target_ce", "atm", "atm_count", "macs", "set_score"})


def test_every_run_is_tagged_cfsl_and_logs_the_cfsl_metrics(study):
    runs = study["runs"]
    assert len(runs) == 1 + R + R * S + 1 + 1 + S
    assert_tagged(runs, "cfsl", "mean_target_acc")
    for run in (r for r in runs if r.data.tags["gtep.level"] == "phase"):
        # the std over orderings (tracking's <name>_std) beside the mean over orderings of the std over tasks
        assert {"target_acc", "target_acc_std", "target_acc_task_std", "target_ce", "atm", "atm_count",
                "macs"} <= set(run.data.metrics)
    for run in (r for r in runs if r.data.tags["gtep.level"] == "ordering"):
        metrics = run.data.metrics
        assert {"target_acc", "target_acc_task_std", "target_acc_ci95", "target_ce", "atm", "atm_count",
                "macs"} <= set(metrics)
        assert 0 <= metrics["target_acc"] <= 100 and 0 < metrics["atm"] < 1 and metrics["macs"] > 1e6
        # logged as it is, not in percent: 4 prototypes over 8 support images (2 ways x 1 shot x 4 sets)
        assert metrics["atm_count"] == pytest.approx(0.5)
        accuracy = accuracy_artifact(run)
        assert len(accuracy["acc_matrix"]) == TASKS and accuracy["test_counts"] == [16] * TASKS
        steps = run.info.run_id
        assert len(study["client"].get_metric_history(steps, "acc_t")) == TASKS


def test_the_terminal_names_the_task_type_and_criterion(study):
    assert "cfsl NSS=4 NC=2 K_S=1 K_T=2 CCI=2 O=false" in study["output"]
    assert "H* by mean_target_acc" in study["output"]
