"""The shared base of the multi-label learners of the IIRC family (Abdelsalam et al., CVPR 2021).

IIRC (Incremental Implicitly-Refined Classification) tasks bring labels of a two-level hierarchy: a sample
may carry a superclass and a subclass label, superclasses come in earlier tasks than their subclasses, and
training data has incomplete information (only the current task's labels). The learners here follow the
paper's adaptation of single-label baselines (section 5, appendix A/B):

- the task's labels come as a float multi-hot tensor `task.y` of shape (N, task.total), labels in order of
  appearance, [known, total) new in the task (the data flow "multi_label" of gtep/protocol/families/);
- one linear head over every seen label, grown per task; loss: BCE with logits, averaged over the seen
  labels (and the batch), so it does not grow with the number of labels;
- `predict(x)` returns one logit per seen label; a label is predicted when sigmoid(logit) >= `threshold`
  (0.5, i.e. logit >= 0), the rule the engine applies;
- a replay memory (`MultiLabelMemory`) that keeps each sample with the labels it had when it was stored:
  stale labels, the paper's point (a superclass sample stored in task 1 is still a negative for the
  subclass that task 5 introduces).

Learners whose `complete_history` is True (the incremental joint upper bound) are given, in every task, every
training image seen so far with its complete labels restricted to the seen labels; the engine does that, the
learner just trains on what it gets.
"""
from __future__ import annotations

import math
from typing import Any, ClassVar, Literal, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gtep.algorithms.base import IncrementalLearner, P, TaskData
from gtep.algorithms.memory import FeatureFn, herding_order
from gtep.models.heads import BackboneAndHead, LinearHead

Selection = Literal["random", "herding"]
MULTI_LABEL = "multi_label"


class CosineHead(nn.Module):
    """iCaRL-norm's last layer (IIRC eq. 3; LUCIR's CosineLinear): eta * cos(theta_i, f(x)), with a learnable
    eta (the paper found learning it better than fixing it). New rows start uniform in +-1/sqrt(dim), as the
    reference code's CosineLinear; old rows are copied, never reset."""

    def __init__(self, in_dim: int, eta: float = 1.0) -> None:
        super().__init__()
        self.in_dim = in_dim
        self.weight = nn.Parameter(torch.empty(0, in_dim))
        self.eta = nn.Parameter(torch.full((1,), float(eta)))

    @property
    def out_dim(self) -> int:
        return self.weight.shape[0]

    def expand(self, total: int) -> None:
        if total <= self.out_dim:
            return
        bound = 1 / math.sqrt(self.in_dim)
        fresh = torch.empty(total - self.out_dim, self.in_dim, device=self.weight.device).uniform_(-bound, bound)
        with torch.no_grad():
            self.weight = nn.Parameter(torch.cat([self.weight.data, fresh]))

    def forward(self, features: Tensor) -> Tensor:
        return self.eta * F.normalize(features, dim=1) @ F.normalize(self.weight, dim=1).t()


class MultiLabelNet(BackboneAndHead[LinearHead | CosineHead]):
    """A backbone and one growing head (linear, or cosine for iCaRL-norm): forward gives "logits" and
    "features", as the base learner's readers expect."""


class MultiLabelMemory:
    """Replay memory of multi-label samples, each kept with the multi-hot labels it had when it was stored.

    Two budgets. A fixed total `size` spread over the labels seen so far (as gtep's ExemplarMemory): after each
    task every old label's bucket is cut to size // seen (keeping its selection order), and each new label gets
    up to that many samples among the task's samples that carry it. Or, with `per_label`, the paper's budget
    (20 per label, appendix A): every label keeps up to `per_label` samples, so the memory grows with the
    labels and an old label's bucket is never cut. A sample carrying several new labels counts for each of
    them: it is stored once, in the bucket of the first label that chose it, and a later label of the same task
    needs only quota minus the chosen samples that already carry it.

    Selection per label: "random" (ER in the paper, a random permutation from the run-seeded global RNG) or
    "herding" (iCaRL, LUCIR, BiC in the paper: herding on the network's L2-normalised features).

    Labels are kept as uint8 rows as wide as the labels seen when stored; `tensors()` gives them as float,
    zero-padded to the latest width: the sample is a negative for every label introduced after it was stored
    (stale labels). Images are kept as they come (StoredImages stay uint8)."""

    def __init__(self, size: int, selection: Selection = "random", per_label: int | None = None) -> None:
        if size < 0:
            raise ValueError(f"memory size must be >= 0, got {size}")
        if per_label is not None and per_label < 1:
            raise ValueError(f"memory per label must be >= 1, got {per_label}")
        if selection not in ("random", "herding"):
            raise ValueError(f"memory selection must be 'random' or 'herding', got {selection!r}")
        self.size = size
        self.per_label = per_label
        self.selection = selection
        self.width = 0  # labels seen at the latest update
        self._x: dict[int, Any] = {}  # label -> stored images (Tensor or StoredImages), in selection order
        self._y: dict[int, Tensor] = {}  # label -> their labels when stored, uint8 (n, labels seen then)

    def __len__(self) -> int:
        return sum(len(v) for v in self._y.values())

    @property
    def classes(self) -> list[int]:
        return sorted(self._y)

    def per_class(self, seen_classes: int) -> int:
        if self.per_label is not None:
            return self.per_label
        return self.size // max(seen_classes, 1)

    def update(self, x: Any, y: Tensor, new_classes: list[int], seen_classes: int, feature_fn: FeatureFn) -> None:
        """Cut the old labels' buckets to the new quota, then choose samples for each new label."""
        self.width = max(self.width, seen_classes)
        quota = self.per_class(seen_classes)
        for label in list(self._y):
            self._x[label], self._y[label] = self._x[label][:quota], self._y[label][:quota]
        if quota == 0:
            return
        positive = y > 0.5
        chosen = torch.zeros(len(y), dtype=torch.bool, device=y.device)
        for label in new_classes:
            needed = quota - int((chosen & positive[:, label]).sum())
            candidates = torch.nonzero(positive[:, label] & ~chosen).flatten()
            if needed <= 0 or len(candidates) == 0:
                continue
            picks = candidates[self._order(x, candidates, needed, feature_fn)]
            chosen[picks] = True
            self._x[label] = x[picks]
            self._y[label] = y[picks].to(torch.uint8)

    def _order(self, x: Any, candidates: Tensor, count: int, feature_fn: FeatureFn) -> Tensor:
        """Positions in `candidates` of the `count` samples to keep, in selection order."""
        if self.selection == "herding":
            with torch.no_grad():
                feats = feature_fn(x[candidates])
            return herding_order(feats, count).to(candidates.device)
        return torch.randperm(len(candidates))[:count].to(candidates.device)

    def tensors(self, total: int | None = None) -> tuple[Any, Tensor]:
        """Every stored sample and its labels as stored (float multi-hot, zero-padded to `total` labels,
        default the latest width), or empty tensors when the memory holds nothing."""
        width = self.width if total is None else total
        if not self._y:
            return torch.empty(0), torch.empty(0, width)
        labels = self.classes
        xs = torch.cat([self._x[c] for c in labels])
        ys = torch.cat([F.pad(self._y[c].float(), (0, width - self._y[c].shape[1])) for c in labels])
        return xs, ys

    def state_dict(self) -> dict[str, Any]:
        return {"width": self.width, "x": {str(k): v.cpu() for k, v in self._x.items()},
                "y": {str(k): v.cpu() for k, v in self._y.items()}}

    def load_state_dict(self, state: dict[str, Any], device: torch.device | str = "cpu") -> None:
        self.width = int(state["width"])
        self._x = {int(k): v.to(device) for k, v in state["x"].items()}
        self._y = {int(k): v.to(device) for k, v in state["y"].items()}


class MultiLabelLearner(IncrementalLearner[P]):
    """A learner of the "multi_label" data flow: the base class's steps, with multi-hot labels throughout.

    Hooks it sets: build_network (a linear head; iCaRL-norm builds a CosineHead), training_data (the task
    plus the stale-label memory, padded to the task's labels), loss (BCE over the seen labels) and predict
    (the logits, thresholded by the engine at sigmoid >= `threshold`)."""

    data_flows: ClassVar[frozenset[str]] = frozenset({MULTI_LABEL})
    threshold: ClassVar[float] = 0.5  # the engine predicts label j when sigmoid(logit_j) >= threshold
    # True: the engine passes, in each task, every training image seen so far with its complete labels
    # (restricted to the labels seen so far): the incremental joint upper bound.
    complete_history: ClassVar[bool] = False
    memory_selection: ClassVar[Selection] = "random"

    def __init__(self, params: P, backbone: str, memory_size: int, device: torch.device,
                 weights: str | None = None) -> None:
        super().__init__(params, backbone, memory_size, device, weights)
        # the base class's ExemplarMemory holds int labels; a multi-label memory replaces it (same update,
        # tensors and state_dict calls: the base class's update_memory step drives it unchanged)
        self.memory = self.new_memory(memory_size if self.uses_memory else 0, None)  # type: ignore[assignment]

    def keep_per_label(self, count: int) -> None:
        """The paper's replay budget: `count` samples per seen label (the memory grows with the labels) in place
        of the fixed total; the engine sets it before the first task (scenario.iirc.memory_per_class)."""
        if len(self.label_memory):
            raise RuntimeError("the memory budget is set before the first task, not once samples are stored")
        self.memory = self.new_memory(0, count if self.uses_memory else None)  # type: ignore[assignment]

    def new_memory(self, size: int, per_label: int | None) -> MultiLabelMemory:
        """The replay memory for a budget: a fixed total `size`, or `per_label` samples per seen label. Default:
        a MultiLabelMemory choosing by `memory_selection`; ER-infinite keeps every sample whatever the budget."""
        return MultiLabelMemory(size, self.memory_selection, per_label)

    @property
    def label_memory(self) -> MultiLabelMemory:
        """self.memory, typed as what it is here."""
        return cast(MultiLabelMemory, self.memory)

    def build_network(self) -> nn.Module:
        backbone = self.new_backbone()
        return MultiLabelNet(backbone, LinearHead(backbone.out_dim))

    def training_data(self, task: TaskData) -> tuple[Tensor, Tensor]:
        """The task's images and labels plus every stored sample with its stale labels."""
        mx, my = self.label_memory.tensors(task.total)
        if len(my) == 0:
            return task.x, task.y.float()
        return torch.cat([task.x, mx]), torch.cat([task.y.float(), my.to(task.y.device)])

    def loss(self, x: Tensor, y: Tensor) -> Tensor:
        """BCE with logits, averaged over the batch and the seen labels (IIRC section 5)."""
        return F.binary_cross_entropy_with_logits(self.net(x)["logits"][:, : self.total], y.float())

    @torch.no_grad()
    def predict(self, x: Tensor) -> Tensor:
        """One logit per seen label; label j is predicted when sigmoid(logit_j) >= threshold."""
        return self.net(x)["logits"][:, : self.total]

    @torch.no_grad()
    def predict_labels(self, x: Tensor) -> Tensor:
        """The predicted multi-hot labels (bool, batch x seen labels), by the engine's rule."""
        return torch.sigmoid(self.predict(x)) >= self.threshold

    def distilled_bce(self, x: Tensor, y: Tensor, temperature: float, kd_weight: float) -> Tensor:
        """iCaRL's loss as the IIRC paper runs it: BCE to the labels on the new labels [known, total), BCE to
        the old network's sigmoid outputs (softened by `temperature`) on the old labels [0, known), summed and
        averaged over the batch and the seen labels; kd_weight scales the distillation part (1 = the
        reference code, which replaces the old labels' targets with the old network's outputs)."""
        logits = self.net(x)["logits"][:, : self.total]
        y = y.float()
        if self.old_net is None or self.known == 0:
            return F.binary_cross_entropy_with_logits(logits, y)
        new = F.binary_cross_entropy_with_logits(logits[:, self.known :], y[:, self.known :], reduction="sum")
        with torch.no_grad():
            old_targets = torch.sigmoid(self.old_net(x)["logits"][:, : self.known] / temperature)
        old = F.binary_cross_entropy_with_logits(logits[:, : self.known] / temperature, old_targets, reduction="sum")
        return (new + kd_weight * old) / logits.numel()
