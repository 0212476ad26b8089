"""Finetune in the IIRC setting (Abdelsalam et al., CVPR 2021): BCE over the seen labels on the current task
only, no memory; the lower bound."""
from __future__ import annotations

from gtep.algorithms.base import ALGORITHMS, CommonParams
from gtep.algorithms.iirc.base import MultiLabelLearner


@ALGORITHMS.register("iirc_finetune")
class IIRCFinetune(MultiLabelLearner[CommonParams]):
    """Multi-label fine-tuning: each task's incomplete labels, nothing kept from earlier tasks."""

    uses_memory = False
