"""SimpleCIL (Zhou et al., "Revisiting Class-Incremental Learning with Pre-Trained Models", 2023): the
frozen pretrained backbone with a nearest-class-mean (prototype, cosine) classifier and no training.

It is the baseline the pretrained-model methods must beat: anything they learn on top of the frozen
features has to help more than it costs. Each training image is encoded once, when its task arrives."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gtep.algorithms._pretrained import PretrainedLearner, class_means
from gtep.algorithms.base import ALGORITHMS, CommonParams, FitFn, TaskData
from gtep.models import Backbone


class PrototypeNet(nn.Module):
    """A backbone and one prototype (mean feature) per class, compared by cosine similarity."""

    prototypes: Tensor

    def __init__(self, backbone: Backbone) -> None:
        super().__init__()
        self.backbone = backbone
        self.register_buffer("prototypes", torch.empty(0, backbone.out_dim))

    def expand(self, total: int) -> None:
        if total > len(self.prototypes):
            extra = torch.zeros(total - len(self.prototypes), self.prototypes.shape[1], device=self.prototypes.device)
            self.prototypes = torch.cat([self.prototypes, extra])

    def forward(self, x: Tensor) -> dict[str, Tensor]:
        out = self.backbone(x)
        out["logits"] = F.normalize(out["features"], dim=1) @ F.normalize(self.prototypes, dim=1).t()
        return out


@ALGORITHMS.register("simplecil")
class SimpleCIL(PretrainedLearner[CommonParams]):
    """SimpleCIL (Zhou et al. 2023): frozen pretrained features and class-mean prototypes, no training."""

    net: PrototypeNet

    def build_network(self) -> nn.Module:
        return PrototypeNet(self.new_backbone())

    def fit_task(self, task: TaskData, fit: FitFn) -> None:
        feats = self.encode(self.features, task.x, self.params.batch_size)
        self.net.prototypes[task.known:task.total] = class_means(feats, task.y, task.new_classes)
