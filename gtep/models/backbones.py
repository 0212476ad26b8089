"""Backbones for class-incremental learning, registered by name.

Every backbone maps images (N, 3, H, W) to {"fmaps": [stage outputs], "features": (N, out_dim)} and
exposes `out_dim`. The stage maps are what PODNet distils; the flat features feed the heads.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gtep.models.base import Backbone
from gtep.registry import Registry

# plugins: the gtep.backbones entry points (gtep.plugins), loaded at the first lookup
BACKBONES: Registry[Callable[..., Backbone]] = Registry("backbone", group="gtep.backbones")


def create_backbone(name: str, weights: str | None = None) -> Backbone:
    """A registered backbone, or any timm ViT by name (wrapped so prompts and adapters can be passed in).
    Local weights: a ViT's (the pretrained-model setting of the paper, section 4.2), or a registered CNN's
    state as gtep pretrain saves it (pretrained on classes kept out of both phases, e.g. for continual
    few-shot learning, where a backbone cannot be learnt from a few shots)."""
    from gtep.models.vit import PromptableViT, WeightsError, create_timm_vit, is_vit, load_state

    if is_vit(name):
        return PromptableViT(create_timm_vit(name, weights))
    net = BACKBONES.get(name)()
    if weights:
        # every key must match: a file of another architecture must fail here, not train a half-loaded network
        missing, unexpected = net.load_state_dict(load_state(Path(weights)), strict=False)
        if missing or unexpected:
            raise WeightsError(f"weights {weights} do not fit {name}: "
                               f"missing {missing[:3]}, unexpected {unexpected[:3]}")
    return net


def backbone_exists(name: str) -> bool:
    from gtep.models.vit import SMALL_VITS, is_vit

    if name in BACKBONES or name in SMALL_VITS:
        return True
    if is_vit(name):
        import timm

        return bool(timm.is_model(name))
    return False


class _BasicBlock(nn.Module):
    """The CIFAR ResNet block of He et al. 2016 (option A: the shortcut pads channels, no extra weights)."""

    def __init__(self, in_planes: int, planes: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.pad = planes - in_planes
        self.stride = stride

    def forward(self, x: Tensor) -> Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        shortcut = x
        if self.stride != 1 or self.pad:
            channels = (self.pad // 2, self.pad - self.pad // 2)  # zero channels on both sides (option A)
            shortcut = F.pad(x[:, :, :: self.stride, :: self.stride], (0, 0, 0, 0, *channels))
        return F.relu(out + shortcut)


def init_as_pycil(module: nn.Module) -> None:
    """He initialisation with fan-out, as PyCIL's CIFAR ResNets and torchvision's ResNets draw their weights:
    conv weights ~ N(0, sqrt(2 / (k * k * out_channels))), BatchNorm weight 1 and bias 0.

    PyTorch's default (Kaiming-uniform with a = sqrt(5)) has about a sixth of that variance. BatchNorm makes
    the forward pass indifferent to the scale, but not the optimiser: SGD's step is the same size on smaller
    weights, so the network would start with a several times larger effective learning rate than the reference."""
    for m in module.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
        elif isinstance(m, (nn.BatchNorm2d, nn.GroupNorm)):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)


class StagedResNet(Backbone):
    """A stem, then stages whose outputs are the fmaps; the features are the last one's global average."""

    stem: nn.Module
    stages: nn.ModuleList

    def forward(self, x: Tensor) -> dict[str, Tensor | list[Tensor]]:
        x = self.stem(x)
        fmaps = []
        for stage in self.stages:
            x = stage(x)
            fmaps.append(x)
        return {"fmaps": fmaps, "features": torch.flatten(F.adaptive_avg_pool2d(x, 1), 1)}


class CifarResNet(StagedResNet):
    """ResNet-(6n+2) for 32x32 inputs (He et al. 2016, section 4.2): 16/32/64 channels, 64-d features.
    ResNet-32 (n=5) is the backbone PyCIL uses for CIFAR-100, initialised as PyCIL does."""

    def __init__(self, blocks_per_stage: int, width: int = 16) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU())
        stages, in_planes = [], width
        for i, planes in enumerate((width, 2 * width, 4 * width)):
            layers = []
            for b in range(blocks_per_stage):
                layers.append(_BasicBlock(in_planes, planes, 2 if (b == 0 and i > 0) else 1))
                in_planes = planes
            stages.append(nn.Sequential(*layers))
        self.stages = nn.ModuleList(stages)
        self.out_dim = in_planes
        init_as_pycil(self)


class ResNet18(StagedResNet):
    """torchvision's ResNet-18 (its own initialisation, 512-d features) with the stem PyCIL gives it per dataset.

    small_inputs: a 3x3 stride-1 stem and no max-pool, as PyCIL builds it for CIFAR, so 32x32 images keep
    spatial detail through the four stages. Otherwise torchvision's 7x7 stride-2 stem and max-pool, as PyCIL
    builds it for ImageNet-100 (10 tasks): at 224 px it costs a sixteenth of the small-input stem."""

    def __init__(self, small_inputs: bool = True) -> None:
        super().__init__()
        from torchvision.models import resnet18

        net = resnet18(weights=None)
        if small_inputs:
            net.conv1 = nn.Conv2d(3, 64, 3, 1, 1, bias=False)
            nn.init.kaiming_normal_(net.conv1.weight, mode="fan_out", nonlinearity="relu")  # as torchvision's own
            self.stem = nn.Sequential(net.conv1, net.bn1, net.relu)
        else:
            self.stem = nn.Sequential(net.conv1, net.bn1, net.relu, net.maxpool)
        self.stages = nn.ModuleList([net.layer1, net.layer2, net.layer3, net.layer4])
        self.out_dim = 512


@BACKBONES.register("resnet32")
def resnet32() -> Backbone:
    return CifarResNet(5)


@BACKBONES.register("resnet20")
def resnet20() -> Backbone:
    return CifarResNet(3)


@BACKBONES.register("resnet8")
def resnet8() -> Backbone:
    """The smallest member of the family (1 block per stage): smoke runs and unit tests on a CPU."""
    return CifarResNet(1)


@BACKBONES.register("resnet18")
def resnet18() -> Backbone:
    return ResNet18(small_inputs=True)


@BACKBONES.register("resnet18_imagenet")
def resnet18_imagenet() -> Backbone:
    """PyCIL's ImageNet-100 network: torchvision's stem (7x7 stride 2 and a max-pool), for 224 px images."""
    return ResNet18(small_inputs=False)
