"""Small, fast class-incremental runs for algorithm tests (synthetic data, a tiny ResNet, CPU)."""
from __future__ import annotations

import contextlib
import sys
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Iterator

from gtep.data import ImageSet, resolve_dataset
from gtep.engine import FirstTaskSpec, OrderingJob, OrderingOutcome, run_ordering

SYNTHETIC = "synthetic:classes=10,train=40,test=20"


def assert_cuda_is_refused_without_cuda(main: Callable[[list[str]], Any], capsys: Any) -> None:
    """A GPU benchmark's main(["--device", "cuda"]) where there is no CUDA: exit 2, one error naming the option."""
    import pytest
    import torch

    if torch.cuda.is_available():
        pytest.skip("CUDA is here")
    with pytest.raises(SystemExit) as exit_:
        main(["--device", "cuda"])
    assert exit_.value.code == 2 and "--device cuda: CUDA is not available" in capsys.readouterr().err


@lru_cache(maxsize=4)
def load_benchmark(name: str):
    """benchmarks/<name>.py as the module `name` (the folder is scripts, not a package), for tests that drive a
    benchmark's functions and its main() in this process."""
    import importlib.util
    import sys
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # before it runs: its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@contextlib.contextmanager
def benchmark_imports() -> Iterator[None]:
    """benchmarks/ importable for a while, as its scripts import each other. Afterwards the algorithms that the
    imported modules registered are unregistered and the modules forgotten, together: forgetting a learner module
    but keeping its registration makes the next test that imports it fail with "registered twice", and keeping
    the registration shows benchmark learners to tests that walk the registry."""
    from gtep.algorithms import ALGORITHMS

    folder = str(Path(__file__).resolve().parent.parent / "benchmarks")
    modules, algorithms = set(sys.modules), set(ALGORITHMS.names())
    sys.path.insert(0, folder)
    try:
        yield
    finally:
        for name in set(ALGORITHMS.names()) - algorithms:
            ALGORITHMS._entries.pop(name, None)  # noqa: SLF001 - the benchmarks' own registrations, undone
        for name in set(sys.modules) - modules:
            if getattr(sys.modules[name], "__file__", None) and sys.modules[name].__file__.startswith(folder):
                sys.modules.pop(name, None)
        sys.path.remove(folder)


def load(dataset: str = SYNTHETIC) -> ImageSet:
    return resolve_dataset(dataset).load()


def class_images(dataset: str, split: str, classes: list[int], per_class: int | None = None) -> tuple[Any, Any]:
    """The images of `classes` (the first `per_class` of each), normalised as the learner tests feed them, labelled
    by class id (the tests order classes 0..n, so a label is also its position)."""
    import torch

    data = load(dataset)
    x_all, y_all = (data.x_train, data.y_train) if split == "train" else (data.x_test, data.y_test)
    xs, ys = [], []
    for c in classes:
        rows = (y_all == c).nonzero()[0][:per_class]
        xs.append(torch.from_numpy(x_all[rows]))
        ys.append(torch.full((len(rows),), c, dtype=torch.int64))
    x = torch.cat(xs).permute(0, 3, 1, 2).float().div(255)
    return (x - 0.5) / 0.25, torch.cat(ys)


def small_job(algorithm: str, hparams: dict[str, Any] | None = None, *, dataset: str = SYNTHETIC,
              increments: tuple[int, ...] = (4, 3, 3), memory_size: int = 40, epochs: int = 8,
              backbone: str = "resnet8", seed: int = 0, ordering: int = 0) -> tuple[OrderingJob, ImageSet]:
    """The job and data of run_small, for tests that drive an OrderingRun themselves."""
    h = {"epochs": epochs, "lr": 0.05, "batch_size": 32, "scheduler": "cosine", "weight_decay": 5e-4}
    h.update(hparams or {})
    data = load(dataset)
    classes = tuple(range(data.num_classes)) if sum(increments) == data.num_classes else tuple(range(sum(increments)))
    job = OrderingJob(algorithm, h, backbone, tuple(increments), classes, seed=seed, ordering=ordering,
                      memory_size=memory_size, first_task=FirstTaskSpec(epochs=epochs, milestones=(epochs // 2,)))
    return job, data


def run_small(algorithm: str, hparams: dict[str, Any] | None = None, *, on_task_end=None, checkpoint=None,
              **options: Any) -> OrderingOutcome:
    """One ordering of a 3-task scenario; hparams override a quick common recipe (options: see small_job)."""
    job, data = small_job(algorithm, hparams, **options)
    return run_ordering(job, data, on_task_end=on_task_end, checkpoint=checkpoint)


VIT = "vit_micro_patch4_32"
VIT_DATASET = "synthetic:classes=20,train=40,test=20,size=32,noise=110"


# what decides the pretrained ViT's bits besides its recipe: the kernels a process was started with (the golden
# record's pinned process differs from a test worker's)
KERNEL_SWITCHES = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_CBWR")


@lru_cache(maxsize=1)
def pretrained_vit(epochs: int = 6) -> str:
    """A small ViT pretrained on synthetic classes 10-19, kept out of the CL classes 0-9 of run_small_vit.

    Pretrained once per test session and kind of process (the session's $GTEP_CACHE, tests/conftest.py, which
    every worker and the golden record's pinned processes inherit), not once per process: some 10-35 s each."""
    import fcntl
    import os
    import tempfile
    from pathlib import Path

    from gtep.engine.pretrain import PretrainSpec, pretrain

    kernels = "-".join(os.environ.get(switch, "native") for switch in KERNEL_SWITCHES)
    folder = Path(os.environ.get("GTEP_CACHE") or tempfile.mkdtemp(prefix="gtep-vit-"))
    out = folder / f"test-vit-{epochs}-{kernels}.safetensors"
    with open(folder / f"{out.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another worker pretraining the same one: wait for its file
        if not out.exists():
            staged = out.with_name(f"{out.stem}.{os.getpid()}.safetensors")
            pretrain(PretrainSpec(VIT, tuple(range(10, 20)), epochs=epochs, lr=2e-3, batch_size=32, device="cpu"),
                     load(VIT_DATASET), VIT_DATASET, staged)
            staged.replace(out)
    return str(out)


def small_vit_job(algorithm: str, hparams: dict[str, Any] | None = None, *, epochs: int = 3,
                  increments: tuple[int, ...] = (4, 3, 3), seed: int = 0,
                  ordering: int = 0) -> tuple[OrderingJob, ImageSet]:
    """The job and data of run_small_vit, for tests that drive an OrderingRun themselves."""
    h = {"epochs": epochs, "lr": 0.01, "batch_size": 16, "scheduler": "cosine", "optimizer": "sgd", "weight_decay": 0.0}
    h.update(hparams or {})
    job = OrderingJob(algorithm, h, VIT, tuple(increments), tuple(range(sum(increments))), seed=seed,
                      ordering=ordering, memory_size=0, weights=pretrained_vit(), device="cpu")
    return job, load(VIT_DATASET)


def run_small_vit(algorithm: str, hparams: dict[str, Any] | None = None, *, on_task_end=None, checkpoint=None,
                  **options: Any) -> OrderingOutcome:
    """One ordering over classes 0-9 with the pretrained small ViT; hparams override a quick recipe (options:
    see small_vit_job)."""
    job, data = small_vit_job(algorithm, hparams, **options)
    return run_ordering(job, data, on_task_end=on_task_end, checkpoint=checkpoint)


# ---- learner-level tests: drive one learner task by task without the runner

def make_task(index: int, known: int, total: int, per_class: int = 12):
    """Small random images whose mean depends on the class, so training changes the weights."""
    import torch

    from gtep.algorithms import FitRecipe, TaskData

    g = torch.Generator().manual_seed(index)
    y = torch.arange(known, total).repeat_interleave(per_class)
    x = torch.randn(len(y), 3, 16, 16, generator=g) + 0.3 * (y % 3).float().view(-1, 1, 1, 1)
    recipe = FitRecipe(epochs=2, lr=0.05, batch_size=16, weight_decay=5e-4, scheduler="constant",
                       milestones=(), lr_decay=0.1)
    return TaskData(index, known, total, x, y, recipe)


def learn(learner, task, trainer) -> None:
    """One task through the learner's three steps, as the engine drives them."""
    learner.begin_task(task)
    learner.learn_task(task, trainer.fit)
    learner.end_task(task, trainer.fit)


def snapshot(module):
    """Weights and BatchNorm buffers alike."""
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def unchanged(module, before) -> bool:
    import torch

    return all(torch.equal(v, before[k]) for k, v in module.state_dict().items())


# ---- FLUID: a stream over classes 3-8 of a 10-class synthetic set, a backbone pretrained on 0-2

FLUID_OPTIONS = {"pretrain_classes": [0, 1, 2], "n_pretrain_classes": 2, "n_novel_classes": 4, "total_samples": 60,
                 "per_class_cap": 20, "head_cut": 10, "window": 20}


def fluid_job(algorithm: str, hparams: dict[str, Any] | None = None, **options: Any) -> OrderingJob:
    """One FLUID ordering of `algorithm` on synthetic:classes=10 (options override FLUID_OPTIONS)."""
    return OrderingJob(algorithm=algorithm, hparams=hparams or {}, backbone="resnet8", increments=(6,),
                       classes=(3, 4, 5, 6, 7, 8), seed=0, ordering=0, device="cpu", family="fluid",
                       family_options=tuple(sorted({**FLUID_OPTIONS, **options}.items())))


def fluid_config(**fluid: Any) -> dict[str, Any]:
    """An experiment file of the fluid family on synthetic:classes=20 (fluid: the scenario's fluid section)."""
    section = {"pretrain_classes": [0, 1, 2, 3], "n_pretrain_classes": 2, "n_novel_classes": 4,
               "total_samples": 60, "per_class_cap": 20, **fluid}
    return {"study": "f", "algorithm": "fluid_ncm", "backbone": "resnet8",
            "scenario": {"family": "fluid", "fluid": section},
            "datasets": {"split": {"dataset": "synthetic:classes=20,train=20,test=10", "classes": list(range(4, 20)),
                                   "classes_per_phase": 8}}}


# ---- FSCIL: 6 base classes, then 2 sessions of 2 ways x 3 shots

FSCIL = {"base_classes": 6, "ways": 2, "shots": 3, "sessions": 2}


def fscil_experiment(**changes: Any) -> dict[str, Any]:
    """An experiment file of the fscil family on synthetic:classes=24 (changes replace top-level sections)."""
    doc = {"study": "f", "algorithm": "replay", "backbone": "resnet8",
           "scenario": {"family": "fscil", "fscil": dict(FSCIL)},
           "datasets": {"split": {"dataset": "synthetic:classes=24,train=20,test=5", "classes_per_phase": 10}}}
    doc.update(changes)
    return doc
