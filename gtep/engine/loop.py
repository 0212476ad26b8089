"""The training loop every algorithm's stages go through: optimiser, schedule, batches, augmentation.

No host synchronisation inside the batch loop: the loss is summed on the device and checked once per
epoch, so a non-finite loss ends the run (DivergedError) within one epoch of appearing.
"""
from __future__ import annotations

import threading
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Callable, ContextManager, Iterable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gtep.algorithms.base import FitRecipe
from gtep.data.pipelines import EpochDraws
from gtep.engine.images import StoredImages


class DivergedError(RuntimeError):
    """The training loss became NaN or infinite."""


# In a thread of a fused trial's lockstep (gtep/engine/fusion.py), `parking.fit` takes Trainer.fit's calls, so
# that the orderings' fits run as one fused network; unset everywhere else.
parking = threading.local()


def make_optimizer(params: list[nn.Parameter], recipe: FitRecipe) -> torch.optim.Optimizer:
    if recipe.optimizer == "sgd":
        return torch.optim.SGD(params, lr=recipe.lr, momentum=recipe.momentum, weight_decay=recipe.weight_decay)
    if recipe.optimizer == "adam":
        return torch.optim.Adam(params, lr=recipe.lr, weight_decay=recipe.weight_decay)
    if recipe.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=recipe.lr, weight_decay=recipe.weight_decay)
    raise ValueError(f"unknown optimizer {recipe.optimizer!r}; choose sgd, adam or adamw")


def make_scheduler(optimizer: torch.optim.Optimizer, recipe: FitRecipe) -> torch.optim.lr_scheduler.LRScheduler:
    if recipe.scheduler == "steplr":
        return torch.optim.lr_scheduler.MultiStepLR(optimizer, list(recipe.milestones), gamma=recipe.lr_decay)
    if recipe.scheduler == "cosine":
        return torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=max(recipe.epochs, 1))
    if recipe.scheduler == "constant":
        return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    raise ValueError(f"unknown scheduler {recipe.scheduler!r}; choose steplr, cosine or constant")


@dataclass
class Plateau:
    """Learning-rate decay on a plateau of a validation score (higher is better), in place of the recipe's
    schedule: once `patience` epochs pass without the score beating its best by more than `threshold`, the lr
    is multiplied by the recipe's lr_decay (torch's ReduceLROnPlateau, mode max, absolute threshold, as the IIRC
    reference code runs it). `score` is called after every epoch; what it returned and the lr after each
    epoch's step are kept, for the record and for tests."""

    score: Callable[[], float]
    patience: int
    threshold: float = 1e-3
    scores: list[float] = field(default_factory=list)
    lrs: list[float] = field(default_factory=list)

    def scheduler(self, optimizer: torch.optim.Optimizer,
                  recipe: FitRecipe) -> torch.optim.lr_scheduler.ReduceLROnPlateau:
        return torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, mode="max", factor=recipe.lr_decay,
                                                          patience=self.patience, threshold=self.threshold,
                                                          threshold_mode="abs")

    def step(self, scheduler: torch.optim.lr_scheduler.ReduceLROnPlateau, optimizer: torch.optim.Optimizer) -> None:
        value = float(self.score())
        self.scores.append(value)
        scheduler.step(value)
        self.lrs.append(float(optimizer.param_groups[0]["lr"]))


@dataclass(frozen=True)
class EpochAugmentation:
    """Crop-and-flip of plain float tensors (stored images go through their pipeline instead): the random
    offsets and flips of a whole epoch, drawn on the host and moved to the device at once, so that augmenting
    a batch needs no host-device transfer (on CUDA, each one would stall the host). Pads with 0, which on
    normalised tensors is the mean colour."""

    dy: Tensor
    dx: Tensor
    flip: Tensor
    pad: int = 4

    @classmethod
    def draw(cls, n: int, generator: torch.Generator, device: torch.device, pad: int = 4) -> "EpochAugmentation":
        dy = torch.randint(0, 2 * pad + 1, (n,), generator=generator)
        dx = torch.randint(0, 2 * pad + 1, (n,), generator=generator)
        flip = torch.rand(n, generator=generator) < 0.5
        return cls(dy.to(device, non_blocking=True), dx.to(device, non_blocking=True),
                   flip.to(device, non_blocking=True), pad)

    def apply(self, x: Tensor, start: int) -> Tensor:
        """Random crop with zero padding and horizontal flip of the batch at epoch position `start`."""
        n, _, h, w = x.shape
        window = slice(start, start + n)
        pad, dy, dx, flip = self.pad, self.dy[window], self.dx[window], self.flip[window]
        padded = F.pad(x, (pad, pad, pad, pad))
        rows = dy[:, None] + torch.arange(h, device=x.device)[None, :]  # (n, h)
        cols = dx[:, None] + torch.arange(w, device=x.device)[None, :]  # (n, w)
        batch = torch.arange(n, device=x.device)[:, None, None]
        cropped = padded.permute(0, 2, 3, 1)[batch, rows[:, :, None], cols[:, None, :]].permute(0, 3, 1, 2)
        return torch.where(flip[:, None, None, None], cropped.flip(3), cropped).contiguous()


@dataclass(frozen=True)
class Precision:
    """How the training step runs on the device: autocast dtype and memory format, decided in one place."""

    device_type: str = "cpu"
    autocast_dtype: torch.dtype | None = None  # None: full fp32
    channels_last: bool = False

    @classmethod
    def for_device(cls, device: torch.device, mixed_precision: bool) -> "Precision":
        """bf16 autocast and channels-last on CUDA when switched on; fp32 everywhere else. bf16 keeps fp32's
        exponent range, so unlike fp16 it needs no loss scaling."""
        if mixed_precision and device.type == "cuda":
            return cls(device.type, torch.bfloat16, True)
        return cls(device.type)

    def autocast(self) -> ContextManager:
        if self.autocast_dtype is None:
            return nullcontext()
        return torch.autocast(device_type=self.device_type, dtype=self.autocast_dtype)

    def prepare_modules(self, modules: Iterable[nn.Module]) -> None:
        """Conv weights to channels-last. Tensor by tensor: `Module.to(memory_format=...)` also converts every
        5-D tensor and fails on it (DualPrompt's prompt pool is 5-D), and only 4-D convolutions gain from it."""
        if not self.channels_last:
            return
        for module in modules:
            for tensor in (*module.parameters(), *module.buffers()):
                if tensor.dim() == 4:
                    tensor.data = tensor.data.contiguous(memory_format=torch.channels_last)

    def prepare_batch(self, x: Tensor) -> Tensor:
        return x.contiguous(memory_format=torch.channels_last) if self.channels_last and x.dim() == 4 else x


class BatchSource:
    """The batches of one `fit`: stored images through their pipeline (a random transform per image drawn for
    the whole epoch), plain image tensors through crop-and-flip, anything else as it is."""

    def __init__(self, x: Tensor | StoredImages, generator: torch.Generator, augment: bool) -> None:
        self.x, self.generator = x, generator
        self.augment = augment and (x.pipeline.spec.augments if isinstance(x, StoredImages) else x.dim() == 4)
        self.draws: EpochDraws | EpochAugmentation | None = None

    def new_epoch(self) -> None:
        """Draws after the epoch's permutation, from the same generator: one seed fixes every batch."""
        if not self.augment:
            return
        x, n = self.x, len(self.x)
        if isinstance(x, StoredImages):
            self.draws = x.pipeline.draw(n, self.generator, x.pixels.shape[-1], x.device)
        else:
            self.draws = EpochAugmentation.draw(n, self.generator, x.device)

    def batch(self, idx: Tensor, start: int) -> Tensor:
        x, draws = self.x, self.draws
        if isinstance(x, StoredImages):
            pixels = x.pixels[idx]
            if self.augment and isinstance(draws, EpochDraws):
                return x.pipeline.train(pixels, draws, start)
            return x.pipeline.view(pixels)
        return draws.apply(x[idx], start) if self.augment and isinstance(draws, EpochAugmentation) else x[idx]


class Trainer:
    """Holds the run's device, RNG and precision; `fit` is what learners call for every training stage.

    `x` given to `fit` is either StoredImages (a task's images: each batch goes through the phase pipeline's
    training transform, or its test view when augmentation is off) or a plain tensor (features, logits, or
    images a caller prepared itself: crop-and-flip for 4-D ones when augmenting).
    `augment`: whether random training transforms apply at all (off: the 'none' pipeline).
    `compile`: None, or a torch.compile backend ("inductor" on a GPU) applied to each stage's loss."""

    def __init__(self, device: torch.device, seed: int, augment: bool = True,
                 precision: Precision | None = None, compile: str | bool | None = None) -> None:
        self.device = device
        self.augment = augment
        self.generator = torch.Generator(device="cpu").manual_seed(seed)
        self.precision = precision or Precision(device.type)
        self.compile_backend = "inductor" if compile is True else (compile or None)
        # images through a training step in this process (every stage, exemplars and repeats included): what a
        # study's images/s are counted from (unit events; benchmarks/gpu_study.py)
        self.images_trained = 0

    def step_loss(self, loss_fn: Callable[[Tensor, Tensor], Tensor]) -> Callable[[Tensor, Tensor], Tensor]:
        """The loss as the inner loop calls it: compiled if asked, under the precision's autocast."""
        compiled = torch.compile(loss_fn, backend=self.compile_backend) if self.compile_backend else loss_fn
        precision = self.precision

        def run(xb: Tensor, yb: Tensor) -> Tensor:
            with precision.autocast():
                return compiled(precision.prepare_batch(xb), yb).float()
        return run

    def fit(self, parameters: Iterable[nn.Parameter], loss_fn: Callable[[Tensor, Tensor], Tensor],
            x: Tensor | StoredImages, y: Tensor, recipe: FitRecipe, *, augment: bool = True,
            modules: Iterable[nn.Module] = (), on_epoch: Callable[[int], None] | None = None,
            plateau: Plateau | None = None) -> None:
        """`plateau`: decay the lr on a plateau of a validation score instead of the recipe's schedule."""
        parked = getattr(parking, "fit", None)
        if parked is not None:  # an ordering of a fused trial: the lockstep trains it with its siblings
            parked(self, parameters, loss_fn, x, y, recipe, augment=augment, modules=modules, on_epoch=on_epoch,
                   plateau=plateau)
            return
        params = [p for p in parameters if p.requires_grad]
        if not params or len(x) == 0 or recipe.epochs < 1:
            return
        modules = list(modules)
        for module in modules:
            module.train()
        self.precision.prepare_modules(modules)
        step_loss = self.step_loss(loss_fn)
        optimizer = make_optimizer(params, recipe)
        scheduler = make_scheduler(optimizer, recipe) if plateau is None else None
        on_plateau = plateau.scheduler(optimizer, recipe) if plateau is not None else None
        n, batch = len(x), max(1, recipe.batch_size)
        batches = BatchSource(x, self.generator, augment and self.augment)
        for epoch in range(recipe.epochs):
            order = torch.randperm(n, generator=self.generator).to(x.device)
            batches.new_epoch()
            epoch_loss = torch.zeros((), device=x.device)
            for start in range(0, n, batch):
                idx = order[start : start + batch]
                if len(idx) < 2 and n >= 2:  # BatchNorm cannot train on a single image
                    continue
                xb, yb = batches.batch(idx, start), y[idx]
                loss = step_loss(xb, yb)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                epoch_loss = epoch_loss + loss.detach()
                self.images_trained += len(idx)
            # One host sync per epoch. The weights are checked too: the last step of an epoch (or the only
            # one, on a small task) can blow them up after a finite loss.
            weights = torch.stack([p.detach().float().abs().sum() for p in params]).sum()
            if not bool(torch.isfinite(epoch_loss + weights)):
                raise DivergedError(f"non-finite training loss or weights in epoch {epoch + 1}")
            if plateau is not None and on_plateau is not None:
                plateau.step(on_plateau, optimizer)
            elif scheduler is not None:
                scheduler.step()
            if on_epoch is not None:
                on_epoch(epoch)
