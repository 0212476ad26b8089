"""Experience replay (ER) in the IIRC setting (Abdelsalam et al., CVPR 2021): BCE over the seen labels on the
current task plus a memory of randomly chosen samples per label, replayed with the labels they had when stored
(stale labels: a stored superclass sample is a negative for its subclass introduced later)."""
from __future__ import annotations

from gtep.algorithms.base import ALGORITHMS, CommonParams
from gtep.algorithms.iirc.base import MultiLabelLearner


@ALGORITHMS.register("iirc_replay")
class IIRCReplay(MultiLabelLearner[CommonParams]):
    """ER: fine-tuning on the task plus the stale-label memory, chosen at random per label (paper App. A)."""

    memory_selection = "random"
