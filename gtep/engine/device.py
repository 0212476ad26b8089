"""Device choice: the only place that decides between CPU and CUDA."""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Sequence

import torch


def resolve_device(name: str = "auto") -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError(f"device {name!r} was asked for but CUDA is not available; use 'cpu' or 'auto'")
    return torch.device(name)


def describe_device(device: torch.device) -> str:
    """What a run trained on, as a person reads it in MLflow: 'cpu' or 'cuda:0 (NVIDIA H100 80GB HBM3)'."""
    if device.type != "cuda":
        return device.type
    index = device.index if device.index is not None else torch.cuda.current_device()
    return f"cuda:{index} ({torch.cuda.get_device_name(index)})"


class GpuNotVisibleError(RuntimeError):
    """Ray gave a trial GPUs that torch cannot see, and no simulation was asked for."""


@dataclass(frozen=True)
class TrialDevice:
    """Where a trial's units train, and the GPU ids Ray gave it (recorded with each unit)."""

    device: str  # the engine's device name: the one asked for, or 'cpu' when the trial's GPUs are simulated
    gpu_ids: tuple[str, ...]
    simulated: bool = False


def trial_device(asked: str, gpu_ids: Sequence[str | int], cuda_available: bool, simulate: bool) -> TrialDevice:
    """The device of a trial that Ray gave `gpu_ids` (ray.get_gpu_ids()). A GPU torch cannot see is a clear error
    unless `simulate` (compute.simulate_gpus: Ray's logical GPUs rehearsing a GPU cluster on CPUs), where the
    trial runs on the CPU; a trial with no GPUs, one on the CPU, or one whose GPU torch sees keeps `asked`."""
    ids = tuple(str(i) for i in gpu_ids)
    if not ids or not asked.startswith("cuda") or cuda_available:
        return TrialDevice(asked, ids)
    if simulate:
        return TrialDevice("cpu", ids, simulated=True)
    raise GpuNotVisibleError(
        f"Ray gave this trial GPU {', '.join(ids)} but torch sees no CUDA device (CUDA_VISIBLE_DEVICES="
        f"{os.environ.get('CUDA_VISIBLE_DEVICES', '')!r}, torch {torch.__version__}): install a CUDA build of torch "
        "on the workers, or set compute.simulate_gpus: true to rehearse the cluster's GPUs on CPUs")
