"""Fine-tuning in FLUID (papers/fluid.txt Sec. 4, App. B/D; notes 004.3): the pretrained network with a linear
head over the classes seen so far; every `update_every` samples, `epochs` of SGD (momentum 0.9) over ALL data
seen so far (the paper: 4 epochs every 5,000 samples, lr 0.1 with supervised pretraining). `depth` is how many
of the backbone's top blocks train with the head (App. D's ablation; 0: the head alone, on features computed
once per image, the paper's "Fine-tune"; -1: every layer, its "Standard training")."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

import torch.nn.functional as F
from torch import Tensor, nn

from gtep.algorithms.base import ALGORITHMS, FitFn, FitRecipe, Range
from gtep.algorithms.fluid.base import Meter, StreamLearner, StreamParams


@dataclass(frozen=True)
class FinetuneParams(StreamParams):
    depth: int = 0  # top backbone blocks trained with the head; -1: all of them
    ranges = {"depth": Range(-1)}  # -1: every block


def top_blocks(backbone: nn.Module, depth: int) -> list[nn.Module]:
    """The last `depth` blocks of a backbone (the stem first, then its stages' blocks); -1: all of them."""
    stages = getattr(backbone, "stages", None)
    stem = getattr(backbone, "stem", None)
    if stages is None:
        blocks = list(backbone.children())
    else:
        blocks = ([stem] if stem is not None else []) + [b for stage in stages for b in stage.children()]
    return blocks if depth < 0 else blocks[len(blocks) - depth:] if depth else []


# fine-tuning's params or an extension's (standard training's, EWC's, LwF's)
FP = TypeVar("FP", bound=FinetuneParams)


@ALGORITHMS.register("fluid_finetune")
class FluidFinetune(StreamLearner[FP]):
    """A linear head (and the top `depth` blocks) trained on the fine-tune schedule."""

    Params = FinetuneParams

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.tuned = top_blocks(self.backbone, self.params.depth)
        for block in self.tuned:
            block.requires_grad_(True)

    @property
    def caches_features(self) -> bool:
        return self.params.depth == 0

    def update(self, fit: FitFn, recipe: FitRecipe, meter: Meter) -> None:
        head = self.head
        if self.caches_features:
            def head_loss(f: Tensor, y: Tensor) -> Tensor:
                return F.cross_entropy(head(f)[:, : self.total], y)

            self.train_head(fit, recipe, meter, list(head.parameters()), head_loss)
            return

        def loss(xb: Tensor, yb: Tensor) -> Tensor:
            return F.cross_entropy(self.net(xb)["logits"][:, : self.total], yb)

        # only the tuned blocks and the head train: frozen blocks keep their BN statistics
        self.train_network(fit, recipe, meter, [*self.tuned, head], loss, lambda xi: self.net(xi))
