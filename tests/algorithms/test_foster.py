"""FOSTER: boosting trains a second backbone beside the frozen old one, compression brings the model back to
one backbone, and the result keeps more of the old classes than fine-tuning."""
import torch

from gtep.algorithms import ALGORITHMS
from gtep.algorithms.base import parameter_count
from gtep.algorithms.foster import class_balance_weights
from gtep.models import create_backbone
from gtep.spaces import load_space
from tests.algorithms.support import (
    assert_keeps_more_old_classes,
    begin_second_task_beside_a_frozen_copy,
    tiny_learner,
)
from tests.helpers import run_small, snapshot, unchanged

QUICK = {"epochs": 6}  # small batches give the short compression stage enough steps
HPARAMS = {"batch_size": 16, "compression_epochs": 10}


def test_boosting_has_two_backbones_and_compression_leaves_one():
    learner, trainer = tiny_learner("foster", compression_epochs=2)
    calls = []

    def fit(parameters, loss_fn, x, y, recipe, **kw):
        calls.append((len(learner.net.stack.backbones), recipe))
        trainer.fit(parameters, loss_fn, x, y, recipe, **kw)

    second, old, new = begin_second_task_beside_a_frozen_copy(learner, fit)
    teacher = learner.net
    before = snapshot(old)
    learner.learn_task(second, fit)

    boost, compress = calls[1:]
    assert boost[0] == 2  # the boosting fit trains the two-backbone model
    assert compress[1].epochs == 2 and compress[1].weight_decay == 0.0
    assert unchanged(old, before)  # weights and BatchNorm statistics of the old backbone untouched
    assert not unchanged(new, before)  # the new one learnt
    student = learner.net
    assert student is not teacher and len(student.stack.backbones) == 1
    d = student.stack.out_dim
    one_backbone = parameter_count(create_backbone("resnet8"))
    assert learner.parameter_counts() == (one_backbone + 4 * (d + 1),) * 2
    assert parameter_count(teacher) > 2 * one_backbone


def test_class_balance_weights_favour_rare_classes():
    y = torch.tensor([0] * 2 + [1] * 2 + [2] * 20)
    w = class_balance_weights(y, 3, 0.97)
    assert torch.isclose(w.sum(), torch.tensor(3.0))
    assert w[0] == w[1] > w[2]


def test_keeps_more_old_classes_than_finetuning(run_finetune):
    finetune, out = run_finetune({"batch_size": 16}, **QUICK), run_small("foster", HPARAMS, **QUICK)
    assert_keeps_more_old_classes(out, finetune, first_task=None)
    assert out.params_total == finetune.params_total  # one backbone and the head, like plain fine-tuning


def test_search_space_and_original_preset():
    space = load_space("foster")
    assert {"T", "lambda_kd", "lambda_fe", "beta1", "beta2", "compression_epochs"} <= set(space.space.names)
    params = ALGORITHMS.get("foster").Params.from_mapping(space.presets["original"])
    assert (params.epochs, params.compression_epochs, params.beta1, params.beta2) == (170, 130, 0.96, 0.97)
