"""A set whose trial fails on one of its orderings cannot become H*, and an evaluation phase that loses an
ordering is flagged and exits non-zero (never a mean over what happened to finish)."""
from __future__ import annotations

import json

import pandas as pd
import pytest
import ray
import yaml

from gtep.algorithms import ALGORITHMS
from tests.orchestration.test_phases import config, gtep, runs_of, store
from tests.studies import start_ray

CRASHING_LR = 0.1  # tests/orchestration/flaky_learner.py's
SPACE = {"algorithm": "flaky_replay", "space": {"lr": [CRASHING_LR, 0.0001], "epochs": [60],
                                                 "batch_size": [16], "scheduler": ["constant"]}}


@pytest.fixture(scope="module", autouse=True)
def ray_with_the_plugin(tmp_path_factory):
    """Ray's workers import the plugin from GTEP_PLUGINS, which they inherit when Ray starts; the driver imports
    it here, and it leaves the registry afterwards (tests that list every algorithm must not see it)."""
    import importlib

    flaky = importlib.import_module("tests.orchestration.flaky_learner")
    assert flaky.CRASHING_LR == CRASHING_LR
    markers = tmp_path_factory.mktemp("flaky-markers")
    patch = pytest.MonkeyPatch()
    patch.setenv("GTEP_PLUGINS", "tests.orchestration.flaky_learner")
    patch.setenv("GTEP_TEST_FLAKY_DIR", str(markers))
    if ray.is_initialized():  # this worker's shared Ray lacks the plugin's environment
        ray.shutdown()
    start_ray()
    yield markers
    ray.shutdown()
    patch.undo()
    ALGORITHMS._entries.pop("flaky_replay", None)


def flaky_config(tmp_path, **changes):
    (tmp_path / "space.yaml").write_text(yaml.safe_dump(SPACE))
    doc = config(study="flaky", algorithm="flaky_replay", search={"trials": 4, "orderings": 2,
                                                                   "space": str(tmp_path / "space.yaml")},
                 compute={"max_failures": 0}, training={"memory_size": 12, "epoch_scale": 0.5})
    doc.update(changes)
    return doc


def test_a_set_that_lost_an_ordering_never_becomes_h_star(tmp_path):
    result = gtep(tmp_path, "tune", flaky_config(tmp_path))
    assert result.exit_code == 0, result.output
    study = tmp_path / "out" / "flaky"
    manifest = json.loads((study / "manifest.json").read_text())
    lrs = {s["index"]: s["hparams"]["lr"] for s in manifest["sets"]}
    assert set(lrs.values()) == set(SPACE["space"]["lr"]), "the seed should draw both values"
    flaky = {i for i, lr in lrs.items() if lr == CRASHING_LR}
    units = manifest["units"].values()
    done = {i: [u for u in units if u["set_index"] == i] for i in lrs}
    # the flaky sets' finished orderings score far above every complete set: an average over what finished
    # would have chosen one of them
    best_flaky = max(u["hmean"] for i in flaky for u in done[i])
    best_complete = max(sum(u["hmean"] for u in done[i]) / 2 for i in lrs if i not in flaky)
    assert best_flaky > best_complete
    best = yaml.safe_load((study / "best.yaml").read_text())
    assert best["set_index"] not in flaky and best["hparams"]["lr"] == 0.0001

    rows = pd.read_csv(study / "tune_results.csv")
    for i in lrs:
        status = set(rows[rows["set_index"] == i]["set_status"])
        assert status == ({"incomplete"} if i in flaky else {"complete"}), (i, status)
    assert set(rows[rows["set_index"].isin(flaky)]["set_orderings"]) <= {"0/2", "1/2"}
    trials = {int(r.data.tags["gtep.set_index"]): r for r in runs_of(store(tmp_path), "flaky", level="trial")}
    for i in flaky:
        assert trials[i].data.tags["gtep.status"] == "incomplete" and trials[i].info.status == "FAILED"
        assert "orderings finished" in trials[i].data.tags["gtep.reason"]
    phase, = runs_of(store(tmp_path), "flaky", level="phase", phase="tune")
    assert phase.data.metrics["sets_incomplete"] == len(flaky)


def test_no_complete_set_is_one_error_saying_what_to_do(tmp_path, ray_with_the_plugin):
    for marker in ray_with_the_plugin.iterdir():
        marker.unlink()
    space = {**SPACE, "space": {**SPACE["space"], "lr": [CRASHING_LR]}}
    (tmp_path / "space.yaml").write_text(yaml.safe_dump(space))
    doc = config(study="all-flaky", algorithm="flaky_replay", compute={"max_failures": 0},
                 search={"trials": 2, "orderings": 2, "space": str(tmp_path / "space.yaml")},
                 training={"memory_size": 12, "epoch_scale": 0.1})
    result = gtep(tmp_path, "tune", doc)
    assert result.exit_code == 2
    assert "no hyperparameter set finished all 2 orderings: 2 of 2 sets are incomplete" in result.stderr
    assert "--resume" in result.stderr and not (tmp_path / "out" / "all-flaky" / "best.yaml").exists()


def test_an_evaluation_that_lost_an_ordering_is_flagged_and_exits_non_zero(tmp_path, ray_with_the_plugin):
    for marker in ray_with_the_plugin.iterdir():
        marker.unlink()
    doc = flaky_config(tmp_path, study="flaky-eval")
    best = tmp_path / "best.yaml"
    best.write_text(yaml.safe_dump({"algorithm": "flaky_replay", "set_index": 0,
                                    "hparams": {"lr": CRASHING_LR, "epochs": 60, "batch_size": 16}}))
    result = gtep(tmp_path, "evaluate", doc, "--best", str(best))
    assert result.exit_code == 1, result.output
    assert "1/2 incomplete" in result.output
    assert "the evaluate phase is incomplete: 1 of 2 orderings finished" in result.stderr
    study = tmp_path / "out" / "flaky-eval"
    manifest = json.loads((study / "manifest.json").read_text())
    assert manifest["phases"]["evaluate"]["status"] == "incomplete"
    phase, = runs_of(store(tmp_path), "flaky-eval", level="phase", phase="evaluate")
    assert phase.info.status == "FAILED" and phase.data.tags["gtep.status"] == "incomplete"
    assert phase.data.tags["gtep.orderings"] == "1/2" and "1 of 2 orderings finished" in phase.data.tags["gtep.reason"]
    assert set(pd.read_csv(study / "evaluate_results.csv")["set_orderings"]) == {"1/2"}

    # the bug is gone (no marker left behind): the resume runs the missing ordering only and completes the phase
    for marker in ray_with_the_plugin.iterdir():
        marker.unlink()
    finished_before = {u["ordering"] for u in manifest["units"].values()}
    from gtep.cli import app
    from tests.orchestration.test_phases import runner

    resumed = runner.invoke(app, ["evaluate", "--resume", str(study)])
    assert resumed.exit_code == 0, resumed.output
    after = json.loads((study / "manifest.json").read_text())
    assert after["phases"]["evaluate"]["status"] == "finished" and len(after["units"]) == 2
    assert {u["ordering"] for u in after["units"].values()} > finished_before
    phase, = runs_of(store(tmp_path), "flaky-eval", level="phase", phase="evaluate")
    assert phase.info.status == "FINISHED" and phase.data.tags["gtep.orderings"] == "2/2"
