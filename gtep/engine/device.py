"""Device choice: the only place that decides between CPU and CUDA."""
from __future__ import annotations

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
