"""FOSTER: boosting trains a second backbone beside the frozen old one, compression brings the model back to
one backbone, and the result keeps more of the old classes than fine-tuning."""
import pytest
import torch

from gtep.algorithms import ALGORITHMS, FitRecipe, TaskData
from gtep.algorithms.base import parameter_count
from gtep.algorithms.foster import class_balance_weights
from gtep.engine.loop import Trainer
from gtep.models import create_backbone
from gtep.spaces import load_space
from tests.helpers import run_small

QUICK = {"epochs": 6}  # small batches give the short compression stage enough steps
HPARAMS = {"batch_size": 16, "compression_epochs": 10}


def tiny_task(index: int, known: int, total: int, per_class: int = 6) -> TaskData:
    g = torch.Generator().manual_seed(index)
    y = torch.arange(known, total).repeat_interleave(per_class)
    recipe = FitRecipe(epochs=1, lr=0.01, batch_size=8, weight_decay=5e-4, scheduler="constant",
                       milestones=(), lr_decay=0.1)
    return TaskData(index, known, total, torch.randn(len(y), 3, 32, 32, generator=g), y, recipe)


def snapshot(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in module.state_dict().items()}


def same_state(module: torch.nn.Module, state: dict[str, torch.Tensor]) -> bool:
    return all(torch.equal(v, state[k]) for k, v in module.state_dict().items())


def test_boosting_has_two_backbones_and_compression_leaves_one():
    params = ALGORITHMS.get("foster").Params(compression_epochs=2)
    learner = ALGORITHMS.get("foster")(params, "resnet8", 8, torch.device("cpu"))
    trainer = Trainer(torch.device("cpu"), seed=0, augment=False)
    calls = []

    def fit(parameters, loss_fn, x, y, recipe, **kw):
        calls.append((len(learner.net.stack.backbones), recipe))
        trainer.fit(parameters, loss_fn, x, y, recipe, **kw)

    first = tiny_task(0, 0, 2)
    learner.begin_task(first), learner.learn_task(first, fit), learner.end_task(first, fit)
    second = tiny_task(1, 2, 4)
    learner.begin_task(second)
    teacher = learner.net
    old, new = teacher.stack.backbones
    assert not any(p.requires_grad for p in old.parameters())
    assert all(p.requires_grad for p in new.parameters())
    assert same_state(new, snapshot(old))  # the new backbone starts as a copy of the old one
    before = snapshot(old)
    learner.learn_task(second, fit)

    boost, compress = calls[1:]
    assert boost[0] == 2  # the boosting fit trains the two-backbone model
    assert compress[1].epochs == 2 and compress[1].weight_decay == 0.0
    assert same_state(old, before)  # weights and BatchNorm statistics of the old backbone untouched
    assert not same_state(new, before)  # the new one learnt
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


@pytest.fixture(scope="module")
def finetune():
    return run_small("finetune", {"batch_size": 16}, **QUICK)


def test_keeps_more_old_classes_than_finetuning(finetune):
    out = run_small("foster", HPARAMS, **QUICK)
    assert out.status == "finished"
    assert out.metrics["old_acc"] > finetune.metrics["old_acc"] + 0.3
    assert out.metrics["acc"] > finetune.metrics["acc"]
    assert out.params_total == finetune.params_total  # one backbone and the head, like plain fine-tuning


def test_search_space_and_original_preset():
    space = load_space("foster")
    assert {"T", "lambda_kd", "lambda_fe", "beta1", "beta2", "compression_epochs"} <= set(space.space.names)
    params = ALGORITHMS.get("foster").Params.from_mapping(space.presets["original"])
    assert (params.epochs, params.compression_epochs, params.beta1, params.beta2) == (170, 130, 0.96, 0.97)
