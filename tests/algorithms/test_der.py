"""DER grows one backbone per task, keeps the old ones frozen and untouched, trains an auxiliary
(new classes + "old") head, aligns the new classes' weights, and keeps old classes better than fine-tuning."""
import torch

from gtep.algorithms import ALGORITHMS
from gtep.algorithms.der import auxiliary_targets
from gtep.engine.loop import Trainer
from gtep.spaces import load_space
from tests.algorithms.support import assert_keeps_more_old_classes
from tests.helpers import learn, make_task, run_small, snapshot

CPU = torch.device("cpu")


def numel(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def test_auxiliary_targets_merge_old_classes_into_label_zero():
    y = torch.tensor([0, 3, 4, 5, 6])
    assert auxiliary_targets(y, known=4).tolist() == [0, 0, 1, 2, 3]


def test_grows_one_frozen_backbone_per_task_and_aligns_weights():
    torch.manual_seed(0)
    learner = ALGORITHMS.get("der")(ALGORITHMS.get("der").Params(), "resnet8", 24, CPU)
    trainer, net = Trainer(CPU, seed=0), learner.net
    learn(learner, make_task(0, 0, 4), trainer)
    assert len(net.extractors) == 1
    total0, trainable0 = learner.parameter_counts()
    assert trainable0 == total0
    old_weight, old_bias = net.head.weight.detach().clone(), net.head.bias.detach().clone()
    first = snapshot(net.extractors[0])

    task = make_task(1, 4, 7)
    learner.begin_task(task)
    d = net.out_dim
    assert len(net.extractors) == 2
    assert not any(p.requires_grad for p in net.extractors[0].parameters())
    assert all(p.requires_grad for p in net.extractors[1].parameters())
    new_state = net.extractors[1].state_dict()
    assert all(torch.equal(new_state[k], v) for k, v in first.items())  # starts as the old one
    assert net.head.weight.shape == (7, 2 * d)
    assert torch.equal(net.head.weight[:4, :d], old_weight) and torch.equal(net.head.bias[:4], old_bias)
    assert net.aux_head.out_dim == 3 + 1 and net.aux_head.in_dim == d
    total1, trainable1 = learner.parameter_counts()
    assert total1 > total0 + numel(net.extractors[0]) - 1
    assert trainable1 == total1 - numel(net.extractors[0])

    learner.learn_task(task, trainer.fit)
    learner.end_task(task, trainer.fit)
    after = net.extractors[0].state_dict()
    assert all(torch.equal(after[k], v) for k, v in first.items())  # weights and BN statistics untouched
    assert any(not torch.equal(v, first[k]) for k, v in net.extractors[1].state_dict().items())
    norms = net.head.weight.detach().norm(dim=1)
    assert torch.isclose(norms[4:].mean(), norms[:4].mean(), rtol=1e-5)  # weight aligning
    net.train()
    assert not net.extractors[0].training and net.extractors[1].training

    learn(learner, make_task(2, 7, 10), trainer)
    assert len(net.extractors) == 3 and net.aux_head.out_dim == 3 + 1
    total2, trainable2 = learner.parameter_counts()
    assert total2 > total1 and trainable2 == total2 - numel(net.extractors[0]) - numel(net.extractors[1])
    out = net(make_task(2, 7, 10).x[:5])
    assert out["features"].shape == (5, 3 * d) and out["logits"].shape == (5, 10)


def test_learns_and_beats_finetuning_on_old_classes(finetune):
    out = run_small("der")
    assert_keeps_more_old_classes(out, finetune)
    assert out.params_total > 2.5 * finetune.params_total  # three backbones
    assert out.params_trainable < out.params_total / 2  # only the newest is trainable


def test_search_space_and_original_preset():
    space = load_space("der")
    assert space.space.sets["lambda_aux"] == (0.5, 1, 1.5, 2, 3)
    params = ALGORITHMS.get("der").Params.from_mapping(space.presets["original"])
    assert params.epochs == 170 and params.milestones == (80, 120) and params.lambda_aux == 1
