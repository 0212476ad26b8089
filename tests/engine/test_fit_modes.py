"""Fit modes (gtep/engine/loop.py: FitMode, FIT_MODES): how a unit's fits run, every one through the one epoch loop.

Every registered mode runs a trial's units through the one entry (gtep/engine/orderings.py, run_orderings) and
counts the images it trains; a fused fit prepares its batches as a plain one does; a fit the fused loop does not
run, or a fusion that fails, trains alone and is said (one line) and recorded in the unit's report; a new mode is
one class and its registration. No Ray: a fused trial's unit events are checked through the trainable directly.
"""
from __future__ import annotations

import json
import logging
import os
import stat
from functools import partial

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import gtep.preflight.calibration  # noqa: F401 - registers the calibration's modes (timed, sampled)
from gtep.algorithms import ALGORITHMS
from gtep.config import ExperimentConfig
from gtep.config.resolution import resolve
from gtep.data import resolve_dataset
from gtep.engine import fusion, run_ordering
from gtep.engine.fusion import FusedFit, fit_fused
from gtep.engine.loop import FIT_MODES, FitCall, PlainFit, Precision, Trainer
from gtep.engine.orderings import run_orderings
from gtep.orchestration import trainable
from gtep.orchestration.trial_job import StudyFolders
from tests.helpers import make_task, small_job

TINY = "synthetic:classes=10,train=16,test=8"
CPU = torch.device("cpu")


def jobs(orderings=(0, 1)):
    return [small_job("replay", {"batch_size": 32, "lr": 0.01}, ordering=s, epochs=1, dataset=TINY)
            for s in orderings]


def unit(job, data, mode):
    """One ordering as a trial's unit: it trains with the mode it is given and returns what the mode says too."""
    return run_ordering(job, data, fit_mode=mode), mode


@pytest.mark.parametrize("name", FIT_MODES.names())
def test_every_fit_mode_runs_a_trials_units_and_counts_their_images(name):
    """A fused unit counted 0 images before (its loop was a copy without the count), so a fused study's events
    reported 0 and benchmarks/gpu_study.py's images/s were 0."""
    plain = [run_ordering(job, data) for job, data in jobs()]
    results = run_orderings([partial(unit, job, data) for job, data in jobs()], name, "replay")
    for (outcome, mode), alone in zip(results, plain):
        assert outcome.status == "finished" and len(outcome.acc_matrix) == 3
        assert mode.report()["mode"] == name
        assert outcome.images_trained > 0
        if name != "sampled":  # the calibration's sampled mode trains a few batches of each fit on purpose
            assert outcome.images_trained == alone.images_trained


def test_a_new_fit_mode_is_one_class_and_its_registration(monkeypatch):
    """docs/extending.md, "Adding a fit mode": its block, run here, is all a new mode takes."""
    monkeypatch.setattr(FIT_MODES, "_entries", dict(FIT_MODES._entries))  # the block's registration, undone after

    from gtep.engine.loop import FIT_MODES as REGISTRY
    from gtep.engine.loop import FitCall as Call
    from gtep.engine.loop import PlainFit as Plain

    @REGISTRY.register("counting")
    class CountingFit(Plain):
        """Each fit trains as a plain one; the unit's event says how many fits and epochs it ran."""

        name = "counting"

        def __init__(self) -> None:
            self.fits = self.epochs = 0

        def fit(self, call: Call) -> None:
            self.fits += 1
            self.run_plain(call)

        def end_epoch(self, epoch, calls, step) -> None:
            self.epochs += 1

        def report(self) -> dict:
            return {"mode": self.name, "fits": self.fits, "epochs": self.epochs}

    (outcome, mode), = run_orderings([partial(unit, *jobs((0,))[0])], "counting", "replay")
    assert outcome.status == "finished" and isinstance(mode, CountingFit)
    report = mode.report()
    assert report["fits"] >= 3 and report["epochs"] >= report["fits"], "a fit per task at least, an end_epoch per epoch"
    with pytest.raises(KeyError, match="unknown fit mode 'countin'.*counting"):
        FIT_MODES.get("countin")


def replay_calls(precision: Precision | None = None, loss=None) -> list[FitCall]:
    """Three orderings' first fit: replay learners on a task of plain tensors."""
    calls = []
    for s in range(3):
        torch.manual_seed(s)
        learner = ALGORITHMS.get("replay")(ALGORITHMS.get("replay").Params(), "resnet8", 20, CPU)
        task = make_task(s, 0, 4)
        learner.begin_task(task)
        trainer = Trainer(CPU, seed=s, precision=precision)
        calls.append(FitCall(trainer, list(learner.trainable_parameters()), loss or learner.loss, task.x, task.y,
                             task.recipe, modules=[learner.net], owner=learner))
    return calls


def test_a_fused_fit_prepares_its_batches_as_a_plain_one_does(monkeypatch):
    """Channels-last batches (bf16 on CUDA): the fused loop skipped the precision's prepare_batch before."""
    prepared: list[torch.Tensor] = []
    original = Precision.prepare_batch

    def recording(self, x):
        out = original(self, x)
        prepared.append(out)
        return out

    monkeypatch.setattr(Precision, "prepare_batch", recording)
    calls = replay_calls(Precision("cpu", None, channels_last=True))
    assert fit_fused(FusedFit(), calls) == [None, None, None]
    assert prepared and all(batch.dim() == 5 and batch.shape[0] == 3 for batch in prepared)
    assert all(batch[s].is_contiguous(memory_format=torch.channels_last) for batch in prepared for s in range(3))
    assert all(c.trainer.images_trained == 48 * c.recipe.epochs for c in calls)


def own_fit(s: int, mode, **options) -> dict:
    """A unit whose one fit is made as a learner's stage makes it, with `options` (on_epoch, plateau)."""
    call = replay_calls()[s]
    Trainer(CPU, seed=s, mode=mode).fit(call.parameters, call.loss_fn, call.x, call.y, call.recipe,
                                        modules=call.modules, owner=call.owner, **options)
    return {**mode.report(), "net": call.owner.net.state_dict()}


def test_a_fit_the_fused_loop_does_not_run_trains_alone_and_is_recorded():
    reports = run_orderings([partial(own_fit, s, on_epoch=lambda epoch: None) for s in range(2)], "fused", "replay")
    for report in reports:
        assert report["fused_fits"] == 0 and report["alone_fits"] == 1
        assert report["alone_why"] == ["the fused loop does not run on_epoch"]


def test_a_fusion_that_fails_is_said_in_one_line_recorded_and_trains_each_ordering_alone(monkeypatch, caplog):
    """Out of memory, say: before, the group trained alone silently (its reason in a LockstepStats no production
    caller passed). Now one warning line, the reason in each unit's report, and each ordering's plain result."""
    plain = [own_fit(s, PlainFit()) for s in range(2)]

    def out_of_memory(calls):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB\n(details on the next line)")

    monkeypatch.setattr(fusion, "FusedStep", out_of_memory)
    with caplog.at_level(logging.WARNING, logger="gtep.engine.fusion"):
        reports = run_orderings([partial(own_fit, s) for s in range(2)], "fused", "replay",
                                names=["ordering 0", "ordering 1"])
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "\n" not in lines[0], lines
    assert "fusing ordering 0, ordering 1 failed: OutOfMemoryError: CUDA out of memory" in lines[0]
    for report, alone in zip(reports, plain):
        assert report["fused_fits"] == 0 and report["alone_fits"] == 1
        assert report["alone_why"][0].startswith("fusing ordering 0, ordering 1 failed: OutOfMemoryError")
        assert all(torch.equal(report["net"][k], alone["net"][k]) for k in alone["net"])


class NoisyLoss(nn.Module):
    """A loss that breaks the learner contract: it draws noise from torch's global RNG."""

    def __init__(self, learner) -> None:
        super().__init__()
        self.learner = learner

    def __call__(self, x, y):  # type: ignore[override]
        logits = self.learner.net(x)["logits"]
        return F.cross_entropy(logits + 0.01 * torch.randn_like(logits), y)


def test_a_loss_that_draws_from_the_global_rng_is_refused_for_fusion():
    """The loss contract (gtep/algorithms/base.py): a fused fit cannot give each ordering its own global RNG."""
    calls = replay_calls()
    calls = [FitCall(c.trainer, c.parameters, NoisyLoss(c.owner), c.x, c.y, c.recipe, modules=c.modules,
                     owner=c.owner) for c in calls]
    with pytest.raises(fusion.FusionRefused, match="global RNG"):
        fit_fused(FusedFit(), calls)


FUSED = [name for name in ALGORITHMS.names() if getattr(ALGORITHMS.get(name), "fuses_orderings", False)]


@pytest.mark.parametrize("algorithm", FUSED)
def test_every_fused_learners_losses_keep_the_contract(algorithm):
    """Every learner that opted in draws nothing from torch's global RNG in the losses of its fits (task 2:
    distillation, exemplars), so its fused fits give each ordering what its own process would."""
    job, data = small_job(algorithm, {"batch_size": 32, "lr": 0.01, "bias_epochs": 1} if algorithm == "bic"
                          else {"batch_size": 32, "lr": 0.01}, epochs=1, dataset=TINY)
    drawn: list[str] = []

    class Watching(PlainFit):
        def fit(self, call: FitCall) -> None:
            x, y = call.x[:4], call.y[:4]
            before = torch.get_rng_state()
            call.loss_fn(x, y)
            if not torch.equal(before, torch.get_rng_state()):
                drawn.append(getattr(call.loss_fn, "__qualname__", repr(call.loss_fn)))
            self.run_plain(call)

    outcome = run_ordering(job, data, fit_mode=Watching())
    assert outcome.status == "finished" and not drawn, drawn


def test_a_fused_trials_unit_events_count_images_and_say_how_its_fits_ran(tmp_path, monkeypatch):
    """Through the trainable, as a Ray trial runs it (tune.report taken here): each unit's event and record carry
    its images (0 before) and its fit mode's report."""
    from tests.orchestration.test_phases import config

    doc = config(search={"trials": 1, "orderings": 2}, compute={"fuse_orderings": "on"})
    resolved = resolve(ExperimentConfig.model_validate(doc))
    folders = StudyFolders(unit_dir=tmp_path / "units", events=tmp_path / "events.jsonl", attempt="a1")
    folders.unit_dir.mkdir()
    job = trainable.trial_job(resolved, "tune", folders)
    assert job.fuse_orderings
    spec = resolved.tuning
    data = resolve_dataset(spec.dataset).load().subset(sorted(spec.classes))
    sent: list[dict] = []
    monkeypatch.setattr(trainable.tune, "report", sent.append)
    monkeypatch.setattr(trainable, "_node_id", lambda: "")  # asking Ray for it would start a Ray
    previous = os.umask(0o022)  # a trial on a Ray that gtep did not start: its files are still the owner's only
    try:
        trainable.train_set({"trial": {"set_index": 0, "hparams": {"epochs": 1, "batch_size": 16}},
                             "orderings": [0, 1]}, data, job)
    finally:
        os.umask(previous)
    assert stat.S_IMODE(folders.events.stat().st_mode) == 0o600
    assert {stat.S_IMODE(p.stat().st_mode) for p in folders.unit_dir.iterdir()} == {0o600}
    events = [json.loads(line) for line in folders.events.read_text().splitlines()]
    trained = [e for e in events if e["event"] == "unit_trained"]
    assert [e["ordering"] for e in trained] == [0, 1]
    for event in trained:
        assert event["images_trained"] > 0
        assert event["fit_mode"]["mode"] == "fused" and event["fit_mode"]["fused_fits"] >= 1
    units = [unit for report in sent for unit in [*report["earlier_units"], report]]
    assert [u["fit_mode"]["mode"] for u in units] == ["fused", "fused"]
    assert all(u["images_trained"] > 0 for u in units)
