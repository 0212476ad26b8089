"""Heads that grow with the classes, and the plain incremental network (backbone + linear head)."""
from __future__ import annotations

from typing import Generic, Protocol, TypeVar

import torch
from torch import Tensor, nn

from gtep.models.base import Backbone


class LinearHead(nn.Module):
    """A linear classifier whose output grows when classes arrive; old rows are copied, never reset."""

    def __init__(self, in_dim: int, out_dim: int = 0) -> None:
        super().__init__()
        self.in_dim = in_dim
        self.weight = nn.Parameter(torch.empty(0, in_dim))
        self.bias = nn.Parameter(torch.empty(0))
        if out_dim:
            self.expand(out_dim)

    @property
    def out_dim(self) -> int:
        return self.weight.shape[0]

    def expand(self, total: int) -> None:
        old = self.out_dim
        if total <= old:
            return
        # PyCIL's SimpleLinear init: Kaiming-uniform rows with linear gain, zero bias. The scale of new rows
        # matters to methods that compare row norms (WA, DER's aligning) or correct logits (BiC).
        fresh = torch.empty(total - old, self.in_dim, device=self.weight.device)
        nn.init.kaiming_uniform_(fresh, nonlinearity="linear")
        with torch.no_grad():
            self.weight = nn.Parameter(torch.cat([self.weight.data, fresh]))
            self.bias = nn.Parameter(torch.cat([self.bias.data, torch.zeros(total - old, device=self.bias.device)]))

    def forward(self, features: Tensor) -> Tensor:
        return features @ self.weight.t() + self.bias


class GrowingHead(Protocol):
    """A classifier over features whose rows grow when classes arrive (LinearHead, PODNet's LSC head)."""

    def expand(self, total: int) -> None: ...

    def __call__(self, features: Tensor) -> Tensor: ...


HeadT = TypeVar("HeadT", bound=GrowingHead)


class BackboneAndHead(nn.Module, Generic[HeadT]):
    """A backbone and one growing head on its features; the output is the backbone's plus the logits."""

    def __init__(self, backbone: Backbone, head: HeadT) -> None:
        super().__init__()
        self.backbone = backbone
        self.head = head

    @property
    def feature_dim(self) -> int:
        return self.backbone.out_dim

    def expand(self, total_classes: int) -> None:
        self.head.expand(total_classes)

    def forward(self, x: Tensor) -> dict[str, Tensor | list[Tensor]]:
        out = self.backbone(x)
        out["logits"] = self.head(out["features"])
        return out


class IncrementalNet(BackboneAndHead[LinearHead]):
    """A backbone and one growing linear head: the network of Replay, iCaRL, BiC and WA."""

    def __init__(self, backbone: Backbone) -> None:
        super().__init__(backbone, LinearHead(backbone.out_dim))


def embed_head(head: LinearHead, in_dim: int, total: int) -> LinearHead:
    """A fresh head over `in_dim` features and `total` classes whose top-left block is `head`'s weights and
    bias: how the expansion methods grow their classifier when a backbone adds feature columns and a task
    adds class rows (PyCIL's DERNet.update_fc, FOSTERNet.update_fc and copy_fc). The other rows and columns
    keep LinearHead's initialisation."""
    grown = LinearHead(in_dim, total).to(head.weight.device)
    with torch.no_grad():
        grown.weight[: head.out_dim, : head.in_dim] = head.weight
        grown.bias[: head.out_dim] = head.bias
    return grown


@torch.no_grad()
def align_weights(head: LinearHead, known: int) -> Tensor:
    """Weight aligning (Zhao et al., CVPR 2020, eq. 6-8; PyCIL's weight_align), used by WA and DER: rescale
    the new classes' rows [known, end) so their mean L2 norm equals that of the old rows [0, known), which
    removes the bias towards new classes that imbalanced training puts into the norms. Biases are left as
    they are. Returns gamma = mean(||w_old||) / mean(||w_new||)."""
    norms = head.weight.norm(dim=1)
    gamma = norms[:known].mean() / norms[known:].mean()
    head.weight[known:] *= gamma
    return gamma
