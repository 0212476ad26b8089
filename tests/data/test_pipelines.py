"""The data pipelines: per-image randomness, the references' shapes, value ranges and test views, the choice
per dataset family, and normalisation statistics."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torchvision.transforms import RandomResizedCrop
from torchvision.transforms.v2 import functional as TF

from gtep.data.pipelines import (
    DATASET_STATISTICS,
    IMAGENET_MEAN,
    IMAGENET_STD,
    Pipeline,
    choose_pipeline,
    crop_and_resize,
    named_pipeline,
    normalisation,
    parse_description,
    pixel_statistics,
    resized_crop_maps,
)


def pipeline(name: str, size: int | None = None, dataset: str = "cifar100:/x") -> Pipeline:
    spec = named_pipeline(name, size)
    mean, std = normalisation(spec, dataset, np.zeros((1, 2, 2, 3), np.uint8))
    return Pipeline(spec, mean, std)


def gradient_images(n: int, side: int) -> torch.Tensor:
    """n copies of one image whose every pixel differs: any two different crops give different outputs."""
    ramp = torch.arange(side * side).view(side, side) % 251
    one = torch.stack([ramp, ramp.t(), (ramp * 7) % 251]).to(torch.uint8)
    return one.expand(n, -1, -1, -1).contiguous()


def train_batch(p: Pipeline, pixels: torch.Tensor, seed: int = 0) -> torch.Tensor:
    draws = p.draw(len(pixels), torch.Generator().manual_seed(seed), pixels.shape[-1], pixels.device)
    return p.train(pixels, draws, 0)


def value_range(p: Pipeline) -> tuple[torch.Tensor, torch.Tensor]:
    """The normalised images of [0, 1] inputs lie channel by channel between these."""
    return (0 - p.mean.view(3)) / p.std.view(3), (1 - p.mean.view(3)) / p.std.view(3)


def distinct(batch: torch.Tensor) -> int:
    return len({tuple(b.flatten().tolist()) for b in batch})


@pytest.mark.parametrize("name, stored, side", [("pycil-cifar", 32, 32), ("pycil-imagenet", 256, 224),
                                                ("pilot", 256, 224), ("pilot-coda", 256, 224), ("pilot", 32, 32)])
def test_training_gives_each_image_its_own_crop_at_the_references_shape_and_range(name, stored, side):
    p = pipeline(name, None if name == "pycil-cifar" else side)
    out = train_batch(p, gradient_images(16, stored))
    assert out.shape == (16, 3, side, side) and out.dtype == torch.float32
    assert distinct(out) == 16, "16 copies of one image, 16 different training images"
    low, high = value_range(p)
    assert (out >= low[None, :, None, None] - 1e-5).all() and (out <= high[None, :, None, None] + 1e-5).all()
    assert not torch.equal(out, train_batch(p, gradient_images(16, stored), seed=1)), "the draws follow the seed"


def test_reference_normalisations():
    assert pipeline("pilot", 224).mean.flatten().tolist() == [0, 0, 0]  # PILOT feeds [0, 1] images
    imagenet = pipeline("pycil-imagenet", 224)
    torch.testing.assert_close(imagenet.std.flatten(), torch.tensor(IMAGENET_STD))
    cifar = pipeline("pycil-cifar", dataset="cifar100:/data")
    torch.testing.assert_close(cifar.mean.flatten(), torch.tensor(DATASET_STATISTICS["cifar100"][0]))
    images = np.random.default_rng(0).integers(0, 256, (50, 8, 8, 3), dtype=np.uint8)
    mean, _ = normalisation(named_pipeline("pycil-cifar"), "npz:/tiny.npz", images)
    np.testing.assert_allclose(mean, images.reshape(-1, 3).mean(0) / 255)  # no constants: the phase's own


def test_pycil_cifar_pads_black_and_jitters_brightness_per_image():
    """A uniform grey image: the padding shows as black (0 before normalising), the rest as grey times each
    image's brightness factor, drawn in [1 - 63/255, 1 + 63/255]."""
    p = pipeline("pycil-cifar", dataset="npz:/none")  # statistics of zeros: mean 0, std ~0 -> use raw scale below
    p = Pipeline(p.spec, (0.0, 0.0, 0.0), (1.0, 1.0, 1.0))
    out = train_batch(p, torch.full((64, 3, 32, 32), 128, dtype=torch.uint8))
    factors = out[:, 0].amax(dim=(1, 2)) / (128 / 255)
    assert (factors >= 1 - 63 / 255 - 1e-6).all() and (factors <= 1 + 63 / 255 + 1e-6).all()
    assert len(set(factors.tolist())) == 64
    assert (out.amin(dim=(1, 2, 3)) == 0).sum() > 48, "most crops take in some black padding"


def test_test_views_are_the_references_resize_and_centre_crop():
    rng = torch.Generator().manual_seed(0)
    stored = torch.randint(0, 256, (4, 3, 256, 256), generator=rng, dtype=torch.uint8)
    # pycil-imagenet: Resize(256) of a 256 px image is itself; CenterCrop(224); ImageNet normalisation
    expected = TF.normalize(TF.center_crop(stored.float() / 255, [224, 224]), list(IMAGENET_MEAN), list(IMAGENET_STD))
    torch.testing.assert_close(pipeline("pycil-imagenet", 224).view(stored), expected)
    # pilot from a smaller stored image: bicubic Resize(256), CenterCrop(224), no normalisation
    small = stored[:, :, :64, :64]
    resized = TF.resize(small.float() / 255, [256, 256], interpolation=TF.InterpolationMode.BICUBIC, antialias=True)
    torch.testing.assert_close(pipeline("pilot", 224).view(small), TF.center_crop(resized.clamp(0, 1), [224, 224]))
    # pycil-cifar and pilot at 32 px: the image itself
    torch.testing.assert_close(pipeline("pilot", 32).view(small[:, :, :32, :32]), small[:, :, :32, :32].float() / 255)


def test_resized_crop_boxes_follow_torchvisions_distribution():
    """Area shares and aspect ratios of 4000 boxes against torchvision's RandomResizedCrop.get_params."""
    n, side = 4000, 64
    theta = resized_crop_maps(n, side, (0.08, 1.0), (3 / 4, 4 / 3), torch.Generator().manual_seed(0),
                              torch.zeros(n, dtype=torch.bool))
    ours_w, ours_h = theta[:, 0, 0] * side, theta[:, 1, 1] * side
    torch.manual_seed(0)
    image = torch.zeros(1, side, side)
    boxes = torch.tensor([RandomResizedCrop.get_params(image, [0.08, 1.0], [3 / 4, 4 / 3])[2:] for _ in range(n)])
    for ours, theirs in ((ours_w * ours_h / side**2, boxes[:, 0] * boxes[:, 1] / side**2),
                         (ours_w / ours_h, boxes[:, 1] / boxes[:, 0])):
        assert abs(ours.mean() - theirs.float().mean()) < 0.02
        assert abs(ours.std() - theirs.float().std()) < 0.02
    assert ((ours_w >= 1) & (ours_w <= side) & (theta[:, 0, 2].abs() + theta[:, 0, 0].abs() <= 1 + 1e-6)).all()


def test_crop_and_resize_samples_the_box_exactly_and_folds_the_flip_in():
    """A box as large as the output is copied pixel for pixel (half-pixel centres), mirrored when flipped."""
    x = torch.rand(2, 3, 20, 20)
    left, top, w = 5, 3, 8
    theta = torch.zeros(2, 2, 3)
    theta[:, 0, 0] = torch.tensor([w / 20, -w / 20])
    theta[:, 1, 1] = w / 20
    theta[:, 0, 2] = (2 * left + w) / 20 - 1
    theta[:, 1, 2] = (2 * top + w) / 20 - 1
    out = crop_and_resize(x, theta, w)
    box = x[:, :, top : top + w, left : left + w]
    torch.testing.assert_close(out[0], box[0], atol=1e-5, rtol=0)
    torch.testing.assert_close(out[1], box[1].flip(2), atol=1e-5, rtol=0)


@pytest.mark.parametrize("augment, dataset, backbone, algorithm, expected", [
    (True, "npz:/tiny.npz", "resnet32", "replay", "pycil-cifar"),
    (True, "cifar100:/data", "resnet32", "icarl", "pycil-cifar"),
    (True, "imagefolder:/imagenet", "resnet18_imagenet", "replay", "pycil-imagenet@224"),
    (True, "imagefolder:/imagenet-r", "vit_base_patch16_224", "l2p", "pilot@224"),
    (True, "npz:/tiny.npz", "vit_micro_patch4_32", "l2p", "pilot@32"),
    (True, "imagefolder:/imagenet-r", "vit_base_patch16_224", "coda_prompt", "pilot-coda@224"),
    (False, "imagefolder:/imagenet", "resnet18", "replay", "none/pycil-imagenet@224"),
    ("none", "npz:/tiny.npz", "resnet32", "replay", "none/pycil-cifar"),
    ("pilot", "npz:/tiny.npz", "vit_micro_patch4_32", "replay", "pilot@32"),
    ("pycil-imagenet@64", "imagefolder:/imagenet", "resnet18", "replay", "pycil-imagenet@64"),
])
def test_the_dataset_family_chooses_the_pipeline_and_the_description_reads_back(augment, dataset, backbone,
                                                                                 algorithm, expected):
    spec = choose_pipeline(augment, dataset, backbone, algorithm)
    assert spec.describe() == expected
    assert parse_description(spec.describe()) == spec
    assert choose_pipeline(spec.describe(), dataset, backbone, algorithm) == spec


def test_image_size_overrides_the_side_and_the_storage_follows():
    spec = choose_pipeline(True, "imagefolder:/imagenet", "resnet18", "replay", image_size=64)
    assert (spec.size, spec.test_resize, spec.storage_side()) == (64, 73, 73)
    assert choose_pipeline(True, "imagefolder:/x", "resnet18", "replay").storage_side() == 256
    assert choose_pipeline(True, "cifar100:/x", "resnet32", "replay", image_size=64).size is None  # 32 px stays


def test_pixel_statistics_are_exact_where_float32_sums_drift():
    images = np.random.default_rng(1).integers(0, 256, (3000, 32, 32, 3), dtype=np.uint8)
    mean, std = pixel_statistics(images, chunk=512)
    exact = images.reshape(-1, 3).astype(np.int64)
    exact_mean = exact.sum(0) / len(exact) / 255
    exact_var = (np.square(exact).sum(0) / len(exact) - (exact.sum(0) / len(exact)) ** 2) / 255**2
    np.testing.assert_allclose(mean, exact_mean, rtol=0, atol=1e-12)
    np.testing.assert_allclose(np.square(std), exact_var, rtol=0, atol=1e-12)
    rows = np.arange(0, 3000, 7)
    np.testing.assert_allclose(pixel_statistics(images, rows)[0], images[rows].reshape(-1, 3).mean(0) / 255, atol=1e-12)
