"""A test plugin (GTEP_PLUGINS): tiny multi-label learners for the IIRC engine path, registered while a test
module uses them and removed after (tests listing every algorithm must not see them).

    tiny_multilabel        fine-tuning with a sigmoid per label (BCE over the labels seen so far)
    tiny_multilabel_joint  the same with complete_history (the incremental joint bound)

Both record what each task gave them (index, known, total, the multi-hot y) in RECEIVED, in this process."""
from __future__ import annotations

from typing import Any, ClassVar

import torch.nn.functional as F

from gtep.algorithms import ALGORITHMS, CommonParams
from gtep.algorithms.base import IncrementalLearner

RECEIVED: list[dict[str, Any]] = []


@ALGORITHMS.register("tiny_multilabel")
class TinyMultiLabel(IncrementalLearner[CommonParams]):
    uses_memory = False
    data_flows = frozenset({"multi_label"})
    complete_history: ClassVar[bool] = False
    threshold = 0.5

    def loss(self, x, y):
        return F.binary_cross_entropy_with_logits(self.net(x)["logits"][:, : self.total], y)

    def fit_task(self, task, fit) -> None:
        RECEIVED.append({"algorithm": type(self).__name__, "index": task.index, "known": task.known,
                         "total": task.total, "y": task.y.detach().cpu().clone(), "n": len(task.x)})
        super().fit_task(task, fit)


@ALGORITHMS.register("tiny_multilabel_joint")
class TinyMultiLabelJoint(TinyMultiLabel):
    complete_history = True


def unregister() -> None:
    for name in ("tiny_multilabel", "tiny_multilabel_joint"):
        ALGORITHMS._entries.pop(name, None)
