"""LUCIR (Hou et al., CVPR 2019) in the IIRC setting (Abdelsalam et al., CVPR 2021, section 5, appendices A-B).

LUCIR's three components, as the IIRC paper lists them: a cosine-normalised last layer (eta * cos(theta_i, f(x)),
eta learnt), the less-forget constraint (distillation in the feature space: lambda * (1 - cos(f(x), f_old(x))),
with lambda = lambda_base * sqrt(old labels / new labels)), and a margin ranking loss that keeps each old sample's
true-label score above the K hardest new labels' by a margin m. The paper's values: m = 0.5, lambda_base = 5
(appendix A); herded memory, 20 samples per label with stale labels. As every IIRC baseline, the classification
loss is BCE over the seen labels, and a label is predicted when sigmoid(eta * cos) >= 0.5.

Multi-label adaptation, as the paper's reference code (lifelong_methods/methods/lucir.py) does: new labels' rows
are imprinted with the normalised mean of the normalised features of the task's samples carrying that label,
scaled to the old rows' mean norm; old rows are frozen while later tasks train (LUCIR's fixed old embeddings); the
margin ranking applies to memory samples, ranking each of their (old, stored) labels' cosine above the top-K
new labels' cosines (max(0, m - cos_pos + cos_hard), averaged over every (sample, positive label, hard label)
triple), on cosines (the logits divided by a detached eta). Where the paper is silent, gtep's choices: a memory
sample is recognised by carrying an old label (a task's own samples carry new labels only: incomplete
information); one margin for all K hard labels (the reference code allows two, both 0.5); K = 2 (LUCIR's)
and tunable; eta's starting value tunable as iCaRL-norm's (`eta_init`, 1 in the `original` preset: the reference
code's; a cosine logit in [-1, 1] times 1 needs many steps at a large lr before any label clears sigmoid 0.5);
LUCIR's class-balanced finetuning and its backbone without the last ReLU are not used (the IIRC reference code
uses neither)."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gtep.algorithms.base import ALGORITHMS, AT_LEAST_ONE, NON_NEGATIVE, POSITIVE, CommonParams, FitFn, TaskData
from gtep.algorithms.iirc.base import MultiLabelLearner, MultiLabelNet


@dataclass(frozen=True)
class IIRCLUCIRParams(CommonParams):
    lambda_base: float = 5.0  # weight of the less-forget distillation before the sqrt(old/new) factor (paper: 5)
    margin: float = 0.5  # margin m of the ranking loss, on cosines (paper: 0.5)
    K: int = 2  # hard new labels each old label is ranked against (LUCIR's 2)
    eta_init: float = 1.0  # the cosine head's learnable scale at the start (the reference code's sigma = 1)
    ranges = {"lambda_base": NON_NEGATIVE, "margin": NON_NEGATIVE, "K": AT_LEAST_ONE, "eta_init": POSITIVE}


class LessForgetCosineHead(nn.Module):
    """LUCIR's SplitCosineLinear: eta * cos(theta_i, f(x)) over the old labels' rows (frozen) and the current
    task's rows (trained), eta learnt from `eta` (1: the reference code's sigma). New rows start uniform in
    +-1/sqrt(dim) and are imprinted before training (LUCIR.imprint)."""

    def __init__(self, in_dim: int, eta: float = 1.0) -> None:
        super().__init__()
        self.in_dim = in_dim
        self.old = nn.Parameter(torch.empty(0, in_dim), requires_grad=False)
        self.new = nn.Parameter(torch.empty(0, in_dim))
        self.eta = nn.Parameter(torch.full((1,), float(eta)))

    @property
    def out_dim(self) -> int:
        return self.old.shape[0] + self.new.shape[0]

    def expand(self, total: int) -> None:
        """The previous task's rows join the frozen old rows; `total - out_dim` fresh rows are the new ones."""
        if total <= self.out_dim:
            return
        bound = 1 / math.sqrt(self.in_dim)
        fresh = torch.empty(total - self.out_dim, self.in_dim, device=self.new.device).uniform_(-bound, bound)
        with torch.no_grad():
            self.old = nn.Parameter(torch.cat([self.old.data, self.new.data]), requires_grad=False)
            self.new = nn.Parameter(fresh)

    def forward(self, features: Tensor) -> Tensor:
        weight = torch.cat([self.old, self.new])
        return self.eta * F.normalize(features, dim=1) @ F.normalize(weight, dim=1).t()


@ALGORITHMS.register("iirc_lucir")
class IIRCLUCIR(MultiLabelLearner[IIRCLUCIRParams]):
    """LUCIR: cosine head with frozen old rows and imprinted new ones, BCE + less-forget + margin ranking."""

    distills = True
    memory_selection = "herding"
    first_task_hparams = ("eta_init",)

    @property
    def head(self) -> LessForgetCosineHead:
        head = self.net.head
        assert isinstance(head, LessForgetCosineHead)
        return head

    def build_network(self) -> nn.Module:
        backbone = self.new_backbone()
        return MultiLabelNet(backbone, LessForgetCosineHead(backbone.out_dim, self.params.eta_init))  # type: ignore[arg-type]

    def fit_task(self, task: TaskData, fit: FitFn) -> None:
        if self.known > 0:
            self.imprint(task)
        super().fit_task(task, fit)

    @torch.no_grad()
    def imprint(self, task: TaskData) -> None:
        """Each new label's row: the normalised mean of its samples' normalised features, at the old rows' mean
        norm (LUCIR section 3.2, the reference code's _imprint_weights); a label without samples keeps its row."""
        was_training = self.net.training
        self.net.eval()
        features = F.normalize(self.batched(self.features, self.herding_batch_size)(task.x), dim=1)
        self.net.train(was_training)
        norm = self.head.old.norm(dim=1).mean()
        positive = task.y[:, self.known : self.total] > 0.5
        for j in range(positive.shape[1]):
            if positive[:, j].any():
                self.head.new[j] = F.normalize(features[positive[:, j]].mean(0), dim=0) * norm

    def loss(self, x: Tensor, y: Tensor) -> Tensor:
        out = self.net(x)
        logits, features = out["logits"][:, : self.total], out["features"]
        assert isinstance(logits, Tensor) and isinstance(features, Tensor)
        y = y.float()
        bce = F.binary_cross_entropy_with_logits(logits, y)
        if self.old_net is None or self.known == 0:
            return bce
        with torch.no_grad():
            old_features = self.old_net(x)["features"]
        weight = self.params.lambda_base * math.sqrt(self.known / (self.total - self.known))
        less_forget = (1 - F.cosine_similarity(features, old_features, dim=1)).mean()
        cosines = logits / self.head.eta.detach()
        ranking = margin_ranking(cosines, y, self.known, self.params.K, self.params.margin)
        return bce + weight * less_forget + ranking


def margin_ranking(cosines: Tensor, y: Tensor, known: int, k: int, margin: float) -> Tensor:
    """LUCIR's inter-class separation for multi-label samples: every old positive label of a sample carrying one
    (a memory sample) against the sample's k highest new-label cosines, max(0, margin - cos_pos + cos_hard),
    averaged over the (sample, positive, hard label) triples; 0 when the batch holds no such sample."""
    old_positive = y[:, :known] > 0.5
    anchors = old_positive.any(1)
    new = cosines.shape[1] - known
    if not bool(anchors.any()) or new == 0 or k < 1:
        return cosines.new_zeros(())
    hard = cosines[anchors, known:].topk(min(k, new), dim=1).values  # (anchors, k)
    gaps = margin - cosines[anchors, :known].unsqueeze(2) + hard.unsqueeze(1)  # (anchors, known, k)
    return F.relu(gaps)[old_positive[anchors]].mean()
