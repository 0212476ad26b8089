"""The IIRC paper's own baselines (papers/iirc.txt section 5, appendix B): ER-infinite, A-GEM and LUCIR, each
shown doing what its paper claims, on the tiny synthetic hierarchy of test_iirc_learners.py (three superclasses,
two subclasses each, tasks: the superclasses, then the first subclass of each, then the second; incomplete
training labels). BiC is not here: the IIRC paper lists it and its learning rate but reports no result for it."""
from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
import torch.nn.functional as F

from gtep.algorithms import ALGORITHMS
from gtep.algorithms.iirc.agem import IIRCAGEM, flat_gradient, project
from gtep.algorithms.iirc.er_infinite import UnboundedMemory
from gtep.algorithms.iirc.lucir import IIRCLUCIR, LessForgetCosineHead, margin_ranking
from gtep.engine.loop import Trainer
from gtep.spaces import load_space
from tests.algorithms.test_iirc_learners import CPU, SUPERS, TASKS, hierarchy_data, make, task_data, trained

BASELINES = ["iirc_er_infinite", "iirc_agem", "iirc_lucir"]


def run_task(learner, index: int, trainer: Trainer | None = None) -> None:
    """One task as the engine drives it; without a trainer, no training (the memory update alone)."""
    task = task_data(index, learner.complete_history)
    learner.begin_task(task)
    if trainer is not None:
        learner.learn_task(task, trainer.fit)
    learner.end_task(task, (trainer or Trainer(CPU, 0, augment=False)).fit)


@pytest.mark.parametrize("name", BASELINES)
def test_each_baseline_is_registered_with_its_papers_preset_and_learns_multi_hot_labels(name):
    algorithm = ALGORITHMS.get(name)
    assert algorithm.data_flows == frozenset({"multi_label"}) and not algorithm.complete_history
    space = load_space(name)
    algorithm.Params.from_mapping(space.presets["original"])
    assert set(space.space.names) <= set(algorithm.Params.tunable())
    learner, tasks, logits = trained(name)
    for task, out in zip(tasks, logits):
        assert out.shape == (len(hierarchy_data()["test_x"]), task.total) and torch.isfinite(out).all()
    assert len(learner.label_memory) > 0 and learner.predict_labels(hierarchy_data()["test_x"]).any()


def test_the_papers_values_are_the_original_presets():
    assert load_space("iirc_lucir").presets["original"]["lambda_base"] == 5  # IIRC appendix A
    assert load_space("iirc_lucir").presets["original"]["margin"] == 0.5
    assert load_space("iirc_agem").presets["original"]["memory_batch_size"] == 128


# ---- ER-infinite ----------------------------------------------------------------------------------------------
def test_er_infinite_keeps_every_sample_it_was_given_with_the_labels_it_had():
    learner = make("iirc_er_infinite", memory_size=4)
    learner.keep_per_label(2)  # neither budget applies: the buffer is infinite
    assert isinstance(learner.label_memory, UnboundedMemory)
    given = 0
    for index in range(len(TASKS)):
        run_task(learner, index)
        given += len(task_data(index, False).x)
        assert len(learner.label_memory) == given  # grows by every sample of every task, none dropped
    d = hierarchy_data()
    mx, my = learner.label_memory.tensors(9)
    assert torch.equal(my.sum(1), torch.ones(len(my)))  # one label each, as the task gave it
    # a sample the superclass task showed and a subclass task showed again is kept twice, once per label: the
    # superclass copy still says "not this subclass" (stale), where the joint bound would relabel it
    sub = 0
    shared = set(d["assignment"][SUPERS + sub]) & set(d["assignment"][0])
    assert shared
    sample = d["train_x"][min(shared)]
    rows = my[(mx - sample).abs().flatten(1).sum(1) == 0]
    assert len(rows) == 2
    assert {tuple(torch.nonzero(r).flatten().tolist()) for r in rows} == {(0,), (SUPERS + sub,)}


def test_er_infinite_trains_on_all_of_it():
    learner, tasks, _ = trained("iirc_er_infinite")
    x, y = learner.training_data(tasks[-1])
    # after the last task the memory holds all three tasks' samples; a task trains on itself plus all of it
    assert len(learner.label_memory) == sum(len(t.x) for t in tasks)
    assert len(x) == len(tasks[-1].x) + len(learner.label_memory) and y.shape == (len(x), 9)


# ---- A-GEM -----------------------------------------------------------------------------------------------------
def test_the_projection_removes_exactly_the_conflicting_part():
    g_ref = torch.tensor([1.0, 0.0, 2.0])
    conflicting = torch.tensor([-3.0, 1.0, 0.0])
    projected = project(conflicting, g_ref)
    assert torch.dot(projected, g_ref).abs() < 1e-6
    assert torch.allclose(projected, conflicting - (-3.0 / 5.0) * g_ref)
    agreeing = torch.tensor([1.0, 5.0, 0.0])
    assert torch.equal(project(agreeing, g_ref), agreeing)


def test_agem_steps_never_increase_the_memory_loss_to_first_order():
    """Each step's gradient has a non-negative dot product with the memory loss's gradient, on batches where the
    unprojected gradient would increase it (there are some: otherwise this test could not fail)."""
    learner, tasks, _ = trained("iirc_agem")
    learner = copy.deepcopy(learner)
    assert isinstance(learner, IIRCAGEM) and learner.replay is None
    # the whole memory as the reference batch: the same batch in loss() and below
    learner.params = dataclasses.replace(learner.params, memory_batch_size=10_000)
    mx, my = learner.label_memory.tensors(learner.total)
    learner.replay = (mx, my[:, : learner.known])
    learner.net.train()
    params = [p for p in learner.trainable_parameters() if p.requires_grad]
    task = tasks[-1]
    x, y = learner.training_data(task)
    assert len(x) == len(task.x)  # A-GEM does not train on the memory
    conflicts = 0
    for start in range(0, len(x), 16):
        xb, yb = x[start : start + 16], y[start : start + 16]
        raw_loss = F.binary_cross_entropy_with_logits(learner.net(xb)["logits"][:, learner.known :],
                                                      yb[:, learner.known :])
        raw = flat_gradient(raw_loss, params)
        g_ref = flat_gradient(learner.memory_loss(), params)
        loss = learner.loss(xb, yb)
        assert torch.isclose(loss, raw_loss)  # the value is the batch loss
        step = flat_gradient(loss, params)
        scale = float(step.norm() * g_ref.norm())
        assert float(torch.dot(step, g_ref)) >= -1e-4 * scale
        if torch.dot(raw, g_ref) < 0:
            conflicts += 1
            assert float(torch.dot(step, g_ref)) < 1e-3 * scale  # projected onto the plane, not beyond it
            assert not torch.allclose(step, raw)
        else:
            assert torch.allclose(step, raw, atol=1e-6)
    assert conflicts > 0


# ---- LUCIR -----------------------------------------------------------------------------------------------------
def test_margin_ranking_ranks_each_old_label_of_a_memory_sample_above_the_hardest_new_labels():
    cosines = torch.tensor([[0.9, 0.1, 0.8, 0.2],    # a memory sample with old label 0
                            [0.0, 0.0, 0.9, 0.9]], requires_grad=True)  # a task sample: new labels only
    y = torch.tensor([[1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0]])
    loss = margin_ranking(cosines, y, known=2, k=2, margin=0.5)
    # max(0, 0.5 - 0.9 + 0.8) and max(0, 0.5 - 0.9 + 0.2), averaged
    assert torch.isclose(loss, torch.tensor(0.2))
    loss.backward()
    grad = cosines.grad
    assert grad is not None and grad[0, 0] < 0 and grad[0, 2] > 0  # raise the true old label, lower the hard one
    assert grad[0, 3] == 0 and (grad[1] == 0).all() and grad[0, 1] == 0  # nothing else is ranked
    assert margin_ranking(cosines[1:], y[1:], known=2, k=2, margin=0.5) == 0  # no memory sample, no term


def lucir_after_first_task() -> IIRCLUCIR:
    learner = make("iirc_lucir")
    assert isinstance(learner, IIRCLUCIR)
    torch.manual_seed(1)
    run_task(learner, 0, Trainer(CPU, 0, augment=False))
    return learner


def test_lucir_imprints_new_rows_and_keeps_old_rows_fixed():
    learner = lucir_after_first_task()
    head = learner.net.head
    assert isinstance(head, LessForgetCosineHead)
    task = task_data(1, False)
    learner.begin_task(task)
    old_rows = head.old.detach().clone()
    assert old_rows.shape[0] == 3 and not head.old.requires_grad and head.new.shape[0] == 3
    learner.imprint(task)
    learner.net.eval()
    features = F.normalize(learner.features(task.x), dim=1)
    for j in range(3):
        mean = F.normalize(features[task.y[:, 3 + j] > 0.5].mean(0), dim=0)
        assert F.cosine_similarity(head.new[j], mean, dim=0) > 0.999
        assert torch.isclose(head.new[j].norm(), old_rows.norm(dim=1).mean())
    learner.learn_task(task, Trainer(CPU, 0, augment=False).fit)
    assert torch.equal(head.old, old_rows)  # the old labels' embeddings did not move


def old_feature_similarity(learner, reference) -> float:
    """Mean cosine between the learner's features and the reference network's on every test image (all carry a
    first-task superclass: the old classes)."""
    x = hierarchy_data()["test_x"]
    learner.net.eval()
    reference.eval()
    with torch.no_grad():
        return float(F.cosine_similarity(learner.net(x)["features"], reference(x)["features"], dim=1).mean())


def test_lucirs_less_forget_distillation_keeps_old_class_features_closer_than_finetuning():
    first = lucir_after_first_task()
    reference = copy.deepcopy(first.net)
    results = {}
    for name, lambda_base in (("lucir", 5.0), ("finetune", 0.0)):  # finetune: the same learner, no distillation
        learner = copy.deepcopy(first)
        learner.params = dataclasses.replace(learner.params, lambda_base=lambda_base)
        torch.manual_seed(2)
        trainer = Trainer(CPU, 1, augment=False)
        for index in (1, 2):
            run_task(learner, index, trainer)
        results[name] = old_feature_similarity(learner, reference)
    assert results["lucir"] > results["finetune"] + 0.05, results
