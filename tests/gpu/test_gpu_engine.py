"""The engine on a GPU: mixed precision, torch.compile, checkpoints and the first-task store, ViTs at 224 px.

Runs with `pytest -m gpu` (skipped without CUDA). Each test trains real, small scenarios on the device and
compares them with what the CPU-tested code promises.
"""
from __future__ import annotations

import statistics
from dataclasses import replace
from functools import lru_cache

import numpy as np
import pytest
import torch

from gtep.algorithms import ALGORITHMS
from gtep.data import ImageSet, resolve_dataset
from gtep.engine import FirstTaskSpec, OrderingJob, run_ordering
from gtep.engine.checkpoint import load_checkpoint, restore_rng
from gtep.engine.first_task import REUSED, FirstTaskStore
from gtep.engine.loop import Precision, Trainer
from gtep.engine.runner import OrderingRun
from tests.gpu.support import DEVICE, ON_CUDA, gpu_group

pytestmark = gpu_group

# Learnable in a few epochs: ten colour patterns with noise, 32 px like CIFAR.
DATASET = "synthetic:classes=10,train=60,test=30,size=32,noise=60"
VIT_METHODS = sorted(name for name in ALGORITHMS.names() if ALGORITHMS.get(name).uses_pretrained)


@lru_cache(maxsize=2)
def data(spec: str = DATASET) -> ImageSet:
    return resolve_dataset(spec).load()


def job(algorithm: str = "replay", *, ordering: int = 0, epochs: int = 6, **changes) -> OrderingJob:
    hparams = {"epochs": epochs, "lr": 0.05, "batch_size": 32, "scheduler": "cosine", "weight_decay": 5e-4}
    hparams.update(changes.pop("hparams", {}))
    base = OrderingJob(algorithm, hparams, "resnet8", (4, 3, 3), tuple(range(10)), seed=0, ordering=ordering,
                       memory_size=60, first_task=FirstTaskSpec(epochs=epochs, milestones=(epochs // 2,),
                                                                batch_size=32),
                       device=DEVICE, dataset=DATASET)
    return replace(base, **changes)


def final_acc(outcomes) -> list[float]:
    assert all(o.status == "finished" for o in outcomes), [o.message for o in outcomes]
    return [o.metrics["acc"] for o in outcomes]


def test_runs_train_on_the_device_and_say_so():
    outcome = run_ordering(job(epochs=2), data())
    assert outcome.status == "finished"
    assert outcome.device.startswith("cuda:0 (") if ON_CUDA else outcome.device == "cpu"


def test_bf16_channels_last_trains_like_fp32():
    """Same scenario, five orderings each way: the mean final accuracy within noise of fp32's, both far above
    chance; and the conv layers really saw bf16 channels-last input under mixed precision."""
    mixed = final_acc([run_ordering(job(ordering=s), data()) for s in range(5)])
    full = final_acc([run_ordering(job(ordering=s, mixed_precision=False), data()) for s in range(5)])
    noise = statistics.stdev(mixed + full)
    print(f"final acc bf16 {statistics.mean(mixed):.3f} +- {statistics.stdev(mixed):.3f}, "
          f"fp32 {statistics.mean(full):.3f} +- {statistics.stdev(full):.3f}")
    assert min(statistics.mean(mixed), statistics.mean(full)) > 0.4  # chance: 0.1
    assert abs(statistics.mean(mixed) - statistics.mean(full)) <= max(2 * noise, 0.05)


@pytest.mark.parametrize("mixed_precision", [True, False])
def test_the_training_step_runs_in_the_precision_asked_for(mixed_precision):
    device = torch.device(DEVICE)
    learner = ALGORITHMS.get("replay")(ALGORITHMS.get("replay").Params.from_mapping({}), "resnet8", 0, device)
    from tests.helpers import make_task

    task = make_task(0, 0, 4)
    task = replace(task, x=task.x.to(device), y=task.y.to(device))
    learner.begin_task(task)
    seen = []
    conv = next(m for m in learner.net.modules() if isinstance(m, torch.nn.Conv2d))
    hook = conv.register_forward_hook(lambda m, inputs, out: seen.append((out.dtype, inputs[0].is_contiguous(
        memory_format=torch.channels_last))))
    trainer = Trainer(device, 0, precision=Precision.for_device(device, mixed_precision))
    learner.learn_task(task, trainer.fit)
    hook.remove()
    expect_mixed = mixed_precision and ON_CUDA
    assert seen and all(dtype == (torch.bfloat16 if expect_mixed else torch.float32) for dtype, _ in seen)
    assert all(channels_last == expect_mixed for _, channels_last in seen)


def test_compiled_training_matches_eager():
    """training.compile on a ResNet learner: the step is really compiled (dynamo captured graphs) and the
    orderings end as accurate as eager ones."""
    import torch._dynamo

    torch._dynamo.reset()
    from torch._dynamo.utils import counters

    counters.clear()
    compiled = final_acc([run_ordering(job(ordering=s, compile=True), data()) for s in range(3)])
    assert counters["stats"]["unique_graphs"] > 0, "nothing was compiled"
    eager = final_acc([run_ordering(job(ordering=s), data()) for s in range(3)])
    print(f"final acc compiled {statistics.mean(compiled):.3f}, eager {statistics.mean(eager):.3f}")
    assert statistics.mean(compiled) > 0.4
    assert abs(statistics.mean(compiled) - statistics.mean(eager)) <= max(2 * statistics.stdev(compiled + eager), 0.05)


class Stop(Exception):
    """A worker that dies after a task's checkpoint was written."""


def test_a_checkpoint_resumes_on_the_device_and_loads_on_the_cpu(tmp_path):
    path = tmp_path / "ck.pt"
    spec = job("der", epochs=3)

    def stop_after_second(index, outcome):
        if index == 1:
            raise Stop

    with pytest.raises(Stop):
        run_ordering(spec, data(), on_task_end=stop_after_second, checkpoint=path)
    run = OrderingRun(spec, data())
    saved = load_checkpoint(path, run.key, torch.device(DEVICE))
    assert saved is not None and saved.tasks_done == 2
    assert {p.device.type for p in saved.learner.net.parameters()} == {torch.device(DEVICE).type}
    restore_rng(saved.rng, run.trainer.generator)  # the RNG states came to the device with it
    on_cpu = load_checkpoint(path, run.key, torch.device("cpu"))  # a retry placed on a CPU-only node
    assert {p.device.type for p in on_cpu.learner.net.parameters()} == {"cpu"}

    resumed = run_ordering(spec, data(), checkpoint=path)
    whole = run_ordering(spec, data())
    assert resumed.status == "finished" and resumed.resumed_tasks == 2
    np.testing.assert_array_equal(resumed.acc_matrix[:2], saved.acc_matrix)
    # kernels on a GPU are not bitwise reproducible across processes' algorithm choices; the resumed run
    # must still land where the uninterrupted one does
    assert resumed.metrics["acc"] == pytest.approx(whole.metrics["acc"], abs=0.1)


def test_the_first_task_store_hands_its_model_to_the_device(tmp_path):
    store = FirstTaskStore(tmp_path / "first_tasks")
    first = run_ordering(job(epochs=3), data(), first_tasks=store)
    other_set = job(epochs=3, hparams={"lr": 0.01})  # a set that differs only after task 1
    second = run_ordering(other_set, data(), first_tasks=store)
    assert (first.first_task, second.first_task) == ("trained", REUSED)
    np.testing.assert_array_equal(second.acc_matrix[0], first.acc_matrix[0])  # NaN beyond task 1
    run = OrderingRun(other_set, data())
    stored = load_checkpoint(store.result_path(run.first_task_key()), run.first_task_key(), run.device)
    assert {p.device.type for p in stored.learner.net.parameters()} == {torch.device(DEVICE).type}


@pytest.mark.parametrize("algorithm", VIT_METHODS)
def test_each_vit_method_runs_an_ordering_at_224_px(algorithm):
    """The paper's backbone, vit_base_patch16_224, built by timm with random weights (nothing downloaded),
    through one ordering of two tasks on 224 px images."""
    spec = "synthetic:classes=4,train=8,test=4,size=224"
    hparams = {"epochs": 1, "batch_size": 8, "lr": 0.01, "optimizer": "sgd", "scheduler": "cosine"}
    vit = OrderingJob(algorithm, hparams, "vit_base_patch16_224", (2, 2), tuple(range(4)), seed=0, ordering=0,
                      memory_size=0, device=DEVICE, dataset=spec)
    outcome = run_ordering(vit, data(spec))
    assert outcome.status == "finished", outcome.message
    assert len(outcome.acc_matrix) == 2 and np.isfinite(outcome.acc_matrix[1]).all()
    assert 85_000_000 < outcome.params_total  # ViT-B/16: 85.8M in the backbone alone
    assert outcome.params_trainable < outcome.params_total  # the backbone stays frozen
