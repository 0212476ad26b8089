"""Replay and iCaRL learn, and keep more of the old classes than fine-tuning with no memory."""
import numpy as np
import pytest
import torch

from gtep.algorithms.memory import ExemplarMemory, herding_order
from tests.algorithms.support import assert_keeps_more_old_classes
from tests.helpers import run_small


@pytest.mark.parametrize("algorithm", ["replay", "icarl"])
def test_learns_and_beats_finetuning_on_old_classes(algorithm, finetune):
    out = run_small(algorithm)
    assert_keeps_more_old_classes(out, finetune)
    assert out.params_total > 0 and out.params_trainable == out.params_total


def test_finetuning_forgets(finetune):
    assert finetune.metrics["forgetting"] > 0.3
    assert finetune.metrics["old_acc"] < 0.3


def test_same_seed_same_metrics():
    a, b = run_small("icarl", epochs=3), run_small("icarl", epochs=3)
    assert np.array_equal(np.array(a.acc_matrix), np.array(b.acc_matrix), equal_nan=True)


def test_diverged_run_is_reported_not_raised():
    out = run_small("replay", {"lr": 1e6}, epochs=2)
    assert out.status == "diverged"
    assert "non-finite" in out.message


def test_herding_picks_samples_tracking_the_mean():
    torch.manual_seed(0)
    feats = torch.randn(50, 8)
    order = herding_order(feats, 10)
    assert len(set(order.tolist())) == 10
    normed = torch.nn.functional.normalize(feats, dim=1)
    chosen_gap = (normed[order].mean(0) - normed.mean(0)).norm()
    random_gap = (normed[:10].mean(0) - normed.mean(0)).norm()
    assert chosen_gap < random_gap


def test_memory_is_fixed_size_spread_over_seen_classes():
    mem = ExemplarMemory(12)
    ident = lambda x: x.flatten(1)  # noqa: E731
    x, y = torch.randn(40, 2), torch.arange(4).repeat_interleave(10)
    mem.update(x, y, [0, 1], 2, ident)
    assert len(mem) == 12
    mem.update(x, y, [2, 3], 4, ident)
    assert len(mem) == 12 and mem.classes == [0, 1, 2, 3]
    _, labels = mem.tensors()
    assert torch.bincount(labels).tolist() == [3, 3, 3, 3]
