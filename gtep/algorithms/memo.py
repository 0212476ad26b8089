"""MEMO (Zhou et al., "A Model or 603 Exemplars: Towards Memory-Efficient Class-Incremental Learning",
ICLR 2023), as PyCIL implements it.

The backbone is split where its layers stop being general: the stem and all stages but the last are the
generalized blocks, shared by every task; the last stage (with global pooling) is a specialized block, and
each task adds one, initialised from the previous one, the old ones frozen (weights and BatchNorm
statistics). Training is DER's (der.py): one head over the concatenated specialized features, grown per
task, an auxiliary (new classes + "old") classifier on the newest block weighted by lambda_aux, and weight
aligning of the head after each incremental task. Expanding only the last stage is what makes MEMO cheaper
in memory than DER.

Generalized blocks: PyCIL's exps/memo.json and the GTEP reference configs set train_base=true, so the
shared blocks keep training in every task with the rest (the default here); train_base=false freezes them
after the first task, the other option PyCIL offers.

exemplar_batch_size is PyCIL's (and the GTEP reference code's) "examplar batch size": the batch size of the
feature extraction behind the herding selection of exemplars (MEMO._construct_exemplar), with the network
in eval mode. It is not a batch size of the training loss, where memory and new data share the loader.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import cast

from torch import Tensor, nn

from gtep.algorithms.base import ALGORITHMS, AT_LEAST_ONE
from gtep.algorithms.der import DER, DERParams, ExpandableNet, Extractor
from gtep.models import Backbone


@dataclass(frozen=True)
class MEMOParams(DERParams):
    exemplar_batch_size: int = 64  # batch of the feature extraction for herding (PyCIL's examplar_bs)
    train_base: bool = True  # keep training the generalized blocks after task 1 (PyCIL's memo.json)
    ranges = {"exemplar_batch_size": AT_LEAST_ONE}


class SpecializedBlock(Extractor):
    """The last stage of a backbone and its global average pooling: one task's specialized block."""

    def __init__(self, stage: nn.Module, out_dim: int) -> None:
        super().__init__()
        self.stage = stage
        self.out_dim = out_dim
        self.pool = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten())

    def forward(self, x: Tensor) -> Tensor:
        return self.pool(self.stage(x))


def split_backbone(backbone: Backbone) -> tuple[nn.Module, SpecializedBlock]:
    """(generalized blocks, specialized block) of a backbone with a `stem` and a `stages` ModuleList."""
    if not hasattr(backbone, "stem") or not hasattr(backbone, "stages"):
        name = type(backbone).__name__
        raise ValueError(f"MEMO needs a backbone with `stem` and `stages` (a ResNet), not {name}")
    stem, stages = cast(nn.Module, backbone.stem), cast(nn.ModuleList, backbone.stages)
    generalized = nn.Sequential(stem, *stages[:-1])
    return generalized, SpecializedBlock(stages[-1], backbone.out_dim)


@ALGORITHMS.register("memo")
class MEMO(DER[MEMOParams]):
    # the trunk's training shapes task 1; the herding batch does not (eval-mode features are per image)
    first_task_hparams = ("train_base",)
    fuses_orderings = False  # DER's opt-in is not inherited: MEMO's shared trunk has no equivalence test yet

    def __init__(self, *args, **kwargs) -> None:
        self._first_block: SpecializedBlock | None = None
        super().__init__(*args, **kwargs)

    def build_network(self) -> nn.Module:
        generalized, self._first_block = split_backbone(self.new_backbone())
        return ExpandableNet(generalized, train_trunk=self.params.train_base)

    def new_extractor(self) -> Extractor:
        if self._first_block is not None:  # task 1: the last stage of the backbone the trunk came from
            block, self._first_block = self._first_block, None
            return block
        # Later blocks are overwritten by the previous block's weights in ExpandableNet.grow.
        return split_backbone(self.new_backbone())[1]

    @property
    def herding_batch_size(self) -> int:
        return self.params.exemplar_batch_size
