"""The stream runner (gtep/engine/flows/stream.py): FLUID's Algorithm 1 end to end on a small synthetic stream, its
order of events (predict, record, reveal, update), its compute accounting and its determinism."""
import dataclasses
import json

import numpy as np
import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from gtep.data import resolve_dataset
from gtep.engine import OrderingJob, run_ordering
from gtep.engine.flows.stream import StreamRun
from gtep.models import create_backbone
from gtep.protocol.families.fluid import metrics as fluid_metrics

OPTIONS = {"pretrain_classes": [0, 1, 2], "n_pretrain_classes": 2, "n_novel_classes": 4, "total_samples": 60,
           "per_class_cap": 20, "head_cut": 10, "window": 20}


@pytest.fixture(scope="module")
def data():
    return resolve_dataset("synthetic:classes=10,train=20,test=10").load()


def job(algorithm, hparams=None, **options):
    return OrderingJob(algorithm=algorithm, hparams=hparams or {}, backbone="resnet8", increments=(6,),
                       classes=(3, 4, 5, 6, 7, 8), seed=0, ordering=0, device="cpu", family="fluid",
                       family_options=tuple(sorted({**OPTIONS, **options}.items())))


SCHEDULE = {"update_every": 20, "epochs": 1, "batch_size": 16, "threshold": 2.1}  # 2.1: never "unseen"


@pytest.mark.parametrize("algorithm, hparams", [
    ("fluid_ncm", {}), ("fluid_et", SCHEDULE), ("fluid_finetune", SCHEDULE),
    ("fluid_finetune", {**SCHEDULE, "depth": 1}), ("fluid_standard", SCHEDULE)])
def test_every_learner_runs_a_stream_and_reports_every_metric(data, algorithm, hparams):
    outcome = run_ordering(job(algorithm, hparams), data)
    assert outcome.status == "finished", outcome.message
    assert set(fluid_metrics.METRIC_NAMES) <= set(outcome.metrics)
    assert outcome.metrics["acc"] == outcome.metrics["overall_acc"]
    assert outcome.metrics["avg_acc"] == outcome.metrics["mean_per_class_acc"]
    assert len(outcome.metrics["rolling_acc"]) == 3
    assert outcome.metrics["gmacs_inference"] > 0
    assert (outcome.metrics["gmacs_update"] > 0) == (algorithm != "fluid_ncm")
    assert len(outcome.class_order) == 6


def test_each_label_is_revealed_only_after_its_prediction_is_recorded(data):
    run = StreamRun(job("fluid_et", SCHEDULE), data)
    events = []
    stream, learner = run.stream, run.learner
    for owner, name in ((learner, "predict_sample"), (stream, "record"), (stream, "reveal"), (learner, "reveal"),
                        (learner, "update")):
        original = getattr(owner, name)

        def spy(*args, _original=original, _name=f"{type(owner).__name__}.{name}", **kwargs):
            events.append(_name)
            return _original(*args, **kwargs)
        setattr(owner, name, spy)
    run.run()
    step = ["FluidExemplarTuning.predict_sample", "PredictThenReveal.record", "PredictThenReveal.reveal",
            "FluidExemplarTuning.reveal"]
    per_step = [e for e in events if e != "FluidExemplarTuning.update"]
    assert per_step == step * len(stream)
    assert events.count("FluidExemplarTuning.update") == 3  # every 20 of 60 samples


def test_compute_counts_every_prediction_and_the_backward_pass_as_configured(data):
    backbone = create_backbone("resnet8")
    with FlopCounterMode(display=False) as counter:
        backbone(torch.zeros(1, 3, *data.x_train.shape[1:3]))
    per_image = counter.get_total_flops() / 2 / 1e9
    outcome = run_ordering(job("fluid_ncm"), data)
    assert outcome.metrics["gmacs_inference"] == pytest.approx(60 * per_image, rel=0.02)  # + the tiny NCM head
    once = run_ordering(job("fluid_standard", SCHEDULE, backward_factor=1.0), data).metrics
    thrice = run_ordering(job("fluid_standard", SCHEDULE, backward_factor=3.0), data).metrics
    assert thrice["gmacs_update"] == pytest.approx(2 * once["gmacs_update"])
    # (20 + 40 + 60) samples passed once each, forward + backward (= forward): 2 x 120 forward passes
    assert once["gmacs_update"] == pytest.approx(2 * 120 * per_image, rel=0.02)


def test_the_same_job_gives_the_same_stream_and_metrics(data):
    a = run_ordering(job("fluid_finetune", {**SCHEDULE, "depth": 1}), data)
    b = run_ordering(job("fluid_finetune", {**SCHEDULE, "depth": 1}), data)
    assert a.class_order == b.class_order
    assert json.dumps(a.metrics, sort_keys=True) == json.dumps(b.metrics, sort_keys=True)
    assert a.metrics["overall_acc"] > 0
    first = StreamRun(job("fluid_ncm"), data).spec.label
    other = StreamRun(dataclasses.replace(job("fluid_ncm"), ordering=1), data).spec.label
    assert not np.array_equal(first, other)
