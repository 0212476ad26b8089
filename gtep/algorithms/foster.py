"""FOSTER (Wang et al., "FOSTER: Feature Boosting and Compression for Class-Incremental Learning", ECCV 2022),
as PyCIL implements it with the GTEP reference code's additions (lambda_fe; the sampled schedule in both
stages).

Task 1 trains one backbone with cross-entropy. Every later task has two stages:

* Feature boosting. A new backbone, copied from the old one, is trained beside the old one (frozen, weights
  and BatchNorm statistics). A head over both concatenated features starts from the old head in its old
  block; its cross-entropy is logit-adjusted by class-balance weights from the effective number of samples
  (Cui et al. 2019) with beta1, to offset the few exemplars per old class. A feature-enhancement head on the
  new features alone (lambda_fe) makes the new backbone learn on its own, and the old head's outputs on the
  old features are distilled into the old classes' logits (lambda_kd, temperature T).
* Feature compression. A single-backbone student, initialised from the old backbone and old head, is
  distilled from the boosted model for compression_epochs with the class-balanced KD of beta2 weights. It
  becomes the model, so after every task the model has one backbone's parameters.

PyCIL's FOSTER reports the boosted (two-backbone) teacher's accuracy and builds the memory from it, keeping
the student only as the start of the next task; here the student is the model after each task (the paper's
point: a constant model size). PyCIL's options kept at its defaults: no weight aligning of teacher or student
("is_teacher_wa", "is_student_wa" false) and the old-classes' new-feature weights trained ("oofc": "ft").
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gtep.algorithms._expansion import BackboneStack
from gtep.algorithms.base import (
    ALGORITHMS,
    AT_LEAST_ONE,
    NON_NEGATIVE,
    POSITIVE,
    CommonParams,
    FitFn,
    IncrementalLearner,
    Range,
    TaskData,
    distillation_loss,
    freeze,
    required,
)
from gtep.models.heads import LinearHead, embed_head
from gtep.protocol.sampling import steplr_milestones


@dataclass(frozen=True)
class FOSTERParams(CommonParams):
    T: float = 2.0  # temperature of both distillations
    lambda_kd: float = 1.0  # weight of distilling the old model during boosting (PyCIL's lambda_okd)
    lambda_fe: float = 1.0  # weight of the feature-enhancement loss on the new backbone alone
    beta1: float = 0.96  # effective-number beta of the boosting logit adjustment
    beta2: float = 0.97  # effective-number beta of the compression's balanced KD
    compression_epochs: int = 130
    ranges = {"T": POSITIVE, "lambda_kd": NON_NEGATIVE, "lambda_fe": NON_NEGATIVE, "compression_epochs": AT_LEAST_ONE,
              # (1 - beta) / (1 - beta^n): beta 1 divides zero by zero
              "beta1": Range(0, 1, high_open=True), "beta2": Range(0, 1, high_open=True)}


class FosterNet(nn.Module):
    """Concatenated backbones and one head over them; while boosting, also the feature-enhancement head on
    the newest backbone and the frozen old head on the old backbone's features."""

    def __init__(self, backbone: str) -> None:
        super().__init__()
        self.stack = BackboneStack(backbone)
        self.stack.grow()
        self.head = LinearHead(self.stack.out_dim)
        self.fe_head: LinearHead | None = None
        self.old_head: LinearHead | None = None

    def expand(self, total: int) -> None:
        self.head.expand(total)

    def boost(self, total: int) -> None:
        """Add a backbone copied from the current one, freezing it and its head (PyCIL's update_fc)."""
        self.stack.grow(init_from=-1)
        self.old_head = freeze(self.head)
        self.head = embed_head(self.old_head, self.stack.feature_dim, total)
        self.fe_head = LinearHead(self.stack.out_dim, total).to(self.head.weight.device)

    def forward(self, x: Tensor) -> dict[str, Tensor]:
        features = self.stack(x)
        out = {"features": features, "logits": self.head(features)}
        if self.fe_head is not None:
            d = self.stack.out_dim
            out["fe_logits"] = self.fe_head(features[:, -d:])
            out["old_logits"] = required(self.old_head, "FOSTER's old head")(features[:, :-d])
        return out


def class_balance_weights(y: Tensor, total: int, beta: float) -> Tensor:
    """(1 - beta) / (1 - beta^n_c), scaled to sum to the number of classes (Cui et al., CVPR 2019), from the
    training counts n_c: PyCIL's per_cls_weights. Rare (old) classes get the larger weights."""
    counts = torch.bincount(y, minlength=total)[:total].clamp(min=1).double()
    weights = (1.0 - beta) / (1.0 - torch.pow(beta, counts))
    return (weights / weights.sum() * total).float()


def balanced_kd(logits: Tensor, teacher_logits: Tensor, weights: Tensor, temperature: float) -> Tensor:
    """Distillation whose soft targets are reweighted by the class weights and renormalised (PyCIL's BKD)."""
    log_p = F.log_softmax(logits / temperature, dim=1)
    q = F.softmax(teacher_logits / temperature, dim=1) * weights
    q = q / q.sum(dim=1, keepdim=True)
    return -(q * log_p).sum(dim=1).mean()


@ALGORITHMS.register("foster")
class FOSTER(IncrementalLearner[FOSTERParams]):
    # No snapshot of the old model (distills stays False): the boosted net's frozen backbone and head are it.
    net: FosterNet

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        # (not `weights`: that is the learner's pretrained-weights file, which this would shadow)
        self.class_weights: Tensor | None = None

    def build_network(self) -> nn.Module:
        return FosterNet(self.backbone_name)

    def grow(self, task: TaskData) -> None:
        if task.known == 0:
            self.net.expand(task.total)
        else:
            self.net.boost(task.total)

    def fit_task(self, task: TaskData, fit: FitFn) -> None:
        # Boosting and compression both here: the memory is rebuilt with the compressed student.
        x, y = self.training_data(task)
        if task.known == 0:  # PyCIL's _init_train: plain cross-entropy on one backbone
            fit(self.net.parameters(), self.loss, x, y, task.recipe, modules=[self.net])
            return
        self.class_weights = class_balance_weights(y, task.total, self.params.beta1).to(self.device)
        fit(self.net.parameters(), self.boosting_loss, x, y, task.recipe, modules=[self.net])
        self.class_weights = class_balance_weights(y, task.total, self.params.beta2).to(self.device)
        self.net = self.compress(task, fit, x, y)

    def boosting_loss(self, x: Tensor, y: Tensor) -> Tensor:
        out = self.net(x)
        logits = out["logits"]
        # Logit adjustment: dividing by the class weights lowers the frequent (new) classes' margins.
        clf = F.cross_entropy(logits / self.class_weights, y)
        fe = F.cross_entropy(out["fe_logits"], y)
        kd = distillation_loss(logits[:, : self.known], out["old_logits"].detach(), self.params.T)
        return clf + self.params.lambda_fe * fe + self.params.lambda_kd * kd

    def compress(self, task: TaskData, fit: FitFn, x: Tensor, y: Tensor) -> FosterNet:
        """Distil the boosted model into a one-backbone student started from the old backbone and old head."""
        teacher = self.net.eval()
        student = FosterNet(self.backbone_name).to(self.device)
        student.stack.backbones[0].load_state_dict(teacher.stack.backbones[0].state_dict())
        student.head = embed_head(required(teacher.old_head, "FOSTER's old head"), student.stack.out_dim, task.total)
        class_weights = required(self.class_weights, "FOSTER's class weights")

        def loss(xb: Tensor, yb: Tensor) -> Tensor:
            with torch.no_grad():
                target = teacher(xb)["logits"]
            return balanced_kd(student(xb)["logits"], target, class_weights, self.params.T)

        epochs = task.scaled_epochs(self.params.compression_epochs)
        # As the reference code: the sampled lr and schedule (milestones by the paper's rule on the
        # compression epochs) but no weight decay, which PyCIL's student optimiser never had.
        recipe = task.recipe.replace(epochs=epochs, weight_decay=0.0,
                                     milestones=tuple(steplr_milestones(epochs, self.params.milestone_num)))
        fit(student.parameters(), loss, x, y, recipe, modules=[student])
        return student
