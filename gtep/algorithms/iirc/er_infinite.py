"""Experience replay with an infinite buffer (ER-infinite) in the IIRC setting (Abdelsalam et al., CVPR 2021,
section 5): the paper's upper reference for replay. It keeps every training sample of every task, and replays
it with the labels it had when it was seen (incomplete information, as ER): a sample stored as "bear" in one
task stays a negative for "polar bear" introduced later, where the incremental joint bound (iirc_joint) is
given it relabelled. The gap between the two is the paper's point that removing the memory limit alone does not
solve IIRC (its Figure 4, Table 5).

Where the paper is silent, gtep's choices: a sample that a later task gives again under another label (IIRC's
sample assignment shows 20% of a subclass's images to its superclass too) is kept once per task that showed it,
each copy with that task's labels; a sample with several labels in one task is kept once. The memory budget of
the study (training.memory_size, scenario.iirc.memory_per_class) does not apply: the buffer is unbounded. Training
is ER's: BCE over the seen labels on the task plus everything stored."""
from __future__ import annotations

import sys
from typing import Any

import torch
from torch import Tensor

from gtep.algorithms.base import ALGORITHMS, CommonParams
from gtep.algorithms.iirc.base import MultiLabelLearner, MultiLabelMemory
from gtep.algorithms.memory import FeatureFn


class UnboundedMemory(MultiLabelMemory):
    """A MultiLabelMemory without a quota: every sample of a task's new labels is stored, in the task's order,
    with the labels it had in that task (the base memory counts a sample carrying several new labels once)."""

    def __init__(self) -> None:
        super().__init__(0, "random")

    def per_class(self, seen_classes: int) -> int:
        return sys.maxsize  # no old label's bucket is ever cut, every new label keeps all its samples

    def _order(self, x: Any, candidates: Tensor, count: int, feature_fn: FeatureFn) -> Tensor:
        return torch.arange(len(candidates), device=candidates.device)[:count]  # all of them, no RNG drawn


@ALGORITHMS.register("iirc_er_infinite")
class IIRCERInfinite(MultiLabelLearner[CommonParams]):
    """ER with every past sample kept, each with its stale labels."""

    def new_memory(self, size: int, per_label: int | None) -> MultiLabelMemory:
        return UnboundedMemory()
