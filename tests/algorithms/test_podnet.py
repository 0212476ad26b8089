"""PODNet: POD-spatial distillation, the Local Similarity Classifier, NCA with margin, class-balanced
fine-tuning of the classifier, and more old classes kept than fine-tuning with no memory."""
import copy
import math

import pytest
import torch
import torch.nn.functional as F

from gtep.algorithms import ALGORITHMS, FitRecipe, TaskData
from gtep.algorithms.podnet import PODNet, PODNetParams, nca_loss, pod_flat_loss, pod_spatial_loss
from gtep.engine.loop import Trainer
from gtep.spaces import load_space
from tests.algorithms.support import assert_keeps_more_old_classes
from tests.helpers import learn, run_small


def make_learner(memory_size: int = 8, **hparams) -> PODNet:
    torch.manual_seed(0)
    return PODNet(PODNetParams(**hparams), "resnet8", memory_size, torch.device("cpu"))


def make_task(index: int, known: int, total: int, per_class: int = 4) -> TaskData:
    gen = torch.Generator().manual_seed(index)
    y = torch.arange(known, total).repeat_interleave(per_class)
    x = torch.randn(len(y), 3, 16, 16, generator=gen) + y.view(-1, 1, 1, 1).float()
    recipe = FitRecipe(epochs=1, lr=0.05, batch_size=8, weight_decay=0.0, scheduler="constant", milestones=(),
                       lr_decay=0.1)
    return TaskData(index, known, total, x, y, recipe)


def test_pod_spatial_is_zero_for_identical_maps_grows_with_change_and_reaches_early_stages():
    learner = make_learner()
    learner.begin_task(make_task(0, 0, 2))
    net = learner.net.eval()
    old = learner.frozen_copy(net)
    x = torch.randn(6, 3, 16, 16)
    with torch.no_grad():
        old_maps = old(x)["fmaps"]
    assert len(old_maps) == 3
    with torch.no_grad():
        assert float(pod_spatial_loss(net(x)["fmaps"], old_maps)) < 1e-6
    losses, changed_nets = [], []
    for noise in (0.05, 0.5):  # perturb the middle stage only: only later maps can move
        changed = copy.deepcopy(net)
        with torch.no_grad():
            for p in changed.backbone.stages[1].parameters():
                p.add_(noise * torch.randn_like(p))
        losses.append(pod_spatial_loss(changed(x)["fmaps"], old_maps))
        changed_nets.append(changed)
    assert 0 < float(losses[0].detach()) < float(losses[1].detach())
    losses[1].backward()
    for stage in (0, 1):  # intermediate stages before the last one receive the distillation gradient
        grads = [p.grad for p in changed_nets[1].backbone.stages[stage].parameters()]
        assert all(g is not None and torch.isfinite(g).all() for g in grads)
        assert sum(float(g.abs().sum()) for g in grads) > 0


def test_training_loss_adds_both_pod_terms_with_the_adaptive_factor():
    learner = make_learner(lambda_c=5.0, lambda_f=2.0, adaptive_factor=True)
    learner.begin_task(make_task(0, 0, 2))
    learner.begin_task(make_task(1, 2, 5))
    assert learner.factor == pytest.approx(math.sqrt(5 / 3))
    learner.net.eval()
    with torch.no_grad():
        for p in learner.net.backbone.stages[1].parameters():
            p.add_(0.2 * torch.randn_like(p))
    x, y = torch.randn(6, 3, 16, 16), torch.tensor([0, 1, 2, 3, 4, 4])
    with torch.no_grad():
        out, old = learner.net(x), learner.old_net(x)
        spatial = pod_spatial_loss(out["fmaps"], old["fmaps"])
        flat = pod_flat_loss(out["features"], old["features"])
        expected = nca_loss(out["logits"], y, 0.6, 1.0) + learner.factor * (5.0 * spatial + 2.0 * flat)
        assert float(learner.loss(x, y)) == pytest.approx(float(expected), rel=1e-5)
    learner.begin_task(make_task(2, 5, 7))
    assert learner.factor == pytest.approx(math.sqrt(7 / 2))
    fixed = make_learner(adaptive_factor=False)
    fixed.begin_task(make_task(0, 0, 2))
    fixed.begin_task(make_task(1, 2, 5))
    assert fixed.factor == 1.0


def test_lsc_head_has_nb_proxy_proxies_per_class_and_grows_with_tasks():
    learner = make_learner(nb_proxy=3)
    learner.begin_task(make_task(0, 0, 2))
    head = learner.net.head
    assert head.proxies.shape == (2 * 3, 64)
    first = head.proxies.detach().clone()
    learner.begin_task(make_task(1, 2, 5))
    assert head.proxies.shape == (5 * 3, 64) and len(head.blocks) == 2
    assert torch.equal(head.proxies[:6], first)  # growing keeps the old classes' proxies
    x = torch.randn(4, 3, 16, 16)
    out = learner.net.eval()(x)
    assert out["logits"].shape == (4, 5)
    cos = F.normalize(out["features"], dim=1) @ F.normalize(head.proxies, dim=1).t()
    sims = cos[:, 3 * 3 : 4 * 3]  # class 3's proxies
    assert torch.allclose(out["logits"][:, 3], head.eta * (sims.softmax(1) * sims).sum(1), atol=1e-6)
    assert torch.allclose(learner.predict(x), out["logits"])


def test_nca_margin_applies_to_the_true_class_and_hinges_at_zero():
    logits = torch.tensor([[0.5, 0.4, 0.3]])
    y = torch.tensor([0])
    assert float(nca_loss(logits, y, 0.6, 1.0)) > float(nca_loss(logits, y, 0.0, 1.0))
    assert float(nca_loss(logits * 10, y, 0.6, 1.0)) == 0.0  # margin met by far: no loss
    assert float(nca_loss(torch.tensor([[0.0, 1.0, 1.0]]), y, 0.0, 1.0)) == pytest.approx(1 + math.log(2))


def test_old_proxies_fixed_while_learning_then_balanced_finetuning_moves_only_the_head():
    learner = make_learner(memory_size=8, nb_proxy=2, ft_epochs=2, ft_lr=0.05)
    trainer = Trainer(torch.device("cpu"), seed=0)
    first = make_task(0, 0, 2)
    learn(learner, first, trainer)
    task = make_task(1, 2, 4)
    learner.begin_task(task)
    old_block = learner.net.head.blocks[0].detach().clone()
    backbone0 = copy.deepcopy(learner.net.backbone.state_dict())
    seen = {}
    finetune = learner.finetune_classifier

    def spy(task_, fit):
        seen["backbone"] = copy.deepcopy(learner.net.backbone.state_dict())
        seen["head"] = copy.deepcopy(learner.net.head.state_dict())
        seen["counts"] = torch.bincount(learner.memory.tensors()[1]).tolist()
        finetune(task_, fit)

    learner.finetune_classifier = spy
    learner.learn_task(task, trainer.fit)
    learner.end_task(task, trainer.fit)  # the memory update, then the balanced fine-tuning on it
    assert torch.equal(seen["head"]["blocks.0"], old_block)  # old proxies untouched by the task's training
    assert not torch.equal(seen["backbone"]["stem.0.weight"], backbone0["stem.0.weight"])
    assert seen["counts"] == [2, 2, 2, 2]  # the fine-tuning set is class-balanced
    after = learner.net.backbone.state_dict()
    assert all(torch.equal(after[k], v) for k, v in seen["backbone"].items())  # weights and BN statistics
    assert not torch.equal(learner.net.head.blocks[0], seen["head"]["blocks.0"])
    assert not torch.equal(learner.net.head.blocks[1], seen["head"]["blocks.1"])


def test_keeps_more_old_classes_than_finetuning(run_finetune):
    # A cosine classifier starting at eta = 1 needs more steps than a linear head, and more again from PyCIL's
    # He-initialised convolutions (a smaller effective step than PyTorch's default init): 50 epochs (100 steps
    # at the first task's batch of 128); the fine-tuning values come from the paper's Table 4 sets.
    finetune = run_finetune(epochs=50)
    out = run_small("podnet", {"ft_epochs": 50, "ft_lr": 0.01}, epochs=50)
    assert_keeps_more_old_classes(out, finetune)


def test_search_space_loads_and_original_preset_builds():
    space = load_space("podnet")
    own = {"lambda_c", "lambda_f", "nb_proxy", "ft_epochs", "ft_lr", "adaptive_factor"}
    assert set(space.space.sets) >= own
    assert space.space.sets["nb_proxy"] == (10, 20, 30, 50, 100)
    params = ALGORITHMS.get("podnet").Params.from_mapping(space.presets["original"])
    assert (params.epochs, params.scheduler, params.weight_decay) == (160, "cosine", 0.0005)
    assert (params.lambda_c, params.lambda_f, params.nb_proxy) == (5, 1.0, 10)
    assert (params.ft_epochs, params.ft_lr, params.adaptive_factor) == (20, 0.005, True)
    assert (params.nca_margin, params.nca_scale) == (0.6, 1.0)
