"""FLUID's conventions next to the paper's (issue 31): every distance counted in the GMACs, the unseen detector's
positives (novel classes only, App. H), the pretrain classes' held-out training images and the preset's buckets,
AUROC over NaN scores (a diverged learner), and the family's pre-flight check of a phase's data."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import yaml
from torch.utils.flop_counter import FlopCounterMode

from gtep.algorithms import ALGORITHMS
from gtep.algorithms._distances import euclidean
from gtep.config import ConfigError, resolve, validate_config
from gtep.data import resolve_dataset
from gtep.engine import run_ordering
from gtep.engine.flows.stream import ComputeMeter, StreamRun
from gtep.models import create_backbone
from gtep.protocol.families import FAMILIES, PhaseData
from gtep.protocol.families.fluid import FluidOptions, class_pools, held_out, phase_stream
from gtep.protocol.families.fluid import metrics as fm
from gtep.protocol.families.fluid.generator import first_occurrences
from tests.helpers import FLUID_OPTIONS, fluid_config, fluid_job

NEVER_UNSEEN = {"threshold": 2.1}  # above every detector's score: every prediction is a class
PRESET = Path(__file__).resolve().parents[2] / "gtep" / "presets" / "tinyimagenet-fluid.yaml"


@pytest.fixture(scope="module")
def data():
    return resolve_dataset("synthetic:classes=10,train=20,test=10").load()


def flops(fn, *args) -> float:
    with FlopCounterMode(display=False) as counter:
        fn(*args)
    return counter.get_total_flops()


# ---------------------------------------------------------------- 1. every distance is counted

def test_distances_are_a_matrix_product_the_counter_sees_and_equal_cdist():
    a, b = torch.randn(7, 16), torch.randn(5, 16)
    assert torch.allclose(euclidean(a, b), torch.cdist(a, b), atol=1e-5)
    assert torch.equal(euclidean(a, b).argmin(1), torch.cdist(a, b).argmin(1))
    assert euclidean(a, a).diagonal().min() >= 0  # no NaN from a tiny negative square
    assert flops(euclidean, a, b) == 2 * 7 * 5 * 16  # n x m x d MACs
    assert flops(torch.cdist, a, b) == 0  # why: the counter is blind to cdist


def classes_seen_before_each_step(labels: np.ndarray) -> np.ndarray:
    return np.cumsum(first_occurrences(labels)) - first_occurrences(labels)


def test_ncm_classifier_and_mdt_detector_are_counted_as_inference(data):
    """NCM's distances to every class mean (its classifier; MDT reuses them) and MDT's distances for a learner with
    a trained head both cost total x dim MACs a prediction, on top of the backbone."""
    backbone = create_backbone("resnet8")
    per_image = flops(backbone, torch.zeros(1, 3, *data.x_train.shape[1:3])) / 2
    dim = int(backbone.out_dim)
    ncm = StreamRun(fluid_job("fluid_ncm", {"detector": "mdt", **NEVER_UNSEEN}), data)
    outcome = ncm.run()
    distances = float(classes_seen_before_each_step(ncm.spec.label).sum()) * dim
    assert outcome.metrics["gmacs_inference"] * 1e9 == pytest.approx(60 * per_image + distances, rel=1e-9)
    schedule = {"update_every": 20, "epochs": 1, "batch_size": 16, **NEVER_UNSEEN}
    msp = run_ordering(fluid_job("fluid_et", {**schedule, "detector": "msp"}), data).metrics
    mdt = run_ordering(fluid_job("fluid_et", {**schedule, "detector": "mdt"}), data).metrics
    assert (mdt["gmacs_inference"] - msp["gmacs_inference"]) * 1e9 == pytest.approx(distances, rel=1e-6)


def test_ncm_mdt_score_is_the_minimum_distance():
    learner = ALGORITHMS.get("fluid_ncm")(ALGORITHMS.get("fluid_ncm").Params.from_mapping({"detector": "mdt"}),
                                          "resnet8", 0, torch.device("cpu"))
    features = torch.randn(1, learner.centroid_sum.shape[1])
    for y in range(3):
        learner.grow_classes(y + 1)
        learner.total = y + 1
        learner.centroid_sum[y] = torch.randn(learner.centroid_sum.shape[1])
        learner.class_count[y] = 1
    meter = ComputeMeter(1.0)
    logits = meter.inference(learner.class_scores, features)
    assert meter.macs["inference"] == 3 * features.shape[1]
    expected = torch.cdist(F.normalize(features, dim=1), F.normalize(learner.centroids(), dim=1)).min()
    assert learner.unseen_score(logits, features) == pytest.approx(float(expected), abs=1e-5)


def test_icarl_nearest_mean_counts_its_distances():
    icarl = ALGORITHMS.get("icarl")
    learner = icarl(icarl.Params.from_mapping({}), "resnet8", 20, torch.device("cpu"))
    x = torch.rand(4, 3, 32, 32)
    with torch.no_grad():
        learner.net.eval()
        dim = learner.features(x[:1]).shape[1]
        learner.class_means = F.normalize(torch.randn(6, dim), dim=1)
        scores = learner.predict(x)
        feats = F.normalize(learner.features(x).float(), dim=1)
    assert torch.equal(scores.argmax(1), (-torch.cdist(feats, learner.class_means)).argmax(1))
    assert flops(learner.predict, x) - flops(learner.features, x) == 2 * 4 * 6 * dim


# ---------------------------------------------------------------- 2. the detector's positives

# pretrain classes 7 and 9; the novel classes 3 and 5 first appear at steps 1 and 4
LABELS = np.array([7, 3, 7, 9, 5, 3, 9, 5])
NOVEL = ~np.isin(LABELS, [7, 9])
SCORES = np.array([0.1, 0.9, 0.2, 0.2, 0.8, 0.3, 0.1, 0.2])


def test_positives_are_first_sightings_of_novel_classes_unless_all_is_asked():
    assert fm.unseen_positives(LABELS, NOVEL).tolist() == [False, True, False, False, True, False, False, False]
    assert fm.unseen_positives(LABELS, NOVEL, "all").tolist() == first_occurrences(LABELS).tolist()
    assert fm.auroc(SCORES, fm.unseen_positives(LABELS, NOVEL)) == pytest.approx(1.0)  # 0.9, 0.8 beat every other
    # all: positives 0.1 0.9 0.2 0.8 vs negatives 0.2 0.3 0.1 0.2 -> (0.5 + 4 + 2 + 4) / 16
    assert fm.auroc(SCORES, fm.unseen_positives(LABELS, NOVEL, "all")) == pytest.approx(10.5 / 16)
    with pytest.raises(ValueError, match="novel"):
        fm.unseen_positives(LABELS, NOVEL, "seen")


def test_the_stream_scores_detection_on_novel_classes_by_default(data):
    run = StreamRun(fluid_job("fluid_ncm", {"detector": "mdt", **NEVER_UNSEEN}), data)
    metrics = run.run().metrics
    scores, first = run.stream.unseen_scores, first_occurrences(run.spec.label)
    novel = first & ~run.spec.pretrain
    assert first.sum() == 6 and novel.sum() == 4
    assert metrics["unseen_auroc"] == pytest.approx(fm.auroc(scores, novel))
    assert metrics["unseen_f1"] == pytest.approx(fm.best_f1(scores, novel))
    assert fm.auroc(scores, novel) != pytest.approx(fm.auroc(scores, first))  # the two conventions differ here
    every = StreamRun(fluid_job("fluid_ncm", {"detector": "mdt", **NEVER_UNSEEN}, unseen_positives="all"), data).run()
    assert every.metrics["unseen_auroc"] == pytest.approx(fm.auroc(scores, first))


def test_the_config_defaults_to_novel_positives_and_no_holdout():
    fluid = validate_config(fluid_config(), "test").scenario.fluid
    assert fluid is not None and fluid.unseen_positives == "novel" and fluid.pretrain_holdout == 0
    with pytest.raises(ConfigError, match="unseen_positives"):
        validate_config(fluid_config(unseen_positives="seen"), "test")
    with pytest.raises(ConfigError, match="pretrain_holdout"):
        validate_config(fluid_config(pretrain_holdout=1.0), "test")


# ---------------------------------------------------------------- 3. held-out pretrain images and the buckets

def test_held_out_images_are_never_pretrained_on_and_are_in_the_stream_pools():
    from gtep.engine.pretrain import PretrainSpec, pretraining_images

    full = resolve_dataset("synthetic:classes=12,train=30,test=5").load()
    wanted = held_out(full.y_train, [0, 1], 0.4)  # dataset positions
    assert len(wanted) == 2 * 12 and set(full.y_train[wanted]) == {0, 1}
    assert np.array_equal(wanted, held_out(full.y_train, [1, 0], 0.4))  # deterministic: the class alone decides
    # pretraining sees the pretrain classes' subset; a stream sees the phase's (pretrain + novel classes)
    pretraining = full.subset([0, 1, 2])
    used = pretraining_images(pretraining.y_train, PretrainSpec("resnet8", (0, 1, 2), holdout=0.4,
                                                                holdout_classes=(0, 1)))
    trained_on = pretraining.dataset_train_index()[used]
    assert not set(trained_on) & set(wanted)
    assert set(pretraining.dataset_train_index()[~used]) == set(wanted)
    phase = full.subset([0, 1, 5, 6, 7])
    pools = class_pools(phase.y_train, phase.y_test, [0, 1], with_train=False, holdout=0.4)
    shown = np.concatenate(list(pools.values()))
    train_ids = shown[shown < len(phase.y_train)]
    assert set(phase.dataset_train_index()[train_ids]) == set(wanted)
    assert (shown >= len(phase.y_train)).sum() == 2 * 5  # and every test image, as before
    assert class_pools(phase.y_train, phase.y_test, [0], with_train=False)[0].tolist() == \
        (np.flatnonzero(phase.y_test == 0) + len(phase.y_train)).tolist()  # no holdout: test images only


def test_pretraining_trains_on_what_is_not_held_out(tmp_path, monkeypatch):
    from gtep.engine import pretrain as engine

    seen = {}

    def fit(self, parameters, loss, x, y, recipe, **kwargs):
        seen["rows"] = len(y)

    monkeypatch.setattr(engine.Trainer, "fit", fit)
    data = resolve_dataset("synthetic:classes=4,train=10,test=2").load()
    spec = engine.PretrainSpec("resnet8", (0, 1), epochs=1, device="cpu", holdout=0.3, holdout_classes=(0, 1))
    engine.pretrain(spec, data, "synthetic", tmp_path / "w.safetensors")
    assert seen["rows"] == 2 * (10 - 3)
    from safetensors import safe_open

    with safe_open(str(tmp_path / "w.safetensors"), "pt") as f:
        assert f.metadata()["gtep.holdout"] == "0.3"


def test_the_study_pretrains_with_the_holdout_and_caches_it_apart():
    from gtep.orchestration.pretraining import pretrain_spec, pretrained_path

    with_section = {**fluid_config(), "pretrain": {"classes": [0, 1, 2, 3], "epochs": 1}}
    plain = resolve(validate_config(with_section, "test"))
    data = {**with_section, "scenario": {"family": "fluid", "fluid": {
        **with_section["scenario"]["fluid"], "pretrain_holdout": 0.25}}}
    held = resolve(validate_config(data, "test"))
    assert pretrain_spec(plain).holdout == 0
    assert pretrain_spec(held).holdout == 0.25 and pretrain_spec(held).holdout_classes == (0, 1, 2, 3)
    assert pretrained_path(plain) != pretrained_path(held)


def test_a_holdout_needs_the_pretrain_section():
    with pytest.raises(ConfigError) as err:
        resolve(validate_config(fluid_config(pretrain_holdout=0.25), "test"))
    assert err.value.field == "scenario.fluid.pretrain_holdout"


def bucket_stats(section: dict, seeds: int = 60) -> dict[str, float]:
    """Over `seeds` sequences on Tiny ImageNet's shape (75 training, 25 test images a class): the pretrain classes'
    share of the samples, their head classes per sequence, and the most samples one pretrain class gets."""
    y_train, y_test = np.repeat(np.arange(70), 75), np.repeat(np.arange(70), 25)
    options = FluidOptions.of(section)
    share, head, most = [], [], []
    for seed in range(seeds):
        spec = phase_stream(y_train, y_test, list(range(30, 50)), options, seed, 0)
        pretrain = set(spec.label[spec.pretrain].tolist())
        share.append(spec.pretrain.mean())
        head.append(sum(n > options.head_cut for c, n in spec.counts.items() if c in pretrain))
        most.append(max(n for c, n in spec.counts.items() if c in pretrain))
    return {"share": float(np.mean(share)), "head": float(np.mean(head)), "most": float(np.max(most))}


def test_the_preset_gives_pretrain_classes_their_share_and_the_head():
    section = yaml.safe_load(PRESET.read_text())["scenario"]["fluid"]
    fair = section["n_pretrain_classes"] / (section["n_pretrain_classes"] + section["n_novel_classes"])  # 8/23
    stats = bucket_stats(section)
    assert stats["share"] == pytest.approx(fair, abs=0.03)  # the paper's ~35%: rank alone decides
    assert stats["most"] == section["per_class_cap"] > 25  # more than its 25 test images: a head class
    assert stats["head"] >= 3
    before = bucket_stats({**section, "pretrain_holdout": 0.0, "per_class_cap": 100})  # the preset before
    assert before["share"] < 0.26 and before["most"] == 25


# ---------------------------------------------------------------- 4. NaN scores: NaN metrics, a diverged run

def test_auroc_and_f1_of_nan_scores_are_nan():
    assert math.isnan(fm.auroc([float("nan"), 0.1, 0.2], [True, False, False]))
    assert math.isnan(fm.best_f1([float("nan"), 0.1, 0.2], [True, False, False]))


def test_a_learner_with_nan_unseen_scores_is_recorded_as_diverged(data):
    run = StreamRun(fluid_job("fluid_ncm", NEVER_UNSEEN), data)
    run.learner.unseen_score = lambda logits, features: float("nan")
    outcome = run.run()  # never raises
    assert outcome.status == "diverged" and "NaN" in outcome.message
    assert math.isnan(outcome.metrics["unseen_auroc"]) and outcome.metrics["overall_acc"] >= 0


# ---------------------------------------------------------------- 5. the family's pre-flight check

def phase(train: dict[int, int], test: dict[int, int], classes=(3, 4, 5)) -> PhaseData:
    return PhaseData("tune", "syn", tuple(classes), train, test)


def test_check_names_what_a_stream_cannot_be_drawn_from():
    family = FAMILIES.get("fluid")
    good_train, good_test = {c: 20 for c in range(6)}, {c: 10 for c in range(6)}
    options = {**FLUID_OPTIONS, "n_novel_classes": 3}
    assert family.check([phase(good_train, good_test)], options) == []
    only_train = phase(good_train, {**good_test, 4: 0})  # a novel class needs images, not test images
    assert family.check([only_train], options) == []
    problems = family.check([phase({**good_train, 4: 0}, {**good_test, 4: 0})], options)
    assert [p.field for p in problems] == ["datasets"] and "[4]" in problems[0].message
    problems = family.check([phase(good_train, {**good_test, 1: 0})], options)
    assert [p.field for p in problems] == ["scenario.fluid.pretrain_classes"] and "[1]" in problems[0].message
    problems = family.check([phase({**good_train, 2: 3}, good_test)], {**options, "pretrain_holdout": 0.2})
    assert [p.field for p in problems] == ["scenario.fluid.pretrain_holdout"] and "class 2 has 3" in \
        problems[0].message
    # the caps allow fewer samples than total_samples: no problem (the generator gives what they allow)
    assert family.check([phase(good_train, good_test)], {**options, "total_samples": 10_000}) == []


def test_describe_tells_the_stream_of_sequence_0():
    family = FAMILIES.get("fluid")
    options = {**FLUID_OPTIONS, "n_novel_classes": 3}
    data = phase({c: 20 for c in range(6)}, {c: 10 for c in range(6)})
    [(what, samples)] = family.describe(data, options, seed=0)
    assert samples == 60 and "a stream of 60 samples: 2 pretrain classes" in what and "3 novel classes" in what
    [(what, samples)] = family.describe(data, {**options, "total_samples": 10_000}, seed=0)
    assert samples == 2 * 10 + 3 * 20 and "total_samples is 10000" in what  # capped at 20, pretrain: 10 tests
    # what it says is the stream the engine draws (the generator draws from the image counts alone)
    held = {**options, "pretrain_holdout": 0.25, "total_samples": 70}
    [(what, samples)] = family.describe(data, held, seed=3)
    stream = phase_stream(np.repeat(np.arange(6), 20), np.repeat(np.arange(6), 10), [3, 4, 5],
                          FluidOptions.of(held), seed=3, ordering=0)
    assert samples == len(stream) and f"({100 * stream.pretrain.mean():.0f}% of the samples)" in what
