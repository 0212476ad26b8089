"""A-GEM (Chaudhry et al., ICLR 2019) in the IIRC setting (Abdelsalam et al., CVPR 2021, section 5, appendix B).

A-GEM keeps a replay memory but does not train on it: at every step it computes the gradient g of the current
batch's loss and a reference gradient g_ref of the loss on a random batch of the memory, and when they conflict
(g . g_ref < 0) it steps along the projection g~ = g - (g . g_ref / g_ref . g_ref) g_ref, so the step does not
increase the memory loss to first order (g~ . g_ref = 0); otherwise along g.

The paper says only that A-GEM runs with a memory batch of 128 (appendix A), random samples per label in memory
(20 per label, stale labels) and the multi-label loss of every baseline (BCE, sigmoid >= 0.5). As its reference
code (lifelong_methods/methods/agem.py) does: the current batch's loss is BCE on the task's new labels
[known, total) only, the memory loss BCE on the old labels [0, known) only, each averaged over its labels and
samples, and the training batches hold task samples only. gtep's choices where the paper and the reference code
differ from gtep's loop or say nothing: the memory batch is drawn with the run-seeded global RNG, without
replacement (all of the memory when it holds fewer), and passed through its test view (no augmentation); the
projection covers every trainable parameter as one vector, and weight decay is applied by the optimiser after
it. The engine's loop has no gradient hook: the loss returns the batch loss's value with g~ as its gradient
(a surrogate sum_p <p, g~_p>), so `fit` steps along g~ unchanged."""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gtep.algorithms.base import ALGORITHMS, AT_LEAST_ONE, CommonParams, FitFn, TaskData, required
from gtep.algorithms.iirc.base import MultiLabelLearner


@dataclass(frozen=True)
class IIRCAGEMParams(CommonParams):
    memory_batch_size: int = 128  # samples of the memory behind each reference gradient (the paper's 128)
    ranges = {"memory_batch_size": AT_LEAST_ONE}  # an empty reference gradient projects nothing: fine-tuning


@ALGORITHMS.register("iirc_agem")
class IIRCAGEM(MultiLabelLearner[IIRCAGEMParams]):
    """A-GEM: steps on the task's new labels, projected so as not to raise the memory's loss on the old labels."""

    memory_selection = "random"
    replay: tuple[Tensor, Tensor] | None = None  # the memory and its old labels while a task trains (fit_task)

    def training_data(self, task: TaskData) -> tuple[Tensor, Tensor]:
        return task.x, task.y.float()  # the memory constrains the step; it is not trained on

    def fit_task(self, task: TaskData, fit: FitFn) -> None:
        mx, my = self.label_memory.tensors(task.total)
        self.replay = (mx, my[:, : self.known].to(self.device)) if len(my) and self.known else None
        try:
            super().fit_task(task, fit)
        finally:
            self.replay = None  # not kept between tasks (checkpoints, copies)

    def loss(self, x: Tensor, y: Tensor) -> Tensor:
        """The new labels' BCE, whose gradient is replaced by its A-GEM projection (module docstring)."""
        logits = self.net(x)["logits"][:, : self.total]
        current = F.binary_cross_entropy_with_logits(logits[:, self.known :], y[:, self.known :].float())
        if self.replay is None:
            return current
        params = [p for p in self.trainable_parameters() if p.requires_grad]
        g = flat_gradient(current, params)
        g_ref = flat_gradient(self.memory_loss(), params)
        return with_gradient(current.detach(), params, project(g, g_ref))

    def memory_loss(self) -> Tensor:
        """BCE on the old labels over a random batch of the memory, with the labels stored (stale)."""
        mx, my = required(self.replay, "the replay memory")
        pick = torch.randperm(len(my))[: self.params.memory_batch_size].to(my.device)
        logits = self.net(mx[pick])["logits"][:, : self.known]
        return F.binary_cross_entropy_with_logits(logits, my[pick])


def flat_gradient(loss: Tensor, params: list[nn.Parameter]) -> Tensor:
    """d loss / d params as one vector (zeros for parameters the loss does not reach)."""
    grads = torch.autograd.grad(loss, params, allow_unused=True)
    return torch.cat([(torch.zeros_like(p) if g is None else g).flatten() for p, g in zip(params, grads)])


def project(g: Tensor, g_ref: Tensor) -> Tensor:
    """A-GEM's projection (Chaudhry et al. 2019, section 4): g when it agrees with g_ref, else g less its g_ref part."""
    dot = torch.dot(g, g_ref)
    if dot >= 0:
        return g
    return g - dot / torch.dot(g_ref, g_ref).clamp_min(1e-12) * g_ref


def with_gradient(value: Tensor, params: list[nn.Parameter], gradient: Tensor) -> Tensor:
    """A scalar equal to `value` whose gradient with respect to `params` is `gradient` (flat, in their order)."""
    surrogate = torch.zeros((), device=value.device)
    offset = 0
    for p in params:
        n = p.numel()
        surrogate = surrogate + (p * gradient[offset : offset + n].view_as(p)).sum()
        offset += n
    return value + surrogate - surrogate.detach()
