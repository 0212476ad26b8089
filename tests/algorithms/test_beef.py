"""BEEF: expansion adds a backbone beside the frozen old ones and trains with a non-zero energy term, fusion
trains only the per-task logit alignments and folds both classifiers into one head; a NaN ends the ordering
as diverged; the result keeps more of the old classes than fine-tuning."""
import pytest
import torch

from gtep.algorithms import ALGORITHMS
from gtep.algorithms.base import parameter_count
from gtep.models import create_backbone
from gtep.spaces import load_space
from tests.algorithms.support import (
    assert_keeps_more_old_classes,
    begin_second_task_beside_a_frozen_copy,
    tiny_learner,
    tiny_task,
)
from tests.helpers import run_small, snapshot, unchanged

QUICK = {"epochs": 6}  # 4 were enough before the CIFAR ResNets took PyCIL's He initialisation
HPARAMS = {"fusion_epochs": 6}


def test_expansion_adds_a_frozen_backbone_and_fusion_folds_the_heads():
    learner, trainer = tiny_learner("beef", fusion_epochs=2)
    params = learner.params
    fits, energies = [], []
    energy_loss = learner.energy_loss
    learner.energy_loss = lambda *a: energies.append(energy_loss(*a)) or energies[-1]

    def fit(parameters, loss_fn, x, y, recipe, **kw):
        parameters = list(parameters)
        fits.append(([p for p in parameters if p.requires_grad], recipe, len(energies)))
        trainer.fit(parameters, loss_fn, x, y, recipe, **kw)

    second, old, _ = begin_second_task_beside_a_frozen_copy(learner, fit)
    net = learner.net
    before, energies[:] = snapshot(old), []
    learner.learn_task(second, fit)

    (_, _, n0), (expand_params, _, n1), (fusion_params, fusion_recipe, n2) = fits
    assert n1 == 0 and n2 > 0 and len(energies) == n2  # the energy term is computed in expansion only
    assert all(torch.isfinite(e) and e > 0 for e in energies)
    assert not any(p is q for p in expand_params for q in old.parameters())
    assert fusion_params == [net.alpha, net.beta] and fusion_recipe.lr == params.fusion_lr
    assert unchanged(old, before)  # the old backbone never moved, BatchNorm statistics included
    assert net.alpha.abs().sum() > 0 and net.beta.abs().sum() > 0  # fusion learnt the alignments

    net.eval()
    with torch.no_grad():
        fused = net(second.x)["logits"]
        learner.end_task(second, fit)
        merged = net(second.x)["logits"]
    assert torch.allclose(fused, merged, atol=1e-5)  # one linear head reproduces the bi-compatible logits
    assert net.new_head is None and net.old_head.weight.shape == (4, 2 * net.stack.out_dim)
    one_backbone = parameter_count(create_backbone("resnet8"))
    assert learner.parameter_counts()[0] == 2 * one_backbone + 4 * (2 * net.stack.out_dim + 1)


@pytest.mark.parametrize("kept", ["all", "first"])
def test_which_frozen_backbones_keep_their_batchnorm_statistics(kept):
    """statistics_kept "first" is PyCIL's BEEFISO (only the first backbone in eval mode): at the third task the
    middle backbone's statistics follow the batches while its weights stay; "all" (the default) keeps both."""
    learner, trainer = tiny_learner("beef", fusion_epochs=1, statistics_kept=kept)
    for index in range(3):
        task = tiny_task(index, 2 * index, 2 * index + 2)
        learner.begin_task(task)
        if index == 2:
            first, middle, _ = learner.net.stack.backbones
            before = snapshot(first), snapshot(middle)
        learner.learn_task(task, trainer.fit)
        learner.end_task(task, trainer.fit)
    assert unchanged(first, before[0])
    weights = {k: v for k, v in before[1].items() if not k.endswith(("running_mean", "running_var",
                                                                     "num_batches_tracked"))}
    assert all(torch.equal(middle.state_dict()[k], v) for k, v in weights.items()), "frozen weights never move"
    assert unchanged(middle, before[1]) == (kept == "all")


@pytest.mark.parametrize("bias", ["kept", "dropped"])
def test_the_old_heads_bias_counts_only_when_kept_and_the_merge_agrees_either_way(bias):
    """old_head_bias "dropped" is PyCIL's BEEFISO forward (no old-head bias while a task is learnt and evaluated)."""
    learner, trainer = tiny_learner("beef", fusion_epochs=1, old_head_bias=bias)
    for index in range(2):
        task = tiny_task(index, 2 * index, 2 * index + 2)
        learner.begin_task(task)
        learner.learn_task(task, trainer.fit)
        net = learner.net
        net.eval()
        with torch.no_grad():
            if index == 1:
                fused = net(task.x)["logits"]
                net.old_head.bias.add_(5.0)
                shifted = net(task.x)["logits"]
                net.old_head.bias.sub_(5.0)
                assert torch.equal(shifted[:, 2:], fused[:, 2:])
                assert torch.allclose(shifted[:, :2], fused[:, :2] + (5.0 if bias == "kept" else 0.0), atol=1e-4)
            learner.end_task(task, trainer.fit)
            if index == 1:
                assert torch.allclose(net(task.x)["logits"], fused, atol=1e-5), "the merged head gives the same logits"


def test_an_unknown_statistics_choice_is_refused(tmp_path):
    from gtep.spaces import SearchSpaceError, validate_values

    with pytest.raises(SearchSpaceError, match=r"statistics_kept='none' is not one of \['all', 'first'\]"):
        validate_values(tmp_path / "space.yaml", "beef", {"statistics_kept": "none"})


def test_nan_loss_ends_the_ordering_as_diverged():
    out = run_small("beef", {"energy_weight": 1e30, "fusion_epochs": 1}, epochs=2)
    assert out.status == "diverged" and "non-finite" in out.message
    assert out.metrics == {}


def test_keeps_more_old_classes_than_finetuning(run_finetune):
    finetune, out = run_finetune(**QUICK), run_small("beef", HPARAMS, **QUICK)
    assert_keeps_more_old_classes(out, finetune, first_task=None)
    assert out.params_total > 2 * finetune.params_total  # one backbone per task, as PyCIL's BEEF-Iso


def test_search_space_and_original_preset():
    space = load_space("beef")
    assert {"fusion_epochs", "energy_weight", "logits_alignment"} <= set(space.space.names)
    params = ALGORITHMS.get("beef").Params.from_mapping(space.presets["original"])
    values = (params.epochs, params.fusion_epochs, params.energy_weight, params.logits_alignment)
    assert values == (170, 60, 0.01, 1.7)


def test_sgld_samples_stay_finite_when_the_model_is_confident():
    """PyCIL's log(sum of energy-class softmax) underflows to log(0) once the real classes dominate by ~100
    logits (seen on the GPU check's ResNet-32: NaN in task 1's first epoch); in log space it stays finite and
    its gradient still points the samples towards the energy classes."""
    learner, _ = tiny_learner("beef", sgld_steps=2)
    task = tiny_task(0, 0, 2)
    learner.begin_task(task)
    real_branch = learner.net.branch

    def confident(features):
        train, energy = real_branch(features)
        return train + 200.0, energy - 200.0  # every energy probability below float32's smallest

    learner.net.branch = confident
    samples = learner.synthesise(task.x[:4])
    assert torch.isfinite(samples).all()
    assert not torch.equal(samples, torch.rot90(task.x[:4], 2, (2, 3)))
