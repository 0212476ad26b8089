"""Standard training in FLUID (papers/fluid.txt Sec. 4; notes 004.3): every layer of the pretrained network
trained on the fine-tune schedule (every `update_every` samples, `epochs` over all data seen so far; the
paper's lr 0.01). It is fluid_finetune with every block tuned."""
from __future__ import annotations

from dataclasses import dataclass

from gtep.algorithms.base import ALGORITHMS
from gtep.algorithms.fluid.finetune import FinetuneParams, FluidFinetune


@dataclass(frozen=True)
class StandardParams(FinetuneParams):
    lr: float = 0.01
    depth: int = -1  # every block (the whole backbone) trains


@ALGORITHMS.register("fluid_standard")
class FluidStandard(FluidFinetune[StandardParams]):
    """All layers trained every `update_every` samples."""

