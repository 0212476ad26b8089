"""RanPAC: the head is the ridge solve (G + lambda I)^{-1} Q on statistics of every image seen, lambda is
chosen on a held-out part of the task, the PETL modules train in the first task only, the random projection
is fixed and seeded, and the whole beats the frozen-backbone nearest-class-mean baseline."""
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from gtep.algorithms import ALGORITHMS
from gtep.algorithms.ranpac import select_ridge, solve_ridge
from gtep.engine import runner
from gtep.models.vit import create_timm_vit
from gtep.spaces import load_space
from tests.helpers import VIT, pretrained_vit, run_small_vit

M = 256  # the paper's 10000 is a 10000 x 10000 solve: fine for the code, slow for a unit test
CPU = torch.device("cpu")


def clone(tensors):
    return {k: v.detach().clone() for k, v in tensors.items()}


def spied_run(hparams):
    """One run_small_vit through the real runner, recording the learner's state around every task."""
    log = {"before": [], "after": [], "tasks": []}

    class Spy(ALGORITHMS.get("ranpac")):
        def grow(self, task):  # the first hook of a task, before anything changes
            log["before"].append(clone(dict(self.net.named_parameters())))
            super().grow(task)

        def consolidate(self, task, fit):  # the last hook of a task
            super().consolidate(task, fit)
            net = self.net
            log["tasks"].append((task.x, task.y, task.total))
            log["after"].append({"petl": {i: p.detach().clone() for i, p in enumerate(net.petl_parameters())},
                                 "backbone": clone(net.backbone.state_dict()), "w_rand": net.w_rand.clone(),
                                 "w_out": net.w_out.clone(), "gram": self.gram.clone(),
                                 "targets": self.targets.clone(), "ridge": self.ridge})
            log["learner"] = self

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(runner, "ALGORITHMS", SimpleNamespace(get=lambda name: Spy))
        out = run_small_vit("ranpac", hparams)
    return out, log


@pytest.fixture(scope="module")
def adapter_run():
    return spied_run({"M": M, "ffn_num": 16})


@pytest.fixture(scope="module")
def simplecil():
    return run_small_vit("simplecil")


def test_head_is_the_closed_form_ridge_solution(adapter_run):
    out, log = adapter_run
    assert out.status == "finished"
    for after, (_, _, total) in zip(log["after"], log["tasks"]):
        gram, targets, ridge = after["gram"], after["targets"], after["ridge"]
        assert ridge in ALGORITHMS.get("ranpac").Params().ridge_candidates
        reference = torch.linalg.solve(gram + ridge * torch.eye(M), targets)
        assert after["w_out"].shape == (M, total)
        assert torch.allclose(after["w_out"], reference, rtol=1e-5, atol=1e-7)
        # and it satisfies the normal equations of ridge regression, (G + lambda I) W_o = Q
        system = gram.double() + ridge * torch.eye(M, dtype=torch.float64)
        residual = system @ after["w_out"].double() - targets
        assert residual.norm() < 1e-4 * targets.norm()


def test_statistics_accumulate_over_every_task_seen(adapter_run):
    _, log = adapter_run
    learner = log["learner"]
    with torch.no_grad():  # the PETL modules are frozen after task 1, so today's features are every task's
        hs = [learner.net.project(learner.net.embed(x)).double() for x, _, _ in log["tasks"]]
    total = log["tasks"][-1][2]
    ys = [F.one_hot(y, total).double() for _, y, _ in log["tasks"]]
    for t, after in enumerate(log["after"]):
        h, y = torch.cat(hs[: t + 1]), torch.cat(ys[: t + 1])
        seen = log["tasks"][t][2]
        assert torch.allclose(after["gram"].double(), h.t() @ h, rtol=1e-4, atol=1e-2)
        assert torch.allclose(after["targets"].double(), (h.t() @ y)[:, :seen], rtol=1e-4, atol=1e-3)
    # and predictions are relu(f W) W_o on the current statistics
    x = log["tasks"][0][0][:8]
    expected = hs[0][:8].float() @ log["after"][-1]["w_out"]
    assert torch.allclose(learner.predict(x), expected, rtol=1e-4, atol=1e-4)


def test_petl_trains_in_the_first_task_only_and_pretrained_weights_stay(adapter_run):
    out, log = adapter_run
    learner = log["learner"]
    before = log["before"][0]
    first, later = log["after"][0]["petl"], [a["petl"] for a in log["after"][1:]]
    names = [n for n in before if n.startswith("adapters.")]
    assert len(names) == len(first) == 4 * 4  # down/up weight and bias in each of the 4 blocks
    assert any(not torch.equal(before[n], first[i]) for i, n in enumerate(names))  # task 1 trained them
    for snapshot in later:
        assert all(torch.equal(first[i], snapshot[i]) for i in first)  # tasks 2-3 did not
    pretrained = create_timm_vit(VIT, pretrained_vit()).state_dict()
    for after in log["after"]:
        assert all(torch.equal(v, pretrained[k.removeprefix("vit.")]) for k, v in after["backbone"].items())
    assert not any(p.requires_grad for p in learner.net.parameters())
    adapters = sum(p.numel() for p in learner.net.adapters.parameters())
    assert adapters == 4 * (2 * 96 * 16 + 16 + 96)
    assert out.params_trainable == adapters + M * 10  # the adapters and W_o; W is random, not learnt
    assert out.params_total == out.params_trainable + 96 * M + sum(pretrained[k].numel() for k in pretrained)


def test_random_projection_is_fixed_and_seeded_and_m_sets_its_width(adapter_run):
    _, log = adapter_run
    w = log["after"][0]["w_rand"]
    assert w.shape == (96, M)
    assert all(torch.equal(a["w_rand"], w) for a in log["after"][1:])
    assert log["after"][-1]["gram"].shape == (M, M)

    def w_rand(seed, width):
        torch.manual_seed(seed)
        algorithm = ALGORITHMS.get("ranpac")
        learner = algorithm(algorithm.Params(M=width), VIT, 0, CPU, pretrained_vit())
        return learner.net.w_rand, learner.net.project(torch.randn(3, 96)), learner.gram

    a, b, c = w_rand(7, 64), w_rand(7, 64), w_rand(8, 64)
    assert torch.equal(a[0], b[0]) and not torch.equal(a[0], c[0])
    wide = w_rand(7, 128)
    assert wide[0].shape == (96, 128) and wide[1].shape == (3, 128) and wide[2].shape == (128, 128)


def test_prompt_variant_trains_prompt_tokens_in_the_first_task_only():
    out, log = spied_run({"M": M, "petl": "prompt", "prompt_token_num": 5, "epochs": 1})
    assert out.status == "finished" and log["learner"].net.adapters is None
    before, first = log["before"][0]["prompts"], log["after"][0]["petl"][0]
    assert first.shape == (1, 5, 96) and not torch.equal(before, first)
    assert all(torch.equal(a["petl"][0], first) for a in log["after"][1:])
    assert out.params_trainable == 5 * 96 + M * 10


def test_ridge_is_chosen_on_held_out_data_as_per_candidate_solves():
    g = torch.Generator().manual_seed(0)
    n, m, c = 120, 40, 4
    h = torch.randn(n, m, generator=g, dtype=torch.float64)
    noisy = h[:, :3].sum(1) + 2 * torch.randn(n, generator=g, dtype=torch.float64)
    y = F.one_hot((noisy > 0).long() * 2, c).double()
    candidates = tuple(10.0 ** k for k in range(-4, 5))
    chosen = select_ridge(h, y, candidates, 0.2, torch.Generator().manual_seed(1))
    order = torch.randperm(n, generator=torch.Generator().manual_seed(1))
    val, fit = order[:24], order[24:]
    gram, targets = h[fit].t() @ h[fit], h[fit].t() @ y[fit]
    eye = torch.eye(m, dtype=h.dtype)
    fits = [torch.linalg.solve(gram + r * eye, targets) for r in candidates]
    losses = [(h[val] @ w - y[val]).pow(2).mean() for w in fits]
    best = min(range(len(candidates)), key=lambda i: losses[i])
    assert chosen == candidates[best] and 0 < best < len(candidates) - 1  # interior, not an endpoint


def test_ridge_choice_leaves_a_usable_head_with_fewer_images_than_m():
    """With M above the image count, float32 cannot solve for a tiny lambda; fitting each candidate with the
    head's own solve (as PILOT) keeps such a lambda from being chosen."""
    g = torch.Generator().manual_seed(0)
    means, w = torch.randn(3, 16, generator=g), torch.randn(16, 600, generator=g)

    def sample(per_class):
        y = torch.arange(3).repeat_interleave(per_class)
        return F.relu((means[y] + torch.randn(len(y), 16, generator=g)) @ w), y

    (h, y), (h_test, y_test) = sample(20), sample(50)
    onehot = F.one_hot(y, 3).float()
    candidates = tuple(10.0 ** k for k in range(-8, 9))
    chosen = select_ridge(h, onehot, candidates, 0.2, torch.Generator().manual_seed(1))

    def accuracy(ridge):
        return (h_test @ solve_ridge(h.t() @ h, h.t() @ onehot, ridge)).argmax(1).eq(y_test).float().mean()

    assert accuracy(chosen) > 0.85
    assert accuracy(1e-8) < 0.6  # what the smallest candidate would have given


def test_beats_the_frozen_backbone_ncm_baseline(adapter_run, simplecil):
    out, _ = adapter_run
    assert out.metrics["acc"] > simplecil.metrics["acc"] + 0.05
    assert out.metrics["avg_acc"] > simplecil.metrics["avg_acc"]


def test_search_space_loads_and_original_builds_params():
    space = load_space("ranpac")
    assert set(space.space.names) >= {"ffn_num", "M", "prompt_token_num", "optimizer", "scheduler"}
    params = ALGORITHMS.get("ranpac").Params.from_mapping(space.presets["original"])
    assert (params.epochs, params.lr, params.batch_size, params.weight_decay) == (10, 0.05, 16, 0.005)
    assert (params.scheduler, params.optimizer, params.petl) == ("constant", "sgd", "adapter")
    assert (params.ffn_num, params.M, params.prompt_token_num) == (64, 10000, 30)
