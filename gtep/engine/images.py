"""A task's images as stored (uint8), standing in for the float tensor of their test view.

Learners treat `TaskData.x` as a float tensor: they index it, concatenate it with their exemplars, pass slices
through the network. At 224 px a task's float copy would not fit on a GPU (a first task of 50 ImageNet classes:
39 GB), and the training crops must come from the stored image, not from the test view. `StoredImages` holds
the uint8 pixels (a quarter of float32's bytes at the stored size) and the phase's pipeline:

- indexing, `len`, `torch.cat` of stored images, `.to` and `.cpu` stay stored (the exemplar memory too);
- `shape`, `dtype` and `device` are those of the test view;
- anything else, a torch function or a tensor method (a forward pass, `.float()`, ...), applies to the test
  view, computed on demand for just those images;
- `Trainer.fit` takes the pixels and applies the pipeline's training transform per batch.

It pickles as its pixels and pipeline, so checkpoints and stored first tasks keep exemplars as uint8.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from gtep.data.pipelines import Pipeline

_CONCATENATIONS = {torch.cat, torch.concat, torch.concatenate}
_OWN = ("pixels", "pipeline")


class StoredImages:
    def __init__(self, pixels: Tensor, pipeline: Pipeline) -> None:
        if pixels.dtype != torch.uint8 or pixels.dim() != 4:
            raise ValueError(f"stored images are uint8 N x C x H x W, got {pixels.dtype} {tuple(pixels.shape)}")
        self.pixels = pixels
        self.pipeline = pipeline

    # ---- what stays stored
    def __len__(self) -> int:
        return self.pixels.shape[0]

    def __getitem__(self, key: Any) -> "StoredImages | Tensor":
        if isinstance(key, int):  # one image: its view, as a tensor would give it
            return StoredImages(self.pixels[key].unsqueeze(0), self.pipeline).as_tensor()[0]
        if isinstance(key, Tensor):
            key = key.to(self.pixels.device)
        return StoredImages(self.pixels[key], self.pipeline)

    def to(self, *args: Any, **kwargs: Any) -> Any:  # StoredImages, or the view as a tensor for a dtype
        """Moves the pixels (a device argument); a dtype argument asks for the view itself, converted."""
        device = kwargs.get("device", args[0] if args else None)
        if isinstance(device, torch.dtype) or "dtype" in kwargs:
            return self.as_tensor().to(*args, **kwargs)
        return StoredImages(self.pixels.to(device), self.pipeline)

    def cpu(self) -> "StoredImages":
        return StoredImages(self.pixels.cpu(), self.pipeline)

    # ---- what the test view would say
    @property
    def shape(self) -> torch.Size:
        side = self.pipeline.output_side(self.pixels.shape[-1])
        return torch.Size((len(self), self.pixels.shape[1], side, side))

    def size(self, dim: int | None = None) -> torch.Size | int:
        return self.shape if dim is None else self.shape[dim]

    def dim(self) -> int:
        return 4

    ndim = property(dim)

    @property
    def dtype(self) -> torch.dtype:
        return torch.float32

    @property
    def device(self) -> torch.device:
        return self.pixels.device

    def as_tensor(self) -> Tensor:
        """The test view: float, normalised, on the pixels' device."""
        return self.pipeline.view(self.pixels)

    def __getattr__(self, name: str) -> Any:
        # Only names this class lacks land here: tensor methods, applied to the view. Private and dunder names
        # (pickle and copy probe __setstate__ before __dict__ is filled) are not forwarded.
        if name.startswith("_") or name in _OWN:
            raise AttributeError(name)
        return getattr(self.as_tensor(), name)

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func in _CONCATENATIONS and args and all(isinstance(t, StoredImages) for t in args[0]):
            parts = list(args[0])
            same = all(p.pipeline == parts[0].pipeline for p in parts[1:])
            if same and not kwargs.get("dim", args[1] if len(args) > 1 else 0):
                return StoredImages(torch.cat([p.pixels for p in parts]), parts[0].pipeline)
        return func(*_views(args), **_views(kwargs))

    def __repr__(self) -> str:
        return f"StoredImages({len(self)} x {tuple(self.pixels.shape[1:])} uint8, view {tuple(self.shape[1:])}, " \
               f"{self.pipeline.spec.describe()}, {self.device})"


def _views(value: Any) -> Any:
    """`value` with every StoredImages inside (lists, tuples, dicts) replaced by its test view."""
    if isinstance(value, StoredImages):
        return value.as_tensor()
    if isinstance(value, (list, tuple)):
        return type(value)(_views(v) for v in value)
    if isinstance(value, dict):
        return {k: _views(v) for k, v in value.items()}
    return value


def images_and_pipeline(x: Tensor | StoredImages) -> tuple[Tensor, Pipeline | None]:
    """(uint8 pixels, pipeline) of stored images; (x, None) of a plain tensor."""
    return (x.pixels, x.pipeline) if isinstance(x, StoredImages) else (x, None)
