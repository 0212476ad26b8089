"""MEMO shares the generalized blocks, adds one specialized block (the last stage) per task with the old ones
frozen and untouched, trains an auxiliary head, herds exemplars in batches of exemplar_batch_size, costs fewer
parameters than DER, and keeps old classes better than fine-tuning."""
import torch

from gtep.algorithms import ALGORITHMS
from gtep.engine.loop import Trainer
from gtep.models import create_backbone
from gtep.spaces import load_space
from tests.algorithms.support import assert_keeps_more_old_classes
from tests.helpers import learn, make_task, run_small, snapshot, unchanged

CPU = torch.device("cpu")


def numel(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def memo(**params):
    torch.manual_seed(0)
    return ALGORITHMS.get("memo")(ALGORITHMS.get("memo").Params(**params), "resnet8", 24, CPU)


def test_grows_one_frozen_specialized_block_per_task():
    learner, trainer = memo(), Trainer(CPU, seed=0)
    net = learner.net
    learn(learner, make_task(0, 0, 4), trainer)
    assert len(net.extractors) == 1
    backbone = learner.new_backbone()
    assert numel(net.trunk) + numel(net.extractors[0]) == numel(backbone)  # the backbone, split in two
    total0, trainable0 = learner.parameter_counts()
    aux0 = numel(net.aux_head)  # 4 new classes + "old"
    block0, trunk0 = snapshot(net.extractors[0]), snapshot(net.trunk)

    task = make_task(1, 4, 7)
    learner.begin_task(task)
    assert len(net.extractors) == 2 and unchanged(net.extractors[1], block0)  # starts as the old block
    assert not any(p.requires_grad for p in net.extractors[0].parameters())
    assert all(p.requires_grad for p in net.trunk.parameters())  # train_base: PyCIL's memo.json default
    assert net.aux_head.out_dim == 3 + 1 and net.head.weight.shape == (7, 2 * net.out_dim)
    total1, trainable1 = learner.parameter_counts()
    head_growth = (7 - 4) * 2 * net.out_dim + 4 * net.out_dim + 3  # new rows, new columns of old rows, biases
    aux_change = numel(net.aux_head) - aux0
    assert total1 - total0 == numel(net.extractors[1]) + head_growth + aux_change  # a block, not a backbone
    assert trainable1 == total1 - numel(net.extractors[0])
    learner.learn_task(task, trainer.fit)
    learner.end_task(task, trainer.fit)
    assert unchanged(net.extractors[0], block0)  # weights and BN statistics untouched
    assert not unchanged(net.extractors[1], block0) and not unchanged(net.trunk, trunk0)
    norms = net.head.weight.detach().norm(dim=1)
    assert torch.isclose(norms[4:].mean(), norms[:4].mean(), rtol=1e-5)  # weight aligning

    learn(learner, make_task(2, 7, 10), trainer)
    assert len(net.extractors) == 3 and learner.parameter_counts()[0] > total1


def test_train_base_false_freezes_generalized_blocks_after_first_task():
    learner, trainer = memo(train_base=False), Trainer(CPU, seed=0)
    net = learner.net
    learn(learner, make_task(0, 0, 4), trainer)
    trunk0, block0 = snapshot(net.trunk), snapshot(net.extractors[0])
    learn(learner, make_task(1, 4, 7), trainer)
    assert not any(p.requires_grad for p in net.trunk.parameters())
    assert unchanged(net.trunk, trunk0) and unchanged(net.extractors[0], block0)
    net.train()
    assert not net.trunk.training and not net.extractors[0].training and net.extractors[1].training
    total, trainable = learner.parameter_counts()
    assert trainable == total - numel(net.trunk) - numel(net.extractors[0])


def test_exemplar_batch_size_is_the_herding_feature_batch():
    learner, trainer = memo(exemplar_batch_size=5), Trainer(CPU, seed=0)
    seen = []
    features = learner.features
    learner.features = lambda x: seen.append(len(x)) or features(x)
    learn(learner, make_task(0, 0, 4), trainer)
    assert seen and max(seen) == 5 and sorted(set(seen)) == [2, 5]  # 12 images per class: 5 + 5 + 2
    assert len(learner.memory) == 24


def test_learns_beats_finetuning_and_is_smaller_than_der(finetune):
    out = run_small("memo")
    assert_keeps_more_old_classes(out, finetune)
    backbone = numel(create_backbone("resnet8"))  # DER would hold three of these after three tasks
    assert finetune.params_total < out.params_total < 3 * backbone


def test_search_space_and_original_preset():
    space = load_space("memo")
    assert space.space.sets["exemplar_batch_size"] == (16, 32, 64, 128, 256)
    assert space.space.sets["lambda_aux"] == (0.5, 1, 1.5, 2, 3)
    params = ALGORITHMS.get("memo").Params.from_mapping(space.presets["original"])
    assert params.epochs == 170 and params.milestones == (80, 120, 150)
    assert params.lambda_aux == 1 and params.exemplar_batch_size == 64 and params.train_base
