"""FLUID learners and pretraining that read as numbers but meant something else (issue 45, item 7): fluid_protonet
without its meta-trained backbone, MDT centroids of a backbone that has since trained, and pretraining's
normalisation statistics over images held out for the streams. FSCIL's RPD and KR: tests/protocol/test_fscil_metrics.py."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from gtep.algorithms._distances import euclidean
from gtep.config import ConfigError, resolve, validate_config
from gtep.data import resolve_dataset
from gtep.engine import OrderingJob
from gtep.engine.flows.stream import StreamRun

STREAM = {"pretrain_classes": [0, 1, 2], "n_pretrain_classes": 2, "n_novel_classes": 4, "total_samples": 60,
          "per_class_cap": 20, "head_cut": 10, "window": 20}


def fluid_config(algorithm: str, **extra) -> dict:
    section = {"pretrain_classes": [0, 1, 2, 3], "n_pretrain_classes": 2, "n_novel_classes": 4,
               "total_samples": 60, "per_class_cap": 20}
    return {"study": "f", "algorithm": algorithm, "backbone": "resnet8",
            "scenario": {"family": "fluid", "fluid": section},
            "datasets": {"split": {"dataset": "synthetic:classes=20,train=20,test=10", "classes": list(range(4, 20)),
                                   "classes_per_phase": 8}}, **extra}


def pretrain_section(method: str) -> dict:
    return {"pretrain": {"classes": [0, 1, 2, 3], "epochs": 1, "method": method, "ways": 2, "shots": 1,
                         "queries": 1}}


# ---------------------------------------------------------------- fluid_protonet needs its meta-trained backbone

@pytest.mark.parametrize("extra", [{}, pretrain_section("supervised")], ids=["no pretrain section", "supervised"])
def test_fluid_protonet_without_protonet_pretraining_is_refused_before_compute(extra):
    with pytest.raises(ConfigError) as err:
        resolve(validate_config(fluid_config("fluid_protonet", **extra), "test"))
    assert err.value.field == "pretrain.method"
    assert "method: protonet" in str(err.value) and "\n" not in str(err.value)


def test_fluid_protonet_with_protonet_pretraining_resolves_and_other_learners_need_none():
    assert resolve(validate_config(fluid_config("fluid_protonet", **pretrain_section("protonet")), "test"))
    assert resolve(validate_config(fluid_config("fluid_ncm"), "test"))  # NCM takes any backbone


def test_fluid_protonet_weights_say_how_they_were_pretrained(tmp_path):
    """Without a pretrain: section, the weights' metadata (gtep.method, written by pretraining) decides."""
    from safetensors.torch import save_file

    from gtep.config.family_checks import _check_pretrain_method

    meta, plain = tmp_path / "meta.safetensors", tmp_path / "plain.safetensors"
    save_file({"w": torch.zeros(1)}, str(meta), metadata={"gtep.method": "protonet"})
    save_file({"w": torch.zeros(1)}, str(plain), metadata={"gtep.backbone": "resnet8"})
    _check_pretrain_method(validate_config(fluid_config("fluid_protonet", weights=str(meta)), "test"))
    with pytest.raises(ConfigError, match="was pretrained with supervised") as err:
        _check_pretrain_method(validate_config(fluid_config("fluid_protonet", weights=str(plain)), "test"))
    assert err.value.field == "pretrain.method"


# ---------------------------------------------------------------- MDT's centroids follow a backbone that trains

@pytest.fixture(scope="module")
def data():
    return resolve_dataset("synthetic:classes=10,train=20,test=10").load()


def stream_job(algorithm: str, hparams: dict) -> OrderingJob:
    return OrderingJob(algorithm=algorithm, hparams=hparams, backbone="resnet8", increments=(6,),
                       classes=(3, 4, 5, 6, 7, 8), seed=0, ordering=0, device="cpu", family="fluid",
                       family_options=tuple(sorted(STREAM.items())))


@torch.no_grad()
def current_centroids(learner) -> torch.Tensor:
    """Mean normalised feature of each seen class under the backbone as it is now."""
    learner.net.eval()
    features = F.normalize(torch.cat([learner.sample_features(x) for x in learner.seen_x]), dim=1)
    labels = torch.tensor(learner.seen_y)
    return torch.stack([features[labels == c].mean(0) for c in range(learner.total)])


@pytest.mark.parametrize("algorithm", ["fluid_standard", "fluid_lwf", "fluid_ewc"])
def test_mdt_scores_against_the_centroids_of_the_current_backbone(data, algorithm):
    run = StreamRun(stream_job(algorithm, {"detector": "mdt", "threshold": 2.1, "update_every": 20, "epochs": 1,
                                           "batch_size": 16, "lr": 0.1}), data)
    learner, score = run.learner, run.learner.unseen_score
    checks = []

    def checking(logits, features):
        if len(learner.seen_y) % 20 not in (0, 1):  # check the scores right after an update (and keep it fast)
            return score(logits, features)
        # what the learner had summed at prediction time, before it scores (today's centroids)
        summed = learner.centroid_sum / learner.class_count.clamp(min=1).unsqueeze(1)
        value = score(logits, features)
        fresh = current_centroids(learner)
        nearest = euclidean(F.normalize(features, dim=1), F.normalize(fresh, dim=1)).min()
        checks.append((torch.allclose(learner.centroids(), fresh, atol=1e-5), value == pytest.approx(
            float(nearest), abs=1e-4), torch.allclose(summed, fresh, atol=1e-5)))
        return value

    learner.unseen_score = checking
    assert run.run().status == "finished"
    assert len(checks) >= 4
    assert all(current for current, _, _ in checks)  # the detector's centroids: the current class means
    assert all(scored for _, scored, _ in checks)  # and its score is the minimum distance to them
    assert not all(summed for _, _, summed in checks)  # the updates did change the features


def test_a_head_only_learner_keeps_its_centroids(data):
    run = StreamRun(stream_job("fluid_finetune", {"detector": "mdt", "threshold": 2.1, "update_every": 20,
                                                  "epochs": 1, "batch_size": 16}), data)
    run.run()
    assert run.learner.backbone_version == 0  # nothing but the head trained: no features to take again
    assert torch.allclose(run.learner.centroids(), current_centroids(run.learner), atol=1e-5)


# ---------------------------------------------------------------- pretraining's statistics: what it trains on

def test_pretraining_normalises_by_the_images_it_trains_on(tmp_path, monkeypatch):
    from safetensors import safe_open

    from gtep.data.pipelines import pixel_statistics
    from gtep.engine import pretrain as engine

    monkeypatch.setattr(engine.Trainer, "fit", lambda self, *args, **kwargs: None)  # the statistics alone
    data = resolve_dataset("synthetic:classes=4,train=10,test=2").load()
    spec = engine.PretrainSpec("resnet8", (0, 1), epochs=1, device="cpu", holdout=0.3, holdout_classes=(0, 1))
    engine.pretrain(spec, data, "synthetic", tmp_path / "w.safetensors")
    with safe_open(str(tmp_path / "w.safetensors"), "pt") as f:
        meta = f.metadata()
    mean = [float(v) for v in meta["gtep.mean"].split(",")]
    std = [float(v) for v in meta["gtep.std"].split(",")]
    pretraining = data.subset([0, 1])
    trained = np.flatnonzero(engine.pretraining_images(pretraining.y_train, spec))
    assert len(trained) == 2 * 7
    expected_mean, expected_std = pixel_statistics(pretraining.x_train, trained)
    # (the weights store float32 statistics; the held-out images move them by about 1e-3)
    assert mean == pytest.approx(expected_mean, rel=1e-6)
    assert std == pytest.approx([s + 1e-6 for s in expected_std], rel=1e-6)
    every_mean, _ = pixel_statistics(pretraining.x_train)  # with the held-out images: what it computed before
    assert mean != pytest.approx(every_mean, rel=1e-4)
