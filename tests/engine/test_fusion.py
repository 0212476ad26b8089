"""Fused orderings (gtep/engine/fusion.py): a fused trial of S = 3 gives the three separate runs' results.

Per fused learner: the same weights, BatchNorm statistics and exemplar memory after a few steps (within 1e-5
norm-relative: grouped and plain convolutions round differently), and over a whole tiny scenario accuracies
within the golden records' tolerance for rounding (tests/algorithms/test_contract_regression.py). A leak of one
ordering's batch norm statistics, optimiser state, memory or head into another's fails them; the NaN test
makes such a leak impossible to miss.
"""
from __future__ import annotations

import copy
import math
from functools import partial

import pytest
import torch

from gtep.algorithms import ALGORITHMS, FitRecipe, TaskData
from gtep.engine import run_ordering
from gtep.engine.fusion import FusedFit, FusionRefused, check_fusable, fit_fused, fusion_wanted
from gtep.engine.loop import DivergedError, FitCall, PlainFit, Trainer
from gtep.engine.orderings import run_orderings
from gtep.engine.runner import OrderingRun
from tests.helpers import small_job

# the learners that opted in, found in the registry (a new one is tested as soon as it sets fuses_orderings)
FUSED = [name for name in ALGORITHMS.names() if getattr(ALGORITHMS.get(name), "fuses_orderings", False)]
SHORT = {"bic": {"bias_epochs": 1}}
FEW_STEPS = "synthetic:classes=10,train=16,test=8"  # task 2: 48 images and 16 exemplars, 2 steps of 32
SCENARIO = "synthetic:classes=10,train=16,test=20"
GOLDEN_SAMPLES = 12  # the golden records' tolerance: test images an accuracy may move by rounding alone


def norm_relative(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    keys = [k for k in a if not k.endswith("num_batches_tracked")]
    wa = torch.cat([a[k].detach().flatten().float() for k in keys])
    wb = torch.cat([b[k].detach().flatten().float() for k in keys])
    return float((wa - wb).norm() / wa.norm())


def runs_after_first_task(algorithm: str, orderings: tuple[int, ...], fused: bool = False) -> list[OrderingRun]:
    """Runs whose task 1 was trained alone (deterministic): task 2 then starts from the same state everywhere.
    A few steps at a small learning rate: some trajectories of this toy scenario amplify rounding (two runs alone
    with one and with two threads end 1e-4 apart after a few steps at lr 0.05), which is not what is tested."""
    hparams = {"batch_size": 32, "lr": 0.01, **SHORT.get(algorithm, {})}
    runs = [OrderingRun(*small_job(algorithm, hparams, ordering=s, epochs=1, dataset=FEW_STEPS)) for s in orderings]
    for run in runs:
        run.train_task(run.tasks[0])
    return runs


def in_lockstep(runs: list[OrderingRun], task: int) -> list[FusedFit]:
    """Task `task` of each run trained as a fused trial's units: each run's trainer given its unit's mode."""
    modes: list[FusedFit] = []

    def unit(run: OrderingRun, mode) -> None:
        run.trainer.mode = mode
        modes.append(mode)
        run.train_task(run.tasks[task])

    run_orderings([partial(unit, run) for run in runs], "fused", "replay")
    return sorted(modes, key=lambda m: m.worker.index)


@pytest.mark.parametrize("algorithm", FUSED)
def test_a_fused_task_gives_the_separate_runs_weights(algorithm):
    """Task 2 (distillation, growth, bias correction, aligning: everything a learner does beyond task 1) of
    three orderings, fused and alone: weights, statistics, heads and memory agree within 1e-5."""
    orderings = (0, 1, 2)
    alone = runs_after_first_task(algorithm, orderings)
    fused = [copy.deepcopy(run) for run in alone]
    rng = torch.get_rng_state()
    for run in alone:
        torch.set_rng_state(rng)  # each as the first thing its own process does after task 1
        run.train_task(run.tasks[1])
    torch.set_rng_state(rng)
    modes = in_lockstep(fused, 1)
    assert all(m.fused_fits >= 1 and not m.alone for m in modes), [m.report() for m in modes]
    for a, b in zip(alone, fused):
        assert a.trainer.images_trained == b.trainer.images_trained > 0  # the fused loop counts each one's images
        assert not a.outcome.diverged and not b.outcome.diverged
        assert norm_relative(a.learner.net.state_dict(), b.learner.net.state_dict()) < 1e-5
        xa, ya = a.learner.memory.tensors()
        xb, yb = b.learner.memory.tensors()
        assert torch.equal(ya, yb) and torch.equal(getattr(xa, "pixels", xa), getattr(xb, "pixels", xb))


@pytest.mark.parametrize("algorithm", [pytest.param(a, marks=[] if a == "replay" else [pytest.mark.slow])
                                       for a in FUSED])
def test_a_fused_scenario_gives_the_separate_runs_accuracies(algorithm):
    """A whole tiny scenario (3 tasks) of S = 3 orderings: fused and alone within the golden tolerance."""
    jobs = [small_job(algorithm, SHORT.get(algorithm), ordering=s, epochs=2, dataset=SCENARIO) for s in range(3)]
    alone = [run_ordering(job, data) for job, data in jobs]
    modes: list = []

    def unit(job, mode):
        modes.append(mode)
        return run_ordering(job, jobs[0][1], fit_mode=mode)

    fused = run_orderings([partial(unit, job) for job, _ in jobs], "fused", algorithm)
    assert all(m.fused_fits >= 1 for m in modes), [m.report() for m in modes]
    for a, b in zip(alone, fused):
        assert a.status == b.status == "finished"
        assert b.images_trained == a.images_trained > 0
        assert a.class_order == b.class_order
        for row_a, row_b in zip(a.acc_matrix, b.acc_matrix):
            for j, (x, y) in enumerate(zip(row_a, row_b)):
                if math.isnan(x):
                    assert math.isnan(y)
                    continue
                assert abs(x - y) * a.test_counts[j] <= GOLDEN_SAMPLES, (a.acc_matrix, b.acc_matrix)


def _requests(poisoned: int | None) -> tuple[list, list[FitCall]]:
    """Three replay learners on one task of plain tensors, ordering `poisoned`'s images NaN."""
    from tests.helpers import make_task

    learners, requests = [], []
    for s in range(3):
        torch.manual_seed(s)
        learner = ALGORITHMS.get("replay")(ALGORITHMS.get("replay").Params(), "resnet8", 20, torch.device("cpu"))
        task: TaskData = make_task(s, 0, 4)
        learner.begin_task(task)
        x = torch.full_like(task.x, float("nan")) if s == poisoned else task.x
        recipe = FitRecipe(epochs=2, lr=0.05, batch_size=16, weight_decay=5e-4, scheduler="constant",
                           milestones=(), lr_decay=0.1)
        requests.append(FitCall(Trainer(torch.device("cpu"), seed=s), list(learner.trainable_parameters()),
                                learner.loss, x, task.y, recipe, modules=[learner.net], owner=learner))
        learners.append(learner)
    return learners, requests


def test_one_diverged_ordering_leaks_into_no_other():
    """Ordering 1's images are NaN: its loss, gradients, batch norm statistics, momentum and head go NaN. The
    other two must still match their runs alone (and ordering 1 alone diverges, as it does here)."""
    alone_learners, alone = _requests(poisoned=1)
    outcomes = []
    for request in alone:
        try:
            PlainFit().fit(request)
            outcomes.append(None)
        except DivergedError as err:
            outcomes.append(err)
    fused_learners, fused = _requests(poisoned=1)
    replies = fit_fused(FusedFit(), fused)
    assert [type(r) for r in replies] == [type(o) for o in outcomes] == [type(None), DivergedError, type(None)]
    for s in (0, 2):
        a, b = alone_learners[s].net.state_dict(), fused_learners[s].net.state_dict()
        assert all(torch.isfinite(v).all() for v in b.values())
        assert norm_relative(a, b) < 1e-5


def test_the_engine_refuses_a_learner_that_does_not_opt_in():
    job, data = small_job("podnet")
    with pytest.raises(FusionRefused) as err:
        run_orderings([partial(run_ordering, job, data)], "fused", "podnet")
    assert "podnet" in str(err.value) and "\n" not in str(err.value)
    for name in FUSED:
        check_fusable(ALGORITHMS.get(name), name)


def test_auto_fuses_only_where_the_learner_and_device_allow():
    replay, podnet = ALGORITHMS.get("replay"), ALGORITHMS.get("podnet")
    assert fusion_wanted("auto", replay, "cuda")
    assert not fusion_wanted("auto", replay, "cpu")
    assert not fusion_wanted("auto", replay, "cuda", parallel=2)
    assert not fusion_wanted("auto", podnet, "cuda")
    assert not fusion_wanted("off", replay, "cuda")
    assert fusion_wanted("on", replay, "cpu")
