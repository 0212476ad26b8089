"""The training loop every algorithm's stages go through: optimiser, schedule, batches, augmentation.

No host synchronisation inside the batch loop: the loss is summed on the device and checked once per
epoch, so a non-finite loss ends the run (DivergedError) within one epoch of appearing.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, ContextManager, Iterable, Protocol, Sequence, TypeVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gtep.algorithms.base import FitRecipe
from gtep.data.pipelines import EpochDraws
from gtep.engine.images import StoredImages
from gtep.registry import Registry


class DivergedError(RuntimeError):
    """The training loss became NaN or infinite."""


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
        """Images to channels-last: a batch (N, C, H, W), or a fused fit's batches with a leading ordering axis
        (S, N, C, H, W), each ordering's slice then channels-last as a plain fit's batch is."""
        if not self.channels_last or x.dim() not in (4, 5):
            return x
        if x.dim() == 4:
            return x.contiguous(memory_format=torch.channels_last)
        return x.permute(0, 1, 3, 4, 2).contiguous().permute(0, 1, 4, 2, 3)


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


LossFn = Callable[[Tensor, Tensor], Tensor]
T = TypeVar("T")


@dataclass
class FitCall:
    """One call of `Trainer.fit`, as a learner made it: what a fit mode runs.

    `owner`: the learner whose loss this is, where the engine knows it (OrderingRun hands each learner a `fit` bound
    to it): the modules a fused fit swaps an ordering's tensors into are the owner's and the call's `modules`."""

    trainer: "Trainer"
    parameters: list[nn.Parameter]
    loss_fn: LossFn
    x: Any
    y: Tensor
    recipe: FitRecipe
    augment: bool = True
    modules: list[nn.Module] = field(default_factory=list)
    on_epoch: Callable[[int], None] | None = None
    plateau: Plateau | None = None
    owner: Any = None

    def options(self) -> list[str]:
        """The fit options this call uses beyond the recipe (a mode states which it runs: FitMode.supports)."""
        return [name for name in ("on_epoch", "plateau") if getattr(self, name) is not None]


class FitStep(Protocol):
    """What differs between fit modes inside the loop: the tensors the optimiser steps, the losses of a step over
    the ordering axis (S = 1 for a plain fit) and each ordering's weights for the divergence check."""

    params: list[Tensor]

    def losses(self, xb: Tensor, yb: Tensor) -> Tensor:
        """(S,) float losses of one step; `xb`, `yb` carry the ordering axis first (S, N, ...)."""

    def weight_sums(self) -> Tensor:
        """(S,) sums of |w| over the trained tensors: non-finite where an ordering's weights blew up."""


class PlainStep:
    """A fit of one network: the loss as the inner loop calls it, compiled if asked, under the precision's autocast."""

    def __init__(self, call: FitCall) -> None:
        trainer = call.trainer
        self.params: list[Tensor] = [p for p in call.parameters if p.requires_grad]
        self.loss_fn = torch.compile(call.loss_fn, backend=trainer.compile_backend) if trainer.compile_backend \
            else call.loss_fn
        self.precision = trainer.precision

    def losses(self, xb: Tensor, yb: Tensor) -> Tensor:
        with self.precision.autocast():
            return self.loss_fn(xb[0], yb[0]).float().reshape(1)

    def weight_sums(self) -> Tensor:
        return torch.stack([p.detach().float().abs().sum() for p in self.params]).sum().reshape(1)


def _ordering_axis(tensors: list[Tensor]) -> Tensor:
    """The orderings' tensors along a leading axis (a view for a plain fit's one: no copy of its batch)."""
    return tensors[0].unsqueeze(0) if len(tensors) == 1 else torch.stack(tensors)


def run_epochs(mode: "FitMode", calls: Sequence[FitCall], step: FitStep) -> list[DivergedError | None]:
    """The epoch loop of every fit, plain or fused: `calls` are the orderings of one fit (one call when plain), all
    with the same recipe and data size; each keeps its own batches (its trainer's generator draws its permutation
    and augmentation), images count and divergence. Returns, per call, None or the DivergedError it ended with.

    No host synchronisation inside the batch loop: the loss is summed on the device and checked once per epoch, so
    a non-finite loss ends the fit within one epoch of appearing. The weights are checked too: the last step of an
    epoch (or the only one, on a small task) can blow them up after a finite loss."""
    first = calls[0]
    recipe, plateau = first.recipe, first.plateau
    errors: list[DivergedError | None] = [None] * len(calls)
    if not step.params or len(first.x) == 0 or recipe.epochs < 1:
        return errors
    for call in calls:
        for module in call.modules:
            module.train()
        call.trainer.precision.prepare_modules(call.modules)
    optimizer = make_optimizer(step.params, recipe)  # type: ignore[arg-type]
    scheduler = plateau.scheduler(optimizer, recipe) if plateau is not None else make_scheduler(optimizer, recipe)
    precision = first.trainer.precision
    n, batch = len(first.x), max(1, recipe.batch_size)
    sources = [BatchSource(c.x, c.trainer.generator, c.augment and c.trainer.augment) for c in calls]
    for epoch in range(recipe.epochs):
        orders = []
        for call, source in zip(calls, sources):
            orders.append(torch.randperm(n, generator=call.trainer.generator).to(call.x.device))
            source.new_epoch()
        epoch_loss = torch.zeros(len(calls), device=first.x.device)
        for start in range(0, n, batch):
            idx = [order[start : start + batch] for order in orders]
            if len(idx[0]) < 2 and n >= 2:  # BatchNorm cannot train on a single image
                continue
            xb = precision.prepare_batch(_ordering_axis([s.batch(i, start) for s, i in zip(sources, idx)]))
            yb = _ordering_axis([c.y[i] for c, i in zip(calls, idx)])
            loss = step.losses(xb, yb)
            optimizer.zero_grad(set_to_none=True)
            loss.sum().backward()
            optimizer.step()
            epoch_loss = epoch_loss + loss.detach()
            for call, error in zip(calls, errors):
                if error is None:
                    mode.count_images(call, len(idx[0]))
        finite = torch.isfinite(epoch_loss + step.weight_sums()).cpu()
        for s, ok in enumerate(finite.tolist()):
            if not ok and errors[s] is None:
                errors[s] = DivergedError(f"non-finite training loss or weights in epoch {epoch + 1}")
        if all(error is not None for error in errors):
            break
        if plateau is not None:
            plateau.step(scheduler, optimizer)  # type: ignore[arg-type]
        else:
            scheduler.step()
        mode.end_epoch(epoch, calls, step)
        if first.on_epoch is not None:
            first.on_epoch(epoch)
    return errors


class FitMode(ABC):
    """How the fits of one unit (an ordering of a trial) run: the seam the unit is given, through its Trainer.

    A mode is one object per unit with a few duties, as Optuna's samplers are (DESIGN.md: one epoch loop):
    `fit` runs one call (every mode goes through `run_epochs`, the one loop), `count_images` and `end_epoch` are
    the loop's seams, `supports` names the fit options it runs (a call using another is refused before it trains,
    by the mode, in one line), and `report` is what the unit's event records of how its fits ran.
    `run_units` runs a trial's units with this mode (one after another by default; the fused mode in lockstep):
    through gtep/engine/orderings.py's run_orderings, the one entry for production and tests alike.

    A new mode is one class registered in FIT_MODES: `FIT_MODES.register("name")(MyFit)`, constructible with no
    arguments (docs/extending.md, tests/engine/test_fit_modes.py)."""

    name: ClassVar[str] = ""
    supports: ClassVar[frozenset[str]] = frozenset({"on_epoch", "plateau"})

    @abstractmethod
    def fit(self, call: FitCall) -> None:
        """Train `call` (raising DivergedError where its loss or weights go non-finite)."""

    def count_images(self, call: FitCall, images: int) -> None:
        call.trainer.images_trained += images

    def end_epoch(self, epoch: int, calls: Sequence[FitCall], step: FitStep) -> None:
        """After each epoch's schedule step; no-op by default (an observer mode records the weights here)."""

    def report(self) -> dict[str, Any]:
        """What the unit's event records of how its fits ran."""
        return {"mode": self.name}

    @classmethod
    def check(cls, algorithm: type, name: str) -> None:
        """Refuse, in one line and before training, a learner this mode cannot train (every learner here)."""

    @classmethod
    def run_units(cls, units: Sequence[Callable[["FitMode"], T]], names: Sequence[str] = ()) -> list[T]:
        """Each unit run with a mode of its own, one after another; their results in order."""
        return [unit(cls()) for unit in units]

    def run_plain(self, call: FitCall) -> None:
        """`call` through the one loop as a network of its own."""
        error = run_epochs(self, [call], PlainStep(call))[0]
        if error is not None:
            raise error


FIT_MODES: Registry[type[FitMode]] = Registry("fit mode")


@FIT_MODES.register("plain")
class PlainFit(FitMode):
    """Each fit trains its network alone: what a unit does unless it is given another mode."""

    name = "plain"

    def fit(self, call: FitCall) -> None:
        self.run_plain(call)


class Trainer:
    """Holds the run's device, RNG, precision and fit mode; `fit` is what learners call for every training stage.

    `x` given to `fit` is either StoredImages (a task's images: each batch goes through the phase pipeline's
    training transform, or its test view when augmentation is off) or a plain tensor (features, logits, or
    images a caller prepared itself: crop-and-flip for 4-D ones when augmenting).
    `augment`: whether random training transforms apply at all (off: the 'none' pipeline).
    `compile`: None, or a torch.compile backend ("inductor" on a GPU) applied to each stage's loss.
    `mode`: how its fits run (FitMode; plain by default), given by the unit that builds the trainer."""

    def __init__(self, device: torch.device, seed: int, augment: bool = True,
                 precision: Precision | None = None, compile: str | bool | None = None,
                 mode: FitMode | None = None) -> None:
        self.device = device
        self.augment = augment
        self.generator = torch.Generator(device="cpu").manual_seed(seed)
        self.precision = precision or Precision(device.type)
        self.compile_backend = "inductor" if compile is True else (compile or None)
        self.mode: FitMode = mode if mode is not None else PlainFit()
        # images through a training step in this process (every stage, exemplars and repeats included): what a
        # study's images/s are counted from (unit events; benchmarks/gpu_study.py)
        self.images_trained = 0

    def fit(self, parameters: Iterable[nn.Parameter], loss_fn: LossFn, x: Tensor | StoredImages, y: Tensor,
            recipe: FitRecipe, *, augment: bool = True, modules: Iterable[nn.Module] = (),
            on_epoch: Callable[[int], None] | None = None, plateau: Plateau | None = None, owner: Any = None) -> None:
        """One training stage, run by the trainer's mode. `plateau`: decay the lr on a plateau of a validation
        score instead of the recipe's schedule; `on_epoch(epoch)` after each epoch; `owner`: the learner whose
        loss it is (OrderingRun binds it: `fit_for`)."""
        self.mode.fit(FitCall(self, list(parameters), loss_fn, x, y, recipe, augment, list(modules), on_epoch, plateau,
                              owner))

    def fit_for(self, owner: Any) -> Callable[..., None]:
        """`fit` with the learner whose stages call it named, as the engine hands it to a learner's hooks."""
        def fit(*args: Any, **kwargs: Any) -> None:
            self.fit(*args, owner=owner, **kwargs)
        return fit
