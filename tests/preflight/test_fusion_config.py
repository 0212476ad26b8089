"""compute.fuse_orderings: the pre-flight pass's refusals, where auto fuses, and the estimate of a fused trial."""
from __future__ import annotations

from dataclasses import replace

import pytest

from gtep import api
from gtep.config import ConfigError
from gtep.orchestration.trial_job import fused_orderings
from gtep.preflight.calibration import Calibration, calibrate, compute_estimate
from gtep.preflight.checks import preflight


def plan(tmp_path, algorithm: str = "replay", orderings: int = 2, **fields):
    cfg = api.experiment(preset="default", trials=1, orderings=orderings, output=tmp_path / "runs",
                         algorithm=algorithm, backbone="resnet8", fields=fields)
    return preflight(cfg)


def test_fusion_is_off_unless_asked_for(tmp_path):
    assert api.experiment(preset="default").compute.fuse_orderings == "off"
    assert not fused_orderings(plan(tmp_path).resolved)


def test_on_is_refused_for_a_learner_that_does_not_opt_in(tmp_path):
    with pytest.raises(ConfigError) as err:
        plan(tmp_path, "podnet", **{"compute.fuse_orderings": "on"})
    assert "compute.fuse_orderings" in str(err.value) and "podnet" in str(err.value)


def test_on_is_refused_with_orderings_run_as_parallel_tasks(tmp_path):
    with pytest.raises(ConfigError, match="parallel tasks"):
        plan(tmp_path, **{"compute.fuse_orderings": "on", "compute.cpus_per_trial": 2, "compute.cpus_per_ordering": 1})


def test_on_fuses_and_auto_fuses_only_on_a_gpu(tmp_path):
    assert fused_orderings(plan(tmp_path, **{"compute.fuse_orderings": "on"}).resolved)
    assert not fused_orderings(plan(tmp_path, **{"compute.fuse_orderings": "auto"}).resolved)  # a CPU study
    assert not fused_orderings(plan(tmp_path, "podnet", **{"compute.fuse_orderings": "auto"}).resolved)


def test_the_estimate_counts_a_fused_trial_as_what_it_costs(tmp_path):
    study = plan(tmp_path, **{"compute.fuse_orderings": "on"})
    alone = Calibration(first_task=1.0, later_tasks=1.0, growth=0.0, outside_fit=0.0, test=0.0, batch_size=32,
                        threads=1, device="cpu")
    separate = compute_estimate(study, alone)
    fused = compute_estimate(study, replace(alone, fusion=0.4))
    assert fused["tuning_seconds"] == pytest.approx(0.4 * separate["tuning_seconds"])
    assert fused["evaluation_seconds"] == pytest.approx(0.4 * separate["evaluation_seconds"])


@pytest.mark.slow  # two minutes on a shared 2-core machine: the default preset's calibration, twice
def test_calibrate_times_a_fused_trial(tmp_path):
    cal = calibrate(plan(tmp_path, **{"compute.fuse_orderings": "on"}))
    assert cal.fusion != 1.0 and 0 < cal.fusion < 10
    assert calibrate(plan(tmp_path)).fusion == 1.0


@pytest.mark.slow  # seconds alone, but two minutes on the shared 2-core machine it was written on
def test_a_fused_trial_reports_each_ordering_as_its_own_unit(tmp_path, monkeypatch):
    """The trainable with fuse_orderings: each ordering's unit runs as alone (its record, its ordering), the fits
    fused, the units reported in ordering order once all have finished."""
    from gtep.orchestration import trainable
    from gtep.orchestration.trial_job import trial_job
    from tests.helpers import small_job

    scenario, data = small_job("replay", epochs=1, dataset="synthetic:classes=10,train=16,test=20")
    job = replace(trial_job(plan(tmp_path, **{"compute.fuse_orderings": "on"}).resolved, "tune", None),
                  scenario=scenario, report_every_seconds=0.0)
    assert job.fuse_orderings
    sent: list[dict] = []
    monkeypatch.setattr(trainable.tune, "report", sent.append)
    trainable.train_set({"trial": {"set_index": 0, "hparams": dict(scenario.hparams)}, "orderings": [0, 1]}, data, job)
    assert [r["ordering"] for r in sent] == [0, 1] and all(r["status"] == "finished" for r in sent)
    # each its own ordering's classes (tests/engine/test_fusion.py compares fused results with runs alone)
    assert [r["class_order"] for r in sent] == [list(job.ordering(scenario.hparams, s).tasks()[-1].seen_classes)
                                                 for s in (0, 1)]


def test_yaml_on_and_off_unquoted_mean_on_and_off():
    """YAML 1.1 reads `fuse_orderings: on` as true."""
    import yaml

    for text, mode in (("on", "on"), ("off", "off")):
        fields = {"compute.fuse_orderings": yaml.safe_load(text)}
        assert api.experiment(preset="default", fields=fields).compute.fuse_orderings == mode
