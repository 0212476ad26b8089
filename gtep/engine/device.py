"""Device choice: the only place that decides between CPU and CUDA (`choose_device`; every caller asks it)."""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Sequence

import torch


class DeviceUnavailableError(RuntimeError):
    """A CUDA device was asked for where torch sees none, and no simulation was asked for."""


class GpuNotVisibleError(DeviceUnavailableError):
    """Ray gave a trial GPUs that torch cannot see, and no simulation was asked for."""


def choose_device(asked: str, cuda_available: bool | None, trial_gpus: float | None = None,
                  simulate: bool = False) -> str:
    """The device name training runs on: the one rule, whoever asks.

    `asked` is training.device or --device: 'auto', 'cpu', 'cuda' or 'cuda:N'. `trial_gpus` are the GPUs of the Ray
    trial that trains (compute.gpus_per_trial, or the ids Ray gave it); None outside a trial (gtep pretrain, the
    study's pretraining, a benchmark). 'auto' inside a trial is CUDA when the trial has GPUs and the CPU when it has
    none, whatever the machine has (Ray placed no GPU there: a GPU it sees may be another trial's); outside a trial
    it is CUDA where torch sees it. `cuda_available` is whether torch sees CUDA where the training runs, None where
    that is not known (the driver of a cluster names the device for workers it cannot see: the workers check it).
    A CUDA device torch cannot see is the CPU with `simulate` (compute.simulate_gpus: Ray's logical GPUs rehearsed
    on CPUs; the calibration, which times such a trial's work on the CPU), else DeviceUnavailableError."""
    device = asked
    if asked == "auto":
        wants_gpu = bool(cuda_available) if trial_gpus is None else trial_gpus > 0
        device = "cuda" if wants_gpu else "cpu"
    if device.startswith("cuda") and cuda_available is False:
        if simulate:
            return "cpu"
        raise DeviceUnavailableError(f"device {asked!r} was asked for but CUDA is not available; use 'cpu' or 'auto'")
    return device


def resolve_device(name: str = "auto") -> torch.device:
    """The torch device of an engine job's name on this machine (choose_device, outside a trial's GPU choice)."""
    return torch.device(choose_device(name, torch.cuda.is_available()))


def describe_device(device: torch.device) -> str:
    """What a run trained on, as a person reads it in MLflow: 'cpu' or 'cuda:0 (NVIDIA H100 80GB HBM3)'."""
    if device.type != "cuda":
        return device.type
    index = device.index if device.index is not None else torch.cuda.current_device()
    return f"cuda:{index} ({torch.cuda.get_device_name(index)})"


@dataclass(frozen=True)
class TrialDevice:
    """Where a trial's units train, and the GPU ids Ray gave it (recorded with each unit)."""

    device: str  # the engine's device name: the one asked for, or 'cpu' when the trial's GPUs are simulated
    gpu_ids: tuple[str, ...]
    simulated: bool = False


def trial_device(asked: str, gpu_ids: Sequence[str | int], cuda_available: bool, simulate: bool) -> TrialDevice:
    """The device of a trial that Ray gave `gpu_ids` (ray.get_gpu_ids()), by choose_device. A GPU torch cannot see
    is a clear error unless `simulate` (compute.simulate_gpus: Ray's logical GPUs rehearsing a GPU cluster on CPUs),
    where the trial runs on the CPU; a trial with no GPUs, one on the CPU, or one whose GPU torch sees keeps
    `asked`."""
    ids = tuple(str(i) for i in gpu_ids)
    if not ids:  # no GPU from Ray: a CUDA device torch cannot see is resolve_device's error, in the engine
        return TrialDevice(asked, ids)
    try:
        device = choose_device(asked, cuda_available, trial_gpus=len(ids), simulate=simulate)
    except DeviceUnavailableError:
        raise GpuNotVisibleError(
            f"Ray gave this trial GPU {', '.join(ids)} but torch sees no CUDA device (CUDA_VISIBLE_DEVICES="
            f"{os.environ.get('CUDA_VISIBLE_DEVICES', '')!r}, torch {torch.__version__}): install a CUDA build of "
            "torch on the workers, or set compute.simulate_gpus: true to rehearse the cluster's GPUs on CPUs"
        ) from None
    return TrialDevice(device, ids, simulated=device == "cpu" and asked != "cpu")
