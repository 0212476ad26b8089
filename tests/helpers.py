"""Small, fast class-incremental runs for algorithm tests (synthetic data, a tiny ResNet, CPU)."""
from __future__ import annotations

from functools import lru_cache
from typing import Any

from gtep.data import ImageSet, resolve_dataset
from gtep.engine import FirstTaskSpec, OrderingJob, OrderingOutcome, run_ordering

SYNTHETIC = "synthetic:classes=10,train=40,test=20"


@lru_cache(maxsize=4)
def load(dataset: str = SYNTHETIC) -> ImageSet:
    return resolve_dataset(dataset).load()


def run_small(algorithm: str, hparams: dict[str, Any] | None = None, *, dataset: str = SYNTHETIC,
              increments: tuple[int, ...] = (4, 3, 3), memory_size: int = 40, epochs: int = 8,
              backbone: str = "resnet8", seed: int = 0, ordering: int = 0, on_task_end=None) -> OrderingOutcome:
    """One ordering of a 3-task scenario; hparams override a quick common recipe."""
    h = {"epochs": epochs, "lr": 0.05, "batch_size": 32, "scheduler": "cosine", "weight_decay": 5e-4}
    h.update(hparams or {})
    data = load(dataset)
    classes = tuple(range(data.num_classes)) if sum(increments) == data.num_classes else tuple(range(sum(increments)))
    job = OrderingJob(algorithm, h, backbone, tuple(increments), classes, seed=seed, ordering=ordering,
                      memory_size=memory_size, first_task=FirstTaskSpec(epochs=epochs, milestones=(epochs // 2,)))
    return run_ordering(job, data, on_task_end=on_task_end)
