"""Replay: fine-tuning on the current task plus the exemplar memory (the GTEP paper's naive baseline)."""
from __future__ import annotations

from gtep.algorithms.base import ALGORITHMS, CommonParams, IncrementalLearner


@ALGORITHMS.register("replay")
class Replay(IncrementalLearner[CommonParams]):
    """Replay (the GTEP paper's naive baseline): cross-entropy on new data and herded exemplars, nothing else."""
    fuses_orderings = True


@ALGORITHMS.register("finetune")
class Finetune(IncrementalLearner[CommonParams]):
    """Fine-tuning (no memory): the lower bound every method must beat on old classes."""

    uses_memory = False
    fuses_orderings = True
