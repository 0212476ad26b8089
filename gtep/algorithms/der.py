"""DER (Yan et al., "DER: Dynamically Expandable Representation for Class Incremental Learning", CVPR 2021),
as PyCIL implements it and the GTEP paper runs it: the expansion only, without the channel masks and the
pruning, which neither PyCIL nor the authors' code provides.

Each task adds a feature extractor (a whole backbone) initialised from the previous one; the old extractors
are frozen, weights and BatchNorm statistics alike. The classifier sees the concatenation of all extractors'
features and grows in both directions: new rows for the new classes, new columns for the new extractor, the
old block copied. An auxiliary classifier on the new extractor's features alone tells the new classes apart
from one "old" class (label 0), weighted by lambda_aux, so the new extractor learns what is new. After each
incremental task the new classes' weight vectors are rescaled to the old ones' mean norm (weight aligning,
Zhao et al. CVPR 2020), as PyCIL's DER does.

The network here is general enough for MEMO (memo.py): extractors may sit on a shared trunk.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gtep.algorithms.base import ALGORITHMS, NON_NEGATIVE, CommonParams, FitFn, IncrementalLearner, TaskData, freeze
from gtep.models import Backbone
from gtep.models.heads import LinearHead, align_weights, embed_head


@dataclass(frozen=True)
class DERParams(CommonParams):
    lambda_aux: float = 1.0  # weight of the auxiliary (new classes + "old") loss
    ranges = {"lambda_aux": NON_NEGATIVE}


class Extractor(nn.Module):
    """What ExpandableNet adds per task: a module mapping the trunk's output to `out_dim` flat features."""

    out_dim: int


class FlatFeatures(Extractor):
    """A backbone seen as an extractor: only its flat feature vector."""

    def __init__(self, backbone: Backbone) -> None:
        super().__init__()
        self.backbone = backbone
        self.out_dim = backbone.out_dim

    def forward(self, x: Tensor) -> Tensor:
        return self.backbone(x)["features"]


def auxiliary_targets(y: Tensor, known: int) -> Tensor:
    """Labels of the auxiliary classifier: 0 for every old class, 1..n for the n new ones."""
    return (y - known + 1).clamp(min=0)


class ExpandableNet(nn.Module):
    """Extractors (modules with an `out_dim`) added one per task on a shared trunk (nn.Identity for DER),
    their features concatenated into one growing head, plus the auxiliary head on the newest extractor."""

    def __init__(self, trunk: nn.Module, train_trunk: bool = True) -> None:
        super().__init__()
        self.trunk = trunk
        self.extractors = nn.ModuleList()
        self.out_dim = 0  # features per extractor, known from the first one
        self.train_trunk = train_trunk  # False: the trunk is frozen once the first task is learnt
        self.head = LinearHead(0)
        self.aux_head = LinearHead(0)

    @property
    def feature_dim(self) -> int:
        return self.out_dim * len(self.extractors)

    @property
    def trunk_frozen(self) -> bool:
        return not self.train_trunk and len(self.extractors) > 1

    def grow(self, extractor: Extractor, total: int) -> None:
        """Freeze every extractor so far, add `extractor` initialised from the newest one, grow the heads."""
        extractor = extractor.to(self.head.weight.device)
        if len(self.extractors):
            freeze(self.extractors)
            extractor.load_state_dict(self.extractors[-1].state_dict())
        self.extractors.append(extractor)
        self.out_dim = extractor.out_dim
        if self.trunk_frozen:
            freeze(self.trunk)
        known = self.head.out_dim
        # the new extractor's columns and the new classes' rows start freshly initialised
        self.head = embed_head(self.head, self.feature_dim, total)
        self.aux_head = LinearHead(self.out_dim, total - known + 1).to(self.head.weight.device)
        self.train(self.training)

    def train(self, mode: bool = True) -> "ExpandableNet":
        """Frozen parts stay in eval mode so their BatchNorm statistics never move (PyCIL sets them to eval
        every epoch); the training loop calls this through module.train()."""
        super().train(mode)
        for extractor in self.extractors[:-1]:
            extractor.eval()
        if self.trunk_frozen:
            self.trunk.eval()
        return self

    def forward(self, x: Tensor) -> dict[str, Tensor]:
        shared = self.trunk(x)
        features = torch.cat([extractor(shared) for extractor in self.extractors], dim=1)
        return {
            "features": features,
            "logits": self.head(features),
            "aux_logits": self.aux_head(features[:, -self.out_dim :]),
        }


# DER's params or an extension's (MEMO's)
D = TypeVar("D", bound=DERParams)


@ALGORITHMS.register("der")
class DER(IncrementalLearner[D]):
    Params = DERParams
    fuses_orderings = True
    net: ExpandableNet
    # No snapshot of the old model (distills stays False): the frozen extractors are DER's memory of it.

    def build_network(self) -> nn.Module:
        return ExpandableNet(nn.Identity())

    def new_extractor(self) -> Extractor:
        return FlatFeatures(self.new_backbone())

    def grow(self, task: TaskData) -> None:
        self.net.grow(self.new_extractor(), task.total)

    def loss(self, x: Tensor, y: Tensor) -> Tensor:
        out = self.net(x)
        loss = F.cross_entropy(out["logits"], y)
        if self.known > 0:  # the first task trains the plain classifier only (PyCIL's _init_train)
            aux = F.cross_entropy(out["aux_logits"], auxiliary_targets(y, self.known))
            loss = loss + self.params.lambda_aux * aux
        return loss

    def consolidate(self, task: TaskData, fit: FitFn) -> None:
        # PyCIL aligns before herding; herding reads features only, which aligning the head leaves alone.
        if task.known > 0:
            align_weights(self.net.head, task.known)
