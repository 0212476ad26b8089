"""Freshly built backbones are initialised as the reference toolboxes initialise them."""
from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from gtep.models import create_backbone


def convs_and_norms(name: str) -> tuple[list[nn.Conv2d], list[nn.BatchNorm2d]]:
    torch.manual_seed(0)
    net = create_backbone(name)
    return ([m for m in net.modules() if isinstance(m, nn.Conv2d)],
            [m for m in net.modules() if isinstance(m, nn.BatchNorm2d)])


@pytest.mark.parametrize("name", ["resnet8", "resnet32", "resnet18", "resnet18_imagenet"])
def test_conv_weights_are_he_normal_with_fan_out(name):
    """PyCIL: N(0, sqrt(2 / (k * k * out_channels))). PyTorch's default would give a std of 1 / sqrt(3 * fan_in),
    under half of it for every conv here, so the check fails on a backbone that kept the default."""
    convs, _ = convs_and_norms(name)
    assert convs
    for conv in convs:
        k_h, k_w = conv.kernel_size
        expected = math.sqrt(2 / (k_h * k_w * conv.out_channels))
        w = conv.weight.detach()
        tolerance = 4 / math.sqrt(2 * w.numel())  # four standard errors of a sample std
        assert abs(w.std().item() / expected - 1) < max(tolerance, 0.02), (conv, w.std().item(), expected)
        assert abs(w.mean().item()) < 4 * expected / math.sqrt(w.numel())
        # normal, not uniform: a uniform draw never leaves sqrt(3) standard deviations
        if w.numel() >= 1000:
            assert (w.abs() > math.sqrt(3) * expected).any()


@pytest.mark.parametrize("name", ["resnet32", "resnet18"])
def test_batchnorm_starts_as_identity(name):
    _, norms = convs_and_norms(name)
    assert norms
    for bn in norms:
        assert torch.equal(bn.weight.detach(), torch.ones_like(bn.weight))
        assert torch.equal(bn.bias.detach(), torch.zeros_like(bn.bias))


def test_the_imagenet_resnet18_has_torchvisions_stem():
    """A 224 px image leaves the stem at 56 px (stride 2 and a max-pool); the small-input stem keeps 224."""
    x = torch.zeros(1, 3, 224, 224)
    imagenet, small = create_backbone("resnet18_imagenet").eval(), create_backbone("resnet18").eval()
    with torch.no_grad():
        assert imagenet.stem(x).shape[-1] == 56 and small.stem(x).shape[-1] == 224
        assert imagenet(x)["features"].shape == (1, 512)
