"""Data pipelines as the reference toolboxes train and test, run on whole batches on the run's device.

The paper's numbers come from PyCIL (ResNet methods) and LAMDA-PILOT (pretrained-ViT methods); a gtep run feeds
its network as they do, per dataset family:

    pycil-cifar     train: RandomCrop(32, padding=4) (black padding), flip, ColorJitter(brightness=63/255);
                    test: the image; normalised with the dataset's constants (CIFAR-100's), else the phase's own
    pycil-imagenet  train: RandomResizedCrop(224), flip; test: Resize(256) + CenterCrop(224); ImageNet mean/std
    pilot           train: RandomResizedCrop(224, scale=(0.05, 1), ratio=(3/4, 4/3)), flip;
                    test: bicubic Resize(256) + CenterCrop(224) (none at 32 px or less); no normalisation
    pilot-coda      CODA-Prompt in PILOT: RandomResizedCrop(224) at its default scale, bilinear test resize
    none            the dataset's default pipeline without its random training transform

Images are stored once (uint8, N x 3 x S x S); `Pipeline.view` is the test transform of a batch, `Pipeline.train`
the training transform with parameters drawn per image for a whole epoch at once (`Pipeline.draw`, on the host
from the run's one seeded generator, moved to the device in one copy): every image gets its own crop, and no
batch waits for the host. Resizing crops use `grid_sample` (bilinear, border-clamped like torchvision's resize).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
# PyCIL's and PILOT's constants, keyed by the dataset scheme; other datasets use their phase's statistics.
DATASET_STATISTICS = {"cifar100": ((0.5071, 0.4867, 0.4408), (0.2675, 0.2565, 0.2761))}
NAMES = ("pycil-cifar", "pycil-imagenet", "pilot", "pilot-coda", "none")


@dataclass(frozen=True)
class PipelineSpec:
    """What a pipeline does, in the references' terms. `size`: the side the network sees (None: the stored one)."""

    name: str
    crop: Literal["pad", "resized", "none"]
    size: int | None = None
    pad: int = 4
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)
    flip: bool = True
    brightness: float = 0.0
    test_resize: int | None = None  # the short side before the centre crop (256 for 224); None: resize to `size`
    interpolation: Literal["bilinear", "bicubic"] = "bilinear"  # of the test resize (and of decoding to storage)
    normalise: Literal["imagenet", "dataset", "none"] = "dataset"

    @property
    def augments(self) -> bool:
        return self.crop != "none" or self.flip or self.brightness > 0

    def describe(self) -> str:
        """The name recorded with a run; `parse_description` reads it back (with the dataset, it is the pipeline)."""
        return self.name if self.size is None else f"{self.name}@{self.size}"

    def storage_side(self, default: int = 32) -> int:
        """The side ImageFolder images are decoded to once (short side, centre square): the test resize's."""
        return self.test_resize or self.size or default


def named_pipeline(name: str, size: int | None = None) -> PipelineSpec:
    """One of NAMES (not 'none') at a network input side; resizing pipelines default to the paper's 224 px."""
    if name == "pycil-cifar":
        return PipelineSpec(name, "pad", size, brightness=63 / 255, normalise="dataset")
    side = size or 224
    test_resize = int(256 / 224 * side)  # PILOT's rule, which keeps 224's ratio: 256 for 224
    if name == "pycil-imagenet":
        return PipelineSpec(name, "resized", side, test_resize=test_resize, normalise="imagenet")
    if name == "pilot":
        # PILOT resizes test images only when the input is larger than 32 px (build_transform's resize_im)
        return PipelineSpec(name, "resized", side, scale=(0.05, 1.0), test_resize=test_resize if side > 32 else None,
                            interpolation="bicubic", normalise="none")
    if name == "pilot-coda":
        return PipelineSpec(name, "resized", side, test_resize=test_resize, normalise="none")
    raise ValueError(f"unknown pipeline {name!r}; choose from {list(NAMES)}")


def without_augmentation(spec: PipelineSpec) -> PipelineSpec:
    """'none': train on the test view of the dataset's default pipeline."""
    return replace(spec, name=f"none/{spec.name}", crop="none", flip=False, brightness=0.0)


def parse_description(text: str) -> PipelineSpec:
    """The inverse of PipelineSpec.describe: 'pycil-imagenet@224', 'none/pycil-cifar', 'pilot@32'."""
    name, _, size = text.partition("@")
    base, slash, inner = name.partition("/")
    spec = named_pipeline(inner if slash else base, int(size) if size else None)
    if slash:
        if base != "none":
            raise ValueError(f"pipeline {text!r}: only 'none/<pipeline>' takes another pipeline's view")
        return without_augmentation(spec)
    return spec


def vit_input_side(backbone: str) -> int:
    """The side a ViT backbone was built for: the small ViTs' own, or the _<size> ending timm's names carry."""
    from gtep.models.vit import SMALL_VITS

    if backbone in SMALL_VITS:
        return SMALL_VITS[backbone][0]
    match = re.search(r"_(\d+)(?:\.|$)", backbone)
    return int(match.group(1)) if match else 224


def default_pipeline(dataset: str, backbone: str, algorithm: str, image_size: int | None = None) -> PipelineSpec:
    """The family a dataset trains with: a pretrained ViT as PILOT trains it (at the ViT's input side), ImageFolder
    trees as PyCIL trains ImageNet-100 (224 px), everything else (32 px arrays) as PyCIL trains CIFAR-100, at
    the stored side (`image_size` sets the resizing pipelines' side only)."""
    from gtep.models.vit import is_vit

    if is_vit(backbone):
        name = "pilot-coda" if algorithm == "coda_prompt" else "pilot"
        return named_pipeline(name, image_size or vit_input_side(backbone))
    if dataset.startswith("imagefolder:"):
        return named_pipeline("pycil-imagenet", image_size)
    return named_pipeline("pycil-cifar")


def choose_pipeline(augment: bool | str, dataset: str, backbone: str, algorithm: str,
                    image_size: int | None = None) -> PipelineSpec:
    """training.augment resolved: true = the dataset's default, false = 'none', a name, or a recorded description."""
    if augment is True or augment == "default":
        return default_pipeline(dataset, backbone, algorithm, image_size)
    if augment is False or augment == "none":
        return without_augmentation(default_pipeline(dataset, backbone, algorithm, image_size))
    if "@" in augment or "/" in augment:
        return parse_description(augment)
    if augment in ("pilot", "pilot-coda") and image_size is None:
        from gtep.models.vit import is_vit

        image_size = vit_input_side(backbone) if is_vit(backbone) else None
    return named_pipeline(augment, image_size)


# ---------------------------------------------------------------- normalisation statistics

def pretrained_normalisation(weights: str | None) -> tuple[tuple[float, ...], tuple[float, ...]] | None:
    """The (mean, std) a weights file from gtep pretrain was trained with (its metadata), else None."""
    if not weights:
        return None
    from gtep.models.vit import weights_metadata

    meta = weights_metadata(Path(weights))
    if "gtep.mean" not in meta or "gtep.std" not in meta:
        return None
    return (tuple(float(v) for v in meta["gtep.mean"].split(",")), tuple(float(v) for v in meta["gtep.std"].split(",")))


def pixel_statistics(images: np.ndarray, rows: np.ndarray | None = None,
                     chunk: int = 4096) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-channel mean and (population) std in [0, 1] of uint8 NHWC images (those at `rows`, or all), summed
    in float64 chunk by chunk: float32 sums over millions of pixels drift by up to 3.5e-4, and a float copy
    of a phase may not fit in memory."""
    rows = np.arange(len(images)) if rows is None else rows
    total = np.zeros(3)
    squares = np.zeros(3)
    count = 0
    for start in range(0, len(rows), chunk):
        block = np.asarray(images[rows[start : start + chunk]], dtype=np.float64).reshape(-1, 3) / 255
        total += block.sum(0)
        squares += np.square(block).sum(0)
        count += len(block)
    mean = total / max(count, 1)
    std = np.sqrt(np.maximum(squares / max(count, 1) - mean**2, 0))
    return tuple(mean.tolist()), tuple(std.tolist())


def normalisation(spec: PipelineSpec, dataset: str, train_images: np.ndarray, rows: np.ndarray | None = None,
                  pretrained: tuple[tuple[float, ...], tuple[float, ...]] | None = None
                  ) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(mean, std) the pipeline divides by: fixed constants, or the statistics of the phase's training images
    (`train_images` at `rows`). `pretrained`: what the network's weights were pretrained with (gtep pretrain
    records it): weights are fed as they learnt. PILOT's own [0, 1] applies to weights that do not say (the
    paper's ImageNet-21k ViT-B/16)."""
    if pretrained is not None:
        return pretrained
    if spec.normalise == "imagenet":
        return IMAGENET_MEAN, IMAGENET_STD
    if spec.normalise == "none":
        return (0.0, 0.0, 0.0), (1.0, 1.0, 1.0)
    known = DATASET_STATISTICS.get(dataset.partition(":")[0])
    if known is not None:
        return known
    mean, std = pixel_statistics(train_images, rows)
    return mean, tuple(s + 1e-6 for s in std)


# ---------------------------------------------------------------- the transforms, on batches

@dataclass(frozen=True)
class EpochDraws:
    """One epoch's random parameters, one row per image of the epoch's order, already on the device.
    pad crops: offsets (n, 2) and flips; resized crops: affine maps (n, 2, 3) with the flip folded in."""

    offsets: Tensor | None = None
    flips: Tensor | None = None
    theta: Tensor | None = None
    brightness: Tensor | None = None


class Pipeline:
    """A PipelineSpec with its normalisation on the device: `view` (test) and `train` transforms of uint8 batches."""

    def __init__(self, spec: PipelineSpec, mean: tuple[float, ...], std: tuple[float, ...],
                 device: torch.device | str = "cpu") -> None:
        self.spec = spec
        self.mean = torch.tensor(mean, dtype=torch.float32, device=device).view(1, 3, 1, 1)
        self.std = torch.tensor(std, dtype=torch.float32, device=device).view(1, 3, 1, 1)

    def __eq__(self, other: object) -> bool:
        """The same transforms: a pipeline restored from a checkpoint equals the one it was saved from."""
        return isinstance(other, Pipeline) and self.spec == other.spec and \
            torch.equal(self.mean.cpu(), other.mean.cpu()) and torch.equal(self.std.cpu(), other.std.cpu())

    __hash__ = None  # type: ignore[assignment]

    def output_side(self, stored_side: int) -> int:
        return self.spec.size or stored_side

    def normalise(self, x: Tensor) -> Tensor:
        mean, std = self.mean.to(x.device), self.std.to(x.device)  # no copy on the pipeline's own device
        return ((x - mean) / std).contiguous()

    # ---- test
    def view(self, pixels: Tensor) -> Tensor:
        """Test transform: resize so the side is `test_resize` (or `size`), centre crop to `size`, normalise."""
        return self.normalise(self._geometry(pixels))

    def _geometry(self, pixels: Tensor) -> Tensor:
        x = pixels.float().div_(255)
        spec, side = self.spec, pixels.shape[-1]
        target = spec.test_resize or spec.size or side
        if target != side:
            x = F.interpolate(x, size=(target, target), mode=spec.interpolation, antialias=True,
                              align_corners=False).clamp_(0, 1)
        out = spec.size or target
        if out < target:
            top = round((target - out) / 2.0)  # torchvision's CenterCrop offset
            x = x[:, :, top : top + out, top : top + out]
        return x

    # ---- training
    def draw(self, n: int, generator: torch.Generator, stored_side: int, device: torch.device) -> EpochDraws:
        spec = self.spec
        flips = torch.rand(n, generator=generator) < 0.5 if spec.flip else torch.zeros(n, dtype=torch.bool)
        brightness = None
        if spec.brightness > 0:
            low, high = max(0.0, 1 - spec.brightness), 1 + spec.brightness
            brightness = (low + (high - low) * torch.rand(n, generator=generator)).to(device, non_blocking=True)
        if spec.crop == "pad":
            offsets = torch.randint(0, 2 * spec.pad + 1, (n, 2), generator=generator)
            return EpochDraws(offsets=offsets.to(device, non_blocking=True), flips=flips.to(device, non_blocking=True),
                              brightness=brightness)
        if spec.crop == "resized":
            theta = resized_crop_maps(n, stored_side, spec.scale, spec.ratio, generator, flips)
            return EpochDraws(theta=theta.to(device, non_blocking=True), brightness=brightness)
        return EpochDraws(flips=flips.to(device, non_blocking=True), brightness=brightness)

    def train(self, pixels: Tensor, draws: EpochDraws, start: int) -> Tensor:
        """Training transform of the batch at epoch position `start`: each image its own crop, flip and jitter."""
        n, spec = len(pixels), self.spec
        rows = slice(start, start + n)
        if spec.crop == "resized":
            assert draws.theta is not None, "a resized crop draws its boxes"
            x = crop_and_resize(pixels.float().div_(255), draws.theta[rows], self.output_side(pixels.shape[-1]))
        else:
            x = self._geometry(pixels)
            if spec.crop == "pad":
                assert draws.offsets is not None, "a pad crop draws its offsets"
                x = pad_and_crop(x, draws.offsets[rows], spec.pad)
            if draws.flips is not None and spec.flip:
                x = torch.where(draws.flips[rows, None, None, None], x.flip(3), x)
        if draws.brightness is not None:
            x = (x * draws.brightness[rows, None, None, None]).clamp_(0, 1)
        return self.normalise(x)


def pad_and_crop(x: Tensor, offsets: Tensor, pad: int) -> Tensor:
    """torchvision's RandomCrop(side, padding=pad) per image: zero padding of the [0, 1] image (black, as the
    reference pads the raw image before normalising), then a crop at each image's own offset, as one gather."""
    n, _, h, w = x.shape
    padded = F.pad(x, (pad, pad, pad, pad))
    rows = offsets[:, 0, None] + torch.arange(h, device=x.device)[None, :]
    cols = offsets[:, 1, None] + torch.arange(w, device=x.device)[None, :]
    batch = torch.arange(n, device=x.device)[:, None, None]
    return padded.permute(0, 2, 3, 1)[batch, rows[:, :, None], cols[:, None, :]].permute(0, 3, 1, 2)


def resized_crop_maps(n: int, side: int, scale: tuple[float, float], ratio: tuple[float, float],
                      generator: torch.Generator, flips: Tensor) -> Tensor:
    """torchvision's RandomResizedCrop.get_params for n square images of `side` px, vectorised: ten tries per
    image of an area share in `scale` and a log-uniform aspect ratio in `ratio`; the first box that fits is
    placed uniformly; none fits: the centre crop of the largest box within the ratio. Returned as the affine
    maps grid_sample needs (output coordinates in [-1, 1] to input ones), flips folded in."""
    area = side * side
    tries = 10
    target = area * (scale[0] + (scale[1] - scale[0]) * torch.rand(n, tries, generator=generator, dtype=torch.float64))
    log_lo, log_hi = math.log(ratio[0]), math.log(ratio[1])
    aspect = torch.exp(log_lo + (log_hi - log_lo) * torch.rand(n, tries, generator=generator, dtype=torch.float64))
    w = torch.sqrt(target * aspect).round()
    h = torch.sqrt(target / aspect).round()
    fits = (w > 0) & (h > 0) & (w <= side) & (h <= side)
    first = torch.argmax(fits.int(), dim=1)
    found = fits.any(dim=1)
    w = torch.where(found, w.gather(1, first[:, None]).squeeze(1), torch.tensor(float(side), dtype=torch.float64))
    h = torch.where(found, h.gather(1, first[:, None]).squeeze(1), torch.tensor(float(side), dtype=torch.float64))
    if not (ratio[0] <= 1 <= ratio[1]):  # a square image outside the ratio range: the fallback trims one side
        fallback_w = side if ratio[0] > 1 else round(side * ratio[1])
        fallback_h = round(side / ratio[0]) if ratio[0] > 1 else side
        w = torch.where(found, w, torch.tensor(float(min(fallback_w, side)), dtype=torch.float64))
        h = torch.where(found, h, torch.tensor(float(min(fallback_h, side)), dtype=torch.float64))
    u = torch.rand(n, 2, generator=generator, dtype=torch.float64)
    top = torch.where(found, torch.floor(u[:, 0] * (side - h + 1)), torch.floor((side - h) / 2))
    left = torch.where(found, torch.floor(u[:, 1] * (side - w + 1)), torch.floor((side - w) / 2))
    theta = torch.zeros(n, 2, 3, dtype=torch.float64)
    theta[:, 0, 0] = torch.where(flips, -w / side, w / side)
    theta[:, 0, 2] = (2 * left + w) / side - 1
    theta[:, 1, 1] = h / side
    theta[:, 1, 2] = (2 * top + h) / side - 1
    return theta.float()


def crop_and_resize(x: Tensor, theta: Tensor, side: int) -> Tensor:
    """Each image's box resized to side x side (bilinear, half-pixel centres, edges clamped), in one call."""
    grid = F.affine_grid(theta.to(x.dtype), [len(x), x.shape[1], side, side], align_corners=False)
    return F.grid_sample(x, grid, mode="bilinear", padding_mode="border", align_corners=False)
