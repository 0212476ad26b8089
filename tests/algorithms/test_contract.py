"""The learner contract of gtep/algorithms/base.py, checked against every registered ResNet method (as Optuna
runs its sampler tests against every sampler): the engine's steps do the bookkeeping whatever a method
overrides, and a method cannot replace the steps themselves."""
from __future__ import annotations

import pytest
import torch

from gtep.algorithms import ALGORITHMS, CommonParams, IncrementalLearner
from gtep.algorithms.base import ENGINE_STEPS
from gtep.engine.loop import Trainer
from tests.helpers import learn, make_task

CPU = torch.device("cpu")
RESNET_METHODS = [n for n in ALGORITHMS.names()
                  if not ALGORITHMS.get(n).uses_pretrained and "class_incremental" in ALGORITHMS.get(n).data_flows]
# The methods' own stages, short (their defaults run 20-170 epochs).
QUICK = {"bic": {"bias_epochs": 1}, "podnet": {"ft_epochs": 1}, "foster": {"compression_epochs": 1},
         "beef": {"fusion_epochs": 1}}


def make_learner(name: str, memory_size: int = 12) -> IncrementalLearner:
    algorithm = ALGORITHMS.get(name)
    torch.manual_seed(0)
    return algorithm(algorithm.Params.from_mapping(QUICK.get(name, {})), "resnet8", memory_size, CPU)


@pytest.mark.parametrize("name", RESNET_METHODS)
def test_every_method_gets_the_bookkeeping_of_every_task(name):
    learner, trainer = make_learner(name), Trainer(CPU, 0)
    for task in (make_task(0, 0, 2, per_class=6), make_task(1, 2, 4, per_class=6)):
        learn(learner, task, trainer)
        assert (learner.known, learner.total) == (task.known, task.total)
        assert all(p.device == CPU for p in learner.net.parameters())
        learner.net.eval()
        with torch.no_grad():
            assert learner.predict(task.x).shape == (len(task.x), task.total)
        # the memory update after the task: a quota of exemplars for every seen class, or nothing at all
        _, stored = learner.memory.tensors()
        quota = learner.memory.per_class(task.total) if learner.uses_memory else 0
        assert torch.bincount(stored, minlength=task.total).tolist() == [quota] * task.total, name
        assert (learner.old_net is not None) == (learner.distills and task.known > 0)


@pytest.mark.parametrize("step", ENGINE_STEPS)
def test_a_method_cannot_replace_an_engine_step(step):
    def replaced(self, *args):
        pass

    with pytest.raises(TypeError, match=step):
        type("Forgetful", (IncrementalLearner,), {step: replaced})


def test_params_come_from_the_generic_argument():
    from dataclasses import dataclass

    @dataclass(frozen=True)
    class MyParams(CommonParams):
        strength: float = 1.0

    class Mine(IncrementalLearner[MyParams]):
        pass

    class Sub(Mine):
        pass

    assert Mine.Params is MyParams and Sub.Params is MyParams
    learner = Mine(MyParams(strength=2.0), "resnet8", 0, CPU)
    assert learner.params.strength == 2.0
    with pytest.raises(TypeError, match="MyParams"):
        class Mixed(IncrementalLearner[MyParams]):
            Params = CommonParams


def test_distillation_without_the_old_network_is_refused():
    learner = make_learner("replay")
    learner.begin_task(make_task(0, 0, 2))
    with pytest.raises(TypeError, match="distills"):
        learner.distilled_cross_entropy(torch.zeros(2, 3, 16, 16), torch.tensor([0, 1]), 2.0, 0.0)


def test_hooks_run_in_the_documented_order():
    calls = []

    class Recording(ALGORITHMS.get("replay")):
        def grow(self, task):
            calls.append(("grow", self.known, self.total))
            super().grow(task)

        def fit_task(self, task, fit):
            calls.append(("fit_task", len(self.memory)))
            super().fit_task(task, fit)

        def consolidate(self, task, fit):
            calls.append(("consolidate", len(self.memory)))

    learner = Recording(CommonParams(), "resnet8", 8, CPU)
    trainer = Trainer(CPU, 0)
    learn(learner, make_task(0, 0, 2, per_class=4), trainer)
    learn(learner, make_task(1, 2, 4, per_class=4), trainer)
    # known/total are set before grow; fit_task sees the old memory, consolidate the updated one
    assert calls == [("grow", 0, 2), ("fit_task", 0), ("consolidate", 8),
                     ("grow", 2, 4), ("fit_task", 8), ("consolidate", 8)]
