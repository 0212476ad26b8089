"""WA: after each incremental task the new classes' head rows are rescaled to the old rows' mean norm,
and WA keeps more of the old classes than fine-tuning with no memory."""
from types import SimpleNamespace

import pytest
import torch

from gtep.algorithms import ALGORITHMS
from gtep.engine import runner
from gtep.models.heads import LinearHead, align_weights
from gtep.spaces import load_space
from tests.algorithms.support import assert_keeps_more_old_classes
from tests.helpers import run_small


@pytest.fixture(scope="module")
def wa_run():
    """One run_small of WA (at the original lr 0.1) through the real runner, with the head around the
    consolidate hook, where WA aligns the weights after each task."""
    heads = []

    class Spy(ALGORITHMS.get("wa")):
        def consolidate(self, task, fit):
            before = (self.net.head.weight.detach().clone(), self.net.head.bias.detach().clone())
            super().consolidate(task, fit)
            after = (self.net.head.weight.detach().clone(), self.net.head.bias.detach().clone())
            heads.append((task.known, before, after))

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(runner, "ALGORITHMS", SimpleNamespace(get=lambda name: Spy))
        out = run_small("wa", {"lr": 0.1})
    return out, heads


def mean_norms(weight, known):
    norms = weight.norm(dim=1)
    return norms[:known].mean().item(), norms[known:].mean().item()


def test_end_task_aligns_new_row_norms_to_old(wa_run):
    _, heads = wa_run
    assert len(heads) == 3
    known, before, after = heads[0]
    assert known == 0 and torch.equal(before[0], after[0])  # nothing to align on the first task
    gaps = []
    for known, (w0, b0), (w1, b1) in heads[1:]:
        old0, new0 = mean_norms(w0, known)
        old1, new1 = mean_norms(w1, known)
        gaps.append(abs(old0 - new0) / old0)
        assert old1 == pytest.approx(new1, rel=1e-5)  # aligning made them equal
        assert torch.equal(w1[:known], w0[:known]) and torch.equal(b1, b0)  # old rows and biases untouched
        gamma = old0 / new0
        assert torch.allclose(w1[known:], w0[known:] * gamma, rtol=1e-5)  # one common factor for new rows
    assert max(gaps) > 0.02  # training left the norms unequal, so aligning had something to do


def test_align_weights_uses_the_ratio_of_mean_norms():
    head = LinearHead(2, 4)
    with torch.no_grad():
        head.weight.copy_(torch.tensor([[3.0, 4.0], [0.0, 1.0], [0.0, 6.0], [8.0, 6.0]]))
    gamma = align_weights(head, known=2)
    assert gamma.item() == pytest.approx(3 / 8)  # mean old norm (5 + 1) / 2 over mean new (6 + 10) / 2
    assert torch.allclose(head.weight[2:], torch.tensor([[0.0, 2.25], [3.0, 2.25]]))


def test_keeps_more_old_classes_than_finetuning(wa_run, finetune):
    out, _ = wa_run
    assert_keeps_more_old_classes(out, finetune)


def test_search_space_and_original_preset():
    space = load_space("wa")
    assert set(space.space.sets) >= {"T", "lambda_kd", "epochs", "lr", "batch_size", "weight_decay"}
    params = ALGORITHMS.get("wa").Params.from_mapping(space.presets["original"])
    assert (params.epochs, params.milestone_num, params.T, params.lambda_kd) == (170, 3, 2, 0)
    assert params.milestones == (60, 100, 140)
