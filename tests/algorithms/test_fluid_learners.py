"""FLUID's stream learners (gtep/algorithms/fluid_*.py): what each predicts, trains and freezes, and the two
unseen-class detectors (papers/fluid.txt Sec. 4, App. B/C; notes 004.3)."""
from typing import Any, Callable

import pytest
import torch
from torch import Tensor

from gtep.algorithms import ALGORITHMS, FitRecipe
from gtep.algorithms.fluid.finetune import top_blocks
from gtep.engine.loop import Precision, Trainer
from gtep.models import create_backbone
from gtep.protocol.families.fluid.generator import UNSEEN

CPU = torch.device("cpu")
RECIPE = FitRecipe(epochs=3, lr=0.1, batch_size=8, weight_decay=0.0, scheduler="constant", milestones=(), lr_decay=0.1)


class CountingMeter:
    def __init__(self) -> None:
        self.inferences, self.trained = 0, 0

    def inference(self, fn: Callable[[Tensor], Any], x: Tensor) -> Any:
        self.inferences += 1
        return fn(x)

    def training(self, forward: Callable[[Tensor], Any], x_one: Tensor, samples: int) -> None:
        self.trained += samples


def learner(name: str, **hparams: Any):
    torch.manual_seed(0)
    algorithm = ALGORITHMS.get(name)
    return algorithm(algorithm.Params.from_mapping(hparams), "resnet8", 0, CPU)


def images(n: int, seed: int = 0) -> Tensor:
    return torch.randn(n, 3, 16, 16, generator=torch.Generator().manual_seed(seed))


def feed(model, x: Tensor, labels: list[int], meter=None) -> list[tuple[int, float]]:
    meter = meter or CountingMeter()
    out = []
    for i, y in enumerate(labels):
        out.append(model.predict_sample(x[i: i + 1], meter))
        model.reveal(y)
    return out


@pytest.mark.parametrize("name", ["fluid_ncm", "fluid_et", "fluid_finetune", "fluid_standard"])
def test_with_no_class_known_every_learner_says_unseen_with_the_largest_score(name):
    for detector, top in (("msp", 1.0), ("mdt", 2.0)):
        model = learner(name, detector=detector)
        assert model.predict_sample(images(1), CountingMeter()) == (UNSEEN, top)


def test_ncm_predicts_the_class_of_a_seen_image_and_mdt_scores_it_zero():
    model = learner("fluid_ncm", detector="mdt", threshold=0.5)
    x = images(3)
    feed(model, x, [0, 1, 2])
    assert model.total == 3 and model.class_count.tolist() == [1, 1, 1]
    position, score = model.predict_sample(x[1:2], CountingMeter())
    assert position == 1 and score == pytest.approx(0, abs=1e-5)


def test_the_threshold_turns_a_prediction_into_unseen():
    # a threshold just above 0 (0 itself, which flags every sample, is outside its range): a sample that is no
    # class's centroid scores above it and is flagged; a lower threshold than a score always flags
    model = learner("fluid_ncm", detector="mdt", threshold=1e-6)
    x = images(3)
    feed(model, x[:2], [0, 1])
    assert model.predict_sample(x[2:], CountingMeter())[0] == UNSEEN


def test_msp_score_is_one_minus_the_top_softmax_probability():
    model = learner("fluid_ncm", detector="msp", threshold=1.1, temperature=1.0)
    x = images(3)
    feed(model, x, [0, 1, 2])
    features = model.sample_features(x[:1])
    expected = 1 - torch.softmax(model.class_scores(features), dim=1).max().item()
    assert model.predict_sample(x[:1], CountingMeter())[1] == pytest.approx(expected, abs=1e-6)


def test_exemplar_tuning_starts_from_the_centroids_and_trains_only_the_residuals():
    model = learner("fluid_et", threshold=2.1, update_every=4)
    x = images(4)
    feed(model, x, [0, 1, 0, 1])
    assert model.residual.shape == (2, model.centroid_sum.shape[1]) and not model.residual.any()
    features = model.sample_features(x[:1])
    assert torch.allclose(model.class_scores(features), features @ model.centroids().t())
    backbone = [p.clone() for p in model.backbone.parameters()]
    meter = CountingMeter()
    model.update(Trainer(CPU, 0, False, Precision.for_device(CPU, False)).fit, RECIPE, meter)
    assert model.residual.abs().sum() > 0
    assert all(torch.equal(a, b) for a, b in zip(backbone, model.backbone.parameters()))
    assert meter.trained == 4 * RECIPE.epochs  # every seen sample, every epoch


@pytest.mark.parametrize("name, depth, trained_blocks", [("fluid_finetune", 0, 0), ("fluid_finetune", 2, 2),
                                                          ("fluid_standard", -1, 4)])
def test_fine_tuning_trains_the_head_and_the_top_depth_blocks(name, depth, trained_blocks):
    model = learner(name, depth=depth, threshold=2.1)
    assert model.caches_features == (depth == 0)
    x = images(6)
    feed(model, x, [0, 1, 2, 0, 1, 2])
    before = {n: p.clone() for n, p in model.net.named_parameters()}
    model.update(Trainer(CPU, 0, False, Precision.for_device(CPU, False)).fit, RECIPE, CountingMeter())
    changed = {n for n, p in model.net.named_parameters() if not torch.equal(p, before[n])}
    assert {n for n in changed if n.startswith("head")} == {"head.weight", "head.bias"}
    blocks = top_blocks(model.backbone, depth)
    assert len(blocks) == trained_blocks
    tuned = {id(p) for b in blocks for p in b.parameters()}
    for n, p in model.backbone.named_parameters():
        assert (f"backbone.{n}" in changed) <= (id(p) in tuned), n  # nothing outside the tuned blocks moved


def test_top_blocks_counts_from_the_top():
    backbone = create_backbone("resnet8")  # stem + 3 blocks (one per stage)
    assert top_blocks(backbone, 1) == [backbone.stages[2][0]]
    assert top_blocks(backbone, -1)[0] is backbone.stem and len(top_blocks(backbone, -1)) == 4
    assert top_blocks(backbone, 0) == []


def test_updates_are_due_every_update_every_samples():
    model = learner("fluid_et", update_every=3)
    assert [t for t in range(1, 10) if model.due(t)] == [3, 6, 9]
