"""The FSCIL paper's compared methods and its own, each doing what its paper claims, on synthetic data:
CEC's attention adapts the classifier and helps on held-out pseudo-incremental episodes; FACT's virtual classes
take the space between base classes; NC-FSCIL's simplex-ETF classifier never changes while features align to
it; feature rectification moves the final feature's relations towards the intermediate layer's and helps the
novel classes."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from gtep.algorithms import ALGORITHMS, FitRecipe, TaskData
from gtep.algorithms.fscil.cec import Episodes
from gtep.engine.loop import Trainer
from tests.helpers import VIT, VIT_DATASET, class_images, learn, pretrained_vit, snapshot, unchanged

CPU = torch.device("cpu")


def recipe(epochs: int, lr: float = 0.05) -> FitRecipe:
    return FitRecipe(epochs=epochs, lr=lr, batch_size=32, weight_decay=5e-4, scheduler="cosine", milestones=(),
                     lr_decay=0.1)


images = class_images  # (dataset, split, classes, per_class)


def task(dataset: str, index: int, known: int, classes: list[int], fit: FitRecipe, per_class: int | None = None):
    x, y = images(dataset, "train", classes, per_class)
    return TaskData(index, known, known + len(classes), x, y, fit)


def make(name: str, backbone: str = "resnet8", weights: str | None = None, **hparams):
    algorithm = ALGORITHMS.get(name)
    torch.manual_seed(0)
    return algorithm(algorithm.Params.from_mapping(hparams), backbone, 0, CPU, weights=weights)


# ---- CEC --------------------------------------------------------------------------------------------
NOISY = "synthetic:classes=12,train=40,test=30,noise=90"  # 1-shot prototypes are noisy: NCM is far from perfect


@pytest.fixture(scope="module")
def cec():
    learner, trainer = make("cec", way=4, low_way=4, shots=1, queries=5, episodes=20, meta_epochs=30), Trainer(CPU, 0)
    learn(learner, task(NOISY, 0, 0, list(range(8)), recipe(6)), trainer)
    after_base = {"attention": snapshot(learner.net.attention), "rows": learner.net.weight[:8].detach().clone()}
    learn(learner, task(NOISY, 1, 8, [8, 9, 10, 11], recipe(6), per_class=5), trainer)
    return learner, after_base


def test_cec_adapted_classifier_differs_from_the_frozen_one_and_helps_on_pseudo_incremental_episodes(cec):
    learner, _ = cec
    learner.net.eval()
    x, y = images(NOISY, "test", list(range(8)))  # held-out images of the base classes, never trained on
    with torch.no_grad():
        bank = torch.cat([learner.features(torch.rot90(x, k, (2, 3))) for k in range(4)])
        index, targets = Episodes(y, learner.params, generator_seed=123).draw(200, bank.device)
        feats = bank[index]
        vectors, queries = feats[:, :, :1].mean(2), feats[:, :, 1:].flatten(1, 2)  # 4 real + 4 rotated classes
        plain = (F.normalize(queries, dim=2) @ F.normalize(vectors, dim=2).transpose(1, 2)).argmax(2)
        adapted = learner.net.adapted_cosine(vectors, queries).argmax(2)
        # the adapted classifier is not the frozen one: the attention moves every class vector
        sets = torch.cat([vectors, queries[:, :1]], dim=1)
        moved = F.cosine_similarity(learner.net.attention(sets)[:, :-1], vectors, dim=2)
    assert moved.mean() < 0.99, moved.mean()
    plain_acc, adapted_acc = (plain == targets).float().mean(), (adapted == targets).float().mean()
    assert adapted_acc > plain_acc + 0.01, (plain_acc, adapted_acc)  # 8000 queries: ~0.75 -> ~0.78


def test_cec_few_shot_session_trains_nothing_and_appends_prototypes(cec):
    learner, after_base = cec
    assert unchanged(learner.net.attention, after_base["attention"])
    assert torch.equal(learner.net.weight[:8], after_base["rows"])
    shots_x, shots_y = images(NOISY, "train", [8, 9, 10, 11], per_class=5)
    learner.net.eval()
    means = torch.stack([learner.features(shots_x[shots_y == c]).mean(0) for c in [8, 9, 10, 11]])
    assert torch.allclose(learner.net.weight[8:12], means, atol=1e-5)
    assert learner.parameter_counts()[1] == 0


# ---- FACT -------------------------------------------------------------------------------------------
SIMPLE = "synthetic:classes=10,train=40,test=20"


def fact_after_base(balance: float):
    """FACT's base training (before the prototypes replace the trained rows): the fraction of test images, and
    of mixtures of two test images of different classes, whose nearest vector is virtual; the base accuracy."""
    learner = make("fact", balance=balance, virtual_classes=6)
    base = task(SIMPLE, 0, 0, list(range(6)), recipe(4))
    learner.begin_task(base)
    learner.learn_task(base, Trainer(CPU, 0).fit)
    learner.net.eval()
    x, y = images(SIMPLE, "test", list(range(6)))
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(1))
    apart = y != y[perm]
    with torch.no_grad():
        clean = learner.net.reserved_logits(learner.features_of(x), 6)
        mixed = learner.net.reserved_logits(learner.features_of(0.5 * x[apart] + 0.5 * x[perm][apart]), 6)
    return {"mixed": (mixed.argmax(1) >= 6).float().mean().item(),
            "clean": (clean.argmax(1) >= 6).float().mean().item(),
            "acc": (clean[:, :6].argmax(1) == y).float().mean().item()}


def test_fact_virtual_classes_reserve_the_space_between_base_classes():
    plain, fact = fact_after_base(0.0), fact_after_base(0.1)
    assert plain["mixed"] < 0.1  # without the forward-compatible terms mixtures fall to base classes
    assert fact["mixed"] > 0.5  # FACT gives most of the space between two classes to virtual ones (~0.69)
    assert fact["mixed"] > fact["clean"] + 0.15  # and more of it than of the classes' own images
    assert fact["acc"] > 0.9  # while the base classes are still told apart


# ---- NC-FSCIL ---------------------------------------------------------------------------------------
def test_nc_fscil_classifier_never_changes_and_features_align_to_it():
    learner, trainer = make("nc_fscil", etf_classes=10), Trainer(CPU, 0)
    etf = learner.net.etf.clone()
    assert not any(p is learner.net.etf for p in learner.net.parameters())  # a buffer: no optimiser reaches it
    cos = etf @ etf.t()
    off = cos[~torch.eye(10, dtype=torch.bool)]
    assert torch.allclose(cos.diagonal(), torch.ones(10), atol=1e-5)
    assert torch.allclose(off, torch.full_like(off, -1 / 9), atol=1e-5)  # a simplex ETF
    learn(learner, task(SIMPLE, 0, 0, [0, 1, 2, 3], recipe(12, lr=0.2)), trainer)
    assert torch.equal(learner.net.etf, etf)
    backbone, neck = snapshot(learner.net.backbone), snapshot(learner.net.neck)
    learn(learner, task(SIMPLE, 1, 4, [4, 5, 6], recipe(50, lr=0.5), per_class=5), trainer)
    assert torch.equal(learner.net.etf, etf)  # bit-identical through both sessions
    assert unchanged(learner.net.backbone, backbone) and not unchanged(learner.net.neck, neck)
    assert learner.net.memory.shape[0] == 7  # one mean backbone feature per seen class
    learner.net.eval()
    x, y = images(SIMPLE, "test", list(range(7)))
    with torch.no_grad():
        scores = learner.predict(x)  # cosine of the projected feature to each seen class's ETF vector
    right = scores.argmax(1) == y
    # the neck moved the novel classes onto their own vectors while the old ones stayed on theirs (chance 1/7)
    assert right[y < 4].float().mean() > 0.7 and right[y >= 4].float().mean() > 0.5, right.float().mean()


# ---- feature rectification (the FSCIL paper's own, on a small ViT) ---------------------------------
def distances(features: torch.Tensor) -> torch.Tensor:
    f = F.normalize(features, dim=1)
    i = torch.triu_indices(len(f), len(f), 1)
    return torch.cdist(f, f)[i[0], i[1]]


def correlation(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a - a.mean(), b - b.mean()
    return float((a * b).sum() / (a.norm() * b.norm()))


@pytest.fixture(scope="module")
def rectified():
    learner = make("feature_rectification", VIT, pretrained_vit(), train_backbone=False, fr_layers=2, fr_offset=1)
    trainer = Trainer(CPU, 0)
    learn(learner, task(VIT_DATASET, 0, 0, list(range(6)), recipe(10, lr=0.01)), trainer)
    base_x, _ = images(VIT_DATASET, "test", list(range(6)))
    learner.net.eval()
    with torch.no_grad():
        stacked = learner.net.layer_features(base_x)
        branches = learner.net.rectified(stacked)
    backbone = snapshot(learner.net.backbone)
    learn(learner, task(VIT_DATASET, 1, 6, [6, 7, 8, 9], recipe(10, lr=0.01), per_class=5), trainer)
    return learner, stacked, branches, backbone


def test_rectified_features_take_the_intermediate_relations_and_stay_near_the_final_ones(rectified):
    learner, stacked, branches, _ = rectified
    assert learner.net.layers == [2, 3]  # the two layers below the last of the 4-layer ViT
    for b, branch in enumerate(branches):
        final, inter = stacked[:, 0], stacked[:, 1 + b]
        assert not torch.allclose(branch, final)
        # L_IR: the rectified pairwise distances follow the intermediate layer's more than the raw final ones do
        gap_rectified = 1 - correlation(distances(branch), distances(inter))
        gap_final = 1 - correlation(distances(final), distances(inter))
        assert gap_rectified < 0.75 * gap_final, (b, gap_rectified, gap_final)
        # L_cos: and they stay close to the final features
        assert F.cosine_similarity(branch, final).mean() > 0.5


def test_rectification_helps_novel_classes_with_a_frozen_vit(rectified):
    learner, _, _, backbone = rectified
    assert unchanged(learner.net.backbone, backbone)
    assert learner.net.means.shape[:2] == (10, 3) and learner.net.covs.shape[:2] == (10, 3)  # Gaussians per layer
    x, y = images(VIT_DATASET, "test", [6, 7, 8, 9])
    learner.net.eval()
    with torch.no_grad():
        prototypes = F.normalize(learner.net.weight[:10], dim=1)
        raw = (F.normalize(learner.net.layer_features(x)[:, 0], dim=1) @ prototypes.t()).argmax(1)
        fr = learner.predict(x).argmax(1)
    raw_acc, fr_acc = (raw == y).float().mean(), (fr == y).float().mean()
    assert fr_acc > raw_acc, (raw_acc, fr_acc)  # ~0.64 -> ~0.70 (chance 0.1)
