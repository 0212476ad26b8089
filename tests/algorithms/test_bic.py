"""BiC: the bias layer corrects only the new classes' logits, is fitted on a held-out split, and BiC
keeps more of the old classes than fine-tuning with no memory."""
from types import SimpleNamespace

import pytest
import torch

from gtep.algorithms import ALGORITHMS
from gtep.algorithms.bic import holdout_mask
from gtep.engine import runner
from gtep.spaces import load_space
from tests.algorithms.support import assert_keeps_more_old_classes, tiny_learner, tiny_task
from tests.helpers import load, run_small


@pytest.fixture(scope="module")
def bic_run():
    """One run_small of BiC through the real runner, keeping the learner and every fit() it made."""
    record = SimpleNamespace(learner=None, fits=[], tasks=[])

    class Spy(ALGORITHMS.get("bic")):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            record.learner = self

        def fit_task(self, task, fit):
            record.tasks.append((task.known, task.total, len(self.memory)))

            def spy_fit(parameters, loss_fn, x, y, recipe, **kwargs):
                parameters = list(parameters)
                record.fits.append(SimpleNamespace(n_params=len(parameters), x_shape=tuple(x.shape),
                                                   y=y.clone(), recipe=recipe,
                                                   augment=kwargs.get("augment", True)))
                fit(parameters, loss_fn, x, y, recipe, **kwargs)

            super().fit_task(task, spy_fit)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(runner, "ALGORITHMS", SimpleNamespace(get=lambda name: Spy))
        out = run_small("bic")
    return out, record


def test_bias_layer_changes_only_new_class_logits(bic_run):
    out, record = bic_run
    learner = record.learner
    alphas_betas = learner.bias_parameters()
    assert len(alphas_betas) == 3
    assert alphas_betas[0] == (1.0, 0.0)  # the first task is never corrected
    for alpha, beta in alphas_betas[1:]:  # every later task's layer was fitted
        assert abs(alpha - 1) + abs(beta) > 1e-3
    data = load()
    x = torch.from_numpy(data.x_test[:64]).permute(0, 3, 1, 2).float().div(255)
    learner.net.eval()
    with torch.no_grad():
        res = learner.net(x)
        corrected, raw = res["logits"], res["raw_logits"]
        old = record.tasks[2][0]  # classes before the last task
        assert torch.equal(corrected[:, :4], raw[:, :4])  # first task's classes untouched
        # last task's classes follow alpha * z + beta exactly; earlier corrected tasks keep their own layer
        alpha, beta = alphas_betas[2]
        assert torch.allclose(corrected[:, old:], alpha * raw[:, old:] + beta, atol=1e-5)
        assert not torch.allclose(corrected[:, old:], raw[:, old:])
        # switching the last layer off changes the last task's logits only
        layer = learner.net.bias_layers[-1]
        saved = layer.alpha.data.clone(), layer.beta.data.clone()
        layer.alpha.data.fill_(1.0), layer.beta.data.fill_(0.0)
        without = learner.net(x)["logits"]
        layer.alpha.data.copy_(saved[0]), layer.beta.data.copy_(saved[1])
        assert torch.equal(without[:, :old], corrected[:, :old])
        assert torch.equal(learner.predict(x), corrected)  # the corrected logits are what is evaluated
    assert out.status == "finished"


def test_bias_correction_fits_two_parameters_on_a_balanced_held_out_split(bic_run):
    _, record = bic_run
    first, stage1, stage2 = record.fits[0], record.fits[1], record.fits[2]
    assert len(record.fits) == 5  # task 1: one stage; tasks 2 and 3: training + bias correction
    assert first.n_params > 2 and stage1.n_params == first.n_params
    assert stage2.n_params == 2 and stage2.augment is False and len(stage2.x_shape) == 2  # logits, not images
    known, total, _ = record.tasks[1]
    # memory 40 over 4 old classes = 10 exemplars each; split_ratio 0.1 -> 1 held out per class, old and new
    assert torch.bincount(stage2.y, minlength=total).tolist() == [1] * total
    assert len(stage1.y) + len(stage2.y) == 3 * 40 + 40  # nothing lost, nothing trained on twice
    assert stage2.recipe.epochs == 170  # PyCIL's fixed bias-correction epochs (run_small has epoch scale 1)


def test_holdout_takes_the_same_count_from_every_class():
    torch.manual_seed(0)
    y = torch.tensor([0] * 10 + [1] * 3 + [2] * 7)[torch.randperm(20)]
    mask = holdout_mask(y, 4)
    assert torch.bincount(y[mask]).tolist() == [4, 3, 4]


def test_keeps_more_old_classes_than_finetuning(bic_run, finetune):
    out, _ = bic_run
    assert_keeps_more_old_classes(out, finetune)


def test_search_space_and_original_preset():
    space = load_space("bic")
    assert set(space.space.sets) >= {"T", "lambda_kd", "split_ratio", "epochs", "lr", "batch_size"}
    params = ALGORITHMS.get("bic").Params.from_mapping(space.presets["original"])
    assert (params.epochs, params.T, params.lambda_kd, params.split_ratio) == (170, 2, 0, 0.1)
    assert params.milestones == (60, 100, 140) and params.bias_epochs == 170


def test_pycils_bias_stage_trains_only_the_layer_on_images_in_train_mode():
    """bias_stage "pycil" (an ablation for benchmarks/reference_compare.py): stage 2 sees augmented images with
    the network in train mode, so the BatchNorm statistics follow the split while every weight but (alpha, beta)
    stays, and everything trains again in the next task's stage 1."""

    learner, trainer = tiny_learner("bic", bias_epochs=2, bias_stage="pycil", augment=True)
    for index in range(2):
        task = tiny_task(index, 2 * index, 2 * index + 2, per_class=8)
        learner.begin_task(task)
        if index == 1:
            stage2 = []
            learner.correct_bias_as_pycil = lambda *a, f=learner.correct_bias_as_pycil: (
                stage2.append({k: v.clone() for k, v in learner.net.state_dict().items()}), f(*a),
                stage2.append({k: v.clone() for k, v in learner.net.state_dict().items()}))
        learner.learn_task(task, trainer.fit)
        learner.end_task(task, trainer.fit)
    before, after = stage2
    moved = {k for k in before if not torch.equal(before[k], after[k])}
    assert {"bias_layers.1.alpha", "bias_layers.1.beta"} <= moved
    assert moved - {"bias_layers.1.alpha", "bias_layers.1.beta"}, "BatchNorm statistics followed the split"
    assert all(k.endswith(("running_mean", "running_var", "num_batches_tracked")) for k in moved
               if not k.startswith("bias_layers")), "no weight but the layer's trained"
    assert all(p.requires_grad for n, p in learner.net.named_parameters() if not n.startswith("bias_layers"))
