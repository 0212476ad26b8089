"""Training-frozen prototypes (the FSCIL baseline): after the base session the backbone and the base classes'
vectors never move, so few-shot sessions leave every base-class score bit-identical; novel classes learnt
from 5 shots each, without training, are recognised far above chance; sessions smaller than a batch work."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from gtep.algorithms import ALGORITHMS, FitRecipe, TaskData
from gtep.engine.loop import Trainer
from gtep.spaces import load_space
from tests.helpers import class_images, learn, snapshot, unchanged

CPU = torch.device("cpu")
DATA = "synthetic:classes=10,train=40,test=20"
BASE, SESSIONS = [0, 1, 2, 3], [[4, 5, 6], [7, 8, 9]]  # a base session, then two 3-way 5-shot sessions
SHOTS = 5
RECIPE = FitRecipe(epochs=4, lr=0.05, batch_size=32, weight_decay=5e-4, scheduler="cosine", milestones=(),
                   lr_decay=0.1)


def images(split: str, classes: list[int], per_class: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The synthetic images of `classes` (the first `per_class` of each), normalised, labelled by class."""
    return class_images(DATA, split, classes, per_class)


def task(index: int, known: int, classes: list[int], per_class: int | None = None,
         recipe: FitRecipe = RECIPE) -> TaskData:
    x, y = images("train", classes, per_class)
    return TaskData(index, known, known + len(classes), x, y, recipe)


def make_learner(**hparams):
    algorithm = ALGORITHMS.get("frozen_prototypes")
    torch.manual_seed(0)
    return algorithm(algorithm.Params.from_mapping(hparams), "resnet8", 0, CPU)


class CountingTrainer(Trainer):
    """The engine's trainer, counting the fit calls that have parameters to train."""

    def __init__(self) -> None:
        super().__init__(CPU, 0)
        self.fits = 0

    def fit(self, parameters, *args, **kwargs):
        parameters = [p for p in parameters if p.requires_grad]
        self.fits += bool(parameters)
        super().fit(parameters, *args, **kwargs)


def predict(learner, x):
    learner.net.eval()
    return learner.predict(x)


@pytest.fixture(scope="module")
def fscil():
    """The base session (all 40 images of classes 0-3), then two 3-way 5-shot sessions, with what the learner
    held and predicted after each."""
    learner, trainer = make_learner(), CountingTrainer()
    base_x, base_y = images("test", BASE)
    learn(learner, task(0, 0, BASE), trainer)
    after_base = {"backbone": snapshot(learner.net.backbone), "base_rows": learner.net.weight[:4].detach().clone(),
                  "scores": predict(learner, base_x), "fits": trainer.fits}
    sessions = []
    known = len(BASE)
    for index, classes in enumerate(SESSIONS, start=1):
        learn(learner, task(index, known, classes, per_class=SHOTS), trainer)
        known += len(classes)
        sessions.append({"scores": predict(learner, base_x), "fits": trainer.fits,
                         "weight": learner.net.weight.detach().clone()})
    return learner, after_base, sessions, (base_x, base_y)


def test_few_shot_sessions_leave_the_backbone_and_base_scores_bit_identical(fscil):
    learner, after_base, sessions, (base_x, base_y) = fscil
    assert after_base["fits"] == 1  # the base session trained
    assert (after_base["scores"].argmax(1) == base_y).float().mean() > 0.9  # and learnt the base classes
    for session in sessions:
        assert session["fits"] == 1  # no session after the base one trains anything
        assert torch.equal(session["weight"][:4], after_base["base_rows"])  # base vectors never move
        # the scores of the base classes on the base test images: exactly those after the base session
        assert torch.equal(session["scores"][:, :4], after_base["scores"])
    assert unchanged(learner.net.backbone, after_base["backbone"])  # weights and BatchNorm statistics alike
    assert not any(p.requires_grad for p in learner.net.parameters())
    assert learner.parameter_counts()[1] == 0
    # base predictions themselves (over every seen class) stay mostly right next to the 6 novel classes
    final = sessions[-1]["scores"]
    assert final.shape == (len(base_x), 10)
    assert (final.argmax(1) == base_y).float().mean() > 0.8


def test_novel_classes_are_recognised_from_five_shots(fscil):
    learner, *_ = fscil
    novel = [c for classes in SESSIONS for c in classes]
    x, y = images("test", novel)
    accuracy = (predict(learner, x).argmax(1) == y).float().mean().item()
    assert accuracy > 0.7, accuracy  # chance over the 10 seen classes is 0.1
    # each novel vector is its class's prototype: by default the paper's mean feature of its 5 shots
    shots_x, shots_y = images("train", SESSIONS[0], per_class=SHOTS)
    learner.net.eval()
    with torch.no_grad():
        feats = learner.net.backbone(shots_x)["features"]
    for c in SESSIONS[0]:
        assert torch.allclose(learner.net.weight[c], feats[shots_y == c].mean(0), atol=1e-5)


def test_base_vectors_are_the_prototypes_or_the_trained_weights():
    """`base_prototypes` (default, the original preset): the base rows become the base classes' prototypes
    when the base session ends; otherwise they keep the cosine classifier's trained weights."""
    small = RECIPE.replace(epochs=1)
    base = task(0, 0, [0, 1], per_class=12, recipe=small)
    rows = {}
    for replace in (True, False):
        learner, trainer = make_learner(base_prototypes=replace), Trainer(CPU, 0)
        learner.begin_task(base)
        learner.learn_task(base, trainer.fit)
        trained = learner.net.weight.detach().clone()
        learner.end_task(base, trainer.fit)
        rows[replace] = (trained, learner.net.weight.detach().clone())
        learner.net.eval()
        with torch.no_grad():
            feats = learner.net.backbone(base.x)["features"]
        prototypes = torch.stack([feats[base.y == c].mean(0) for c in (0, 1)])
        if replace:
            assert torch.allclose(rows[replace][1], prototypes, atol=1e-5)
        else:
            assert torch.equal(rows[replace][1], trained)
    assert torch.equal(rows[True][0], rows[False][0])  # the same training, only the choice differs


def test_prototype_is_the_papers_mean_feature_by_default_or_the_mean_normalised_feature():
    """The paper's baseline extends the classifier "by mean features (i.e. prototypes)" (fscil-gacc.txt,
    Baseline), as CEC's update_fc_avg does: the default `prototype: mean` stores the mean of the raw features,
    which the cosine classifier then normalises. `normalised_mean` averages unit vectors instead (every shot
    weighs the same whatever its feature norm). The base session is the same; only the vectors differ."""
    base = task(0, 0, [0, 1], per_class=12, recipe=RECIPE.replace(epochs=1))
    session = task(1, 2, [2, 3], per_class=SHOTS)
    assert make_learner().params.prototype == "mean"
    rows = {}
    for prototype in ("mean", "normalised_mean"):
        learner, trainer = make_learner(prototype=prototype), Trainer(CPU, 0)
        learn(learner, base, trainer)
        learn(learner, session, trainer)
        learner.net.eval()
        with torch.no_grad():
            feats = learner.net.backbone(torch.cat([base.x, session.x]))["features"]
        labels = torch.cat([base.y, session.y])
        if prototype == "normalised_mean":
            feats = F.normalize(feats, dim=1)
        expected = torch.stack([feats[labels == c].mean(0) for c in range(4)])
        assert torch.allclose(learner.net.weight, expected, atol=1e-5)
        rows[prototype] = learner.net.weight.detach().clone()
    assert (rows["mean"].norm(dim=1) > 1.01).all()  # raw features are not unit vectors: mean keeps their scale
    assert (rows["normalised_mean"].norm(dim=1) <= 1 + 1e-6).all()  # a mean of unit vectors


def test_the_two_prototypes_by_hand():
    """Two shots of one class with features (1, 0) and (0, 10): the paper's mean feature (0.5, 5) leans to the
    larger shot, the mean normalised feature (0.5, 0.5) weighs both alike. A query (1, 1.5) is nearer a rival
    class at (1, 0.6) (cosine 0.90) than the mean feature (0.88), but nearer the mean normalised feature (0.98)
    than the rival: the two readings predict differently."""
    shots = torch.zeros(2, 64)
    shots[0, 0], shots[1, 1] = 1.0, 10.0
    rival = torch.zeros(1, 64)
    rival[0, :2] = torch.tensor([1.0, 0.6])
    query = torch.zeros(1, 64)
    query[0, :2] = torch.tensor([1.0, 1.5])
    predicted = {}
    for prototype, expected in (("mean", (0.5, 5.0)), ("normalised_mean", (0.5, 0.5))):
        learner = make_learner(prototype=prototype)
        learner.net.expand(2)
        learner.features = lambda x: x  # the features are the inputs, so the rows can be computed by hand
        session = TaskData(1, 0, 2, torch.cat([shots, rival]), torch.tensor([0, 0, 1]), RECIPE)
        learner.set_prototypes(session, [0, 1])
        assert learner.net.weight[0, :2].tolist() == pytest.approx(expected)
        predicted[prototype] = learner.net.cosine(query).argmax(1).item()
    assert predicted == {"mean": 1, "normalised_mean": 0}


def test_sessions_smaller_than_a_batch():
    """A base session of 10 images and a 2-way 2-shot session, with batches of 32: both run, and the
    scores cover every seen class."""
    learner, trainer = make_learner(), CountingTrainer()
    learn(learner, task(0, 0, [0, 1], per_class=5), trainer)
    assert trainer.fits == 1
    before = snapshot(learner.net.backbone)
    session = task(1, 2, [2, 3], per_class=2)
    assert len(session.x) < session.recipe.batch_size
    learn(learner, session, trainer)
    assert trainer.fits == 1 and unchanged(learner.net.backbone, before)
    scores = predict(learner, images("test", [0, 1, 2, 3])[0])
    assert scores.shape == (80, 4) and torch.isfinite(scores).all()
    assert torch.isfinite(learner.net.weight).all()


def test_learnt_scale_trains_in_the_base_session_only():
    learner, trainer = make_learner(learn_scale=True, scale=8.0), Trainer(CPU, 0)
    learn(learner, task(0, 0, [0, 1], per_class=12, recipe=RECIPE.replace(epochs=1)), trainer)
    scale = learner.net.scale.item()
    assert scale != 8.0 and not learner.net.scale.requires_grad
    learn(learner, task(1, 2, [2, 3], per_class=SHOTS), trainer)
    assert learner.net.scale.item() == scale
    fixed = make_learner(scale=8.0)
    assert not fixed.net.scale.requires_grad


def test_search_space_and_original_preset():
    space = load_space("frozen_prototypes")
    assert set(space.space.sets) >= {"scale", "learn_scale", "base_prototypes", "epochs", "lr"}
    algorithm = ALGORITHMS.get("frozen_prototypes")
    params = algorithm.Params.from_mapping(space.presets["original"])
    assert (params.scale, params.learn_scale, params.base_prototypes, params.prototype) == (16, False, True, "mean")
    assert set(space.space.sets["prototype"]) == {"mean", "normalised_mean"}
    assert not algorithm.uses_memory and algorithm.fixed_first_task
    # the prototype reading acts in task 1 too (the base prototypes), so it keys the shared first-task store
    assert set(algorithm.first_task_hparams) == {"scale", "learn_scale", "base_prototypes", "prototype"}
