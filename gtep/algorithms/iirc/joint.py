"""Incremental joint in the IIRC setting (Abdelsalam et al., CVPR 2021): the upper bound. In every task the
engine gives it every training image seen so far with its complete labels over the seen labels (old samples
relabelled with the labels introduced since); it trains on all of it with BCE and keeps no memory."""
from __future__ import annotations

from gtep.algorithms.base import ALGORITHMS, CommonParams
from gtep.algorithms.iirc.base import MultiLabelLearner


@ALGORITHMS.register("iirc_joint")
class IIRCJoint(MultiLabelLearner[CommonParams]):
    """Incremental joint: complete history, complete labels, no memory of its own."""

    uses_memory = False
    complete_history = True
