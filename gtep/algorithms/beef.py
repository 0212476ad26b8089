"""BEEF (Wang et al., "BEEF: Bi-Compatible Class-Incremental Learning via Energy-Based Expansion and Fusion",
ICLR 2023), as PyCIL's BEEFISO runs it (the variant the GTEP paper evaluates; PyCIL has no compression).

* Expansion. Each task adds a backbone initialised from the first one; the old backbones and the old head
  are frozen. On the new backbone's features alone a head is trained over one "backward prototype" per old
  task plus the new classes (old samples are labelled with their task), the old-task logits divided by
  logits_alignment. Forward compatibility comes from an energy term (energy_weight): out-of-distribution
  samples are synthesised from the batch (rotated 180 degrees, then a few SGLD steps that drain their
  probability from the energy classes) and must be classified into an extra "energy" class per seen class.
  The first task trains its one backbone with the same energy term.
* Fusion. The two models' classifiers are merged bi-compatibly: an old class's logit is the old head's plus
  its task's backward prototype on the new features, rescaled by a learnt (1 + alpha_t, beta_t) per old task.
  Only those alignments are trained, on a class-balanced set (the memory and as many random samples of each
  new class), for fusion_epochs at PyCIL's fixed fusion lr. The merged classifier becomes one linear head
  over all backbones' concatenated features, so the model grows by one backbone per task, as DER does.

The paper reports NaN training losses on some seeds (the synthesis amplifies the features without bound);
nothing here masks them: a NaN reaches the training loop, which ends the ordering as diverged.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

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
    TaskData,
    freeze,
    required,
)
from gtep.models.heads import LinearHead
from gtep.protocol.sampling import steplr_milestones


@dataclass(frozen=True)
class BEEFParams(CommonParams):
    fusion_epochs: int = 60
    energy_weight: float = 0.01
    logits_alignment: float = 1.7  # divides the old tasks' logits while expanding
    # PyCIL's fixed values, not tuned by the paper: the fusion stage's lr and the sample synthesis.
    fusion_lr: float = 0.05
    sgld_steps: int = 3
    sgld_lr: float = 0.01
    sgld_noise: float = 0.001
    # "all": every frozen backbone keeps its BatchNorm statistics. "first": PyCIL's BEEFISO, which puts only the
    # first backbone in eval mode, so the statistics of those between it and the newest follow every batch
    # its network sees (expansion, synthesised samples, fusion's balanced set). An ablation, not tuned.
    statistics_kept: Literal["all", "first"] = "all"
    # "kept": the old head's bias is part of the old classes' logits, in training, evaluation and the merged head.
    # "dropped": PyCIL's BEEFISO, whose forward adds no old-head bias (`fc_bias=+new_fc_bias`) while a task is
    # learnt and evaluated, so only the last fusion's (1 + alpha) b + beta reaches an old class. An ablation.
    old_head_bias: Literal["kept", "dropped"] = "kept"
    ranges = {"fusion_epochs": AT_LEAST_ONE, "energy_weight": NON_NEGATIVE, "logits_alignment": POSITIVE,
              "fusion_lr": POSITIVE, "sgld_steps": NON_NEGATIVE, "sgld_lr": NON_NEGATIVE, "sgld_noise": NON_NEGATIVE}


class BeefNet(nn.Module):
    """Backbones (old ones frozen) with the merged head of the old model and, while a task is learnt, the
    new model's heads on the newest backbone: new classes, backward and forward (energy) prototypes."""

    def __init__(self, backbone: str, statistics_kept: str = "all", old_head_bias: str = "kept") -> None:
        super().__init__()
        self.stack = BackboneStack(backbone, statistics_kept)
        self.old_head_bias = old_head_bias
        self.stack.grow()
        self.old_head: LinearHead | None = None  # over the old backbones' features, old classes
        self.new_head: LinearHead | None = None
        self.backward: LinearHead | None = None
        self.energy_head: LinearHead | None = None
        self.alpha = nn.Parameter(torch.zeros(0), requires_grad=False)
        self.beta = nn.Parameter(torch.zeros(0), requires_grad=False)
        self.register_buffer("class_task", torch.zeros(0, dtype=torch.long))  # task of each old class

    def expand(self, known: int, total: int, class_task: Tensor) -> None:
        """PyCIL's update_fc_before: a new backbone copied from the first, fresh heads and alignments."""
        if known:
            self.stack.grow(init_from=0)
        device, d, tasks = class_task.device, self.stack.out_dim, int(class_task.max()) + 1 if known else 0
        self.class_task = class_task
        self.new_head = LinearHead(d, total - known).to(device)
        self.energy_head = LinearHead(d, total).to(device)
        self.backward = LinearHead(d, tasks).to(device) if tasks else None
        self.alpha = nn.Parameter(torch.zeros(tasks, device=device), requires_grad=False)
        self.beta = nn.Parameter(torch.zeros(tasks, device=device), requires_grad=False)

    def branch(self, new_features: Tensor) -> tuple[Tensor, Tensor]:
        """The new model alone: logits over [old tasks' backward prototypes, new classes], energy logits."""
        new = required(self.new_head, "BEEF's new head")(new_features)
        train = new if self.backward is None else torch.cat([self.backward(new_features), new], dim=1)
        return train, required(self.energy_head, "BEEF's energy head")(new_features)

    def forward(self, x: Tensor) -> dict[str, Tensor]:
        features = self.stack(x)
        if self.new_head is None:  # merged: one head over every backbone
            return {"features": features, "logits": required(self.old_head, "BEEF's merged head")(features)}
        d = self.stack.out_dim
        train, energy = self.branch(features[:, -d:])
        if self.old_head is None:
            logits = train
        else:
            tasks = len(self.alpha)
            aligned = train[:, :tasks] * (1 + self.alpha) + self.beta
            # PyCIL's forward drops the old head's bias ("fc_bias=+new_fc_bias") in training and evaluation;
            # by default we keep it (old_head_bias "dropped" does as PyCIL), and the merged head agrees either way.
            old = self.old_logits(features[:, :-d]) + aligned[:, self.class_task]
            logits = torch.cat([old, train[:, tasks:]], dim=1)
        return {"features": features, "logits": logits, "train_logits": train, "energy_logits": energy}

    def old_logits(self, old_features: Tensor) -> Tensor:
        head = required(self.old_head, "BEEF's merged head")
        return head(old_features) if self.old_head_bias == "kept" else F.linear(old_features, head.weight)

    @torch.no_grad()
    def merge(self) -> None:
        """PyCIL's update_fc_after: fold the bi-compatible logits into one frozen linear head."""
        d, new = self.stack.out_dim, required(self.new_head, "BEEF's new head")
        if self.old_head is None:
            merged = new
        else:
            backward = required(self.backward, "BEEF's backward prototypes")
            known = self.old_head.out_dim
            scale = (1 + self.alpha)[self.class_task]
            merged = LinearHead(self.stack.feature_dim, known + new.out_dim).to(new.weight.device)
            merged.weight.zero_()
            merged.weight[:known, :-d] = self.old_head.weight
            merged.weight[:known, -d:] = backward.weight[self.class_task] * scale[:, None]
            merged.weight[known:, -d:] = new.weight
            old_bias = self.old_head.bias if self.old_head_bias == "kept" else torch.zeros_like(self.old_head.bias)
            merged.bias[:known] = old_bias + backward.bias[self.class_task] * scale + self.beta[self.class_task]
            merged.bias[known:] = new.bias
        self.old_head = freeze(merged)
        self.new_head = self.backward = self.energy_head = None
        self.alpha = nn.Parameter(torch.zeros(0, device=new.weight.device), requires_grad=False)
        self.beta = nn.Parameter(torch.zeros(0, device=new.weight.device), requires_grad=False)


@ALGORITHMS.register("beef")
class BEEF(IncrementalLearner[BEEFParams]):
    first_task_hparams = ("energy_weight", "sgld_steps", "sgld_lr", "sgld_noise")  # the energy loss trains task 1 too
    net: BeefNet

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.task_sizes: list[int] = []

    def build_network(self) -> nn.Module:
        return BeefNet(self.backbone_name, self.params.statistics_kept, self.params.old_head_bias)

    def grow(self, task: TaskData) -> None:
        sizes = torch.tensor(self.task_sizes, dtype=torch.long)
        class_task = torch.repeat_interleave(torch.arange(len(self.task_sizes)), sizes).to(self.device)
        self.net.expand(task.known, task.total, class_task)
        self.task_sizes.append(task.total - task.known)

    def fit_task(self, task: TaskData, fit: FitFn) -> None:
        super().fit_task(task, fit)  # expansion
        if task.known:
            self.fuse(task, fit)

    def consolidate(self, task: TaskData, fit: FitFn) -> None:
        # After the memory update (PyCIL merges first): herding reads the backbones' features, which
        # merging the heads leaves alone.
        self.net.merge()

    # ---- expansion -------------------------------------------------------------------------------
    def pseudo_targets(self, y: Tensor) -> Tensor:
        """Old samples are labelled with their task (its backward prototype), new ones after those."""
        if self.known == 0:
            return y
        tasks = len(self.net.alpha)
        old_task = self.net.class_task[y.clamp(max=self.known - 1)]
        return torch.where(y < self.known, old_task, y - self.known + tasks)

    def loss(self, x: Tensor, y: Tensor) -> Tensor:
        # Only the newest backbone matters while expanding: the old ones are frozen and not in this loss.
        train, _ = self.net.branch(self.net.stack.newest(x))
        pseudo = self.pseudo_targets(y)
        tasks = len(self.net.alpha)
        if tasks:
            train = torch.cat([train[:, :tasks] / self.params.logits_alignment, train[:, tasks:]], dim=1)
        clf = F.cross_entropy(train, pseudo)
        synthesised = self.synthesise(x)
        self.follow_middle_statistics(x, synthesised)
        return clf + self.params.energy_weight * self.energy_loss(synthesised, y, pseudo)

    @torch.no_grad()
    def follow_middle_statistics(self, *batches: Tensor) -> None:
        """statistics_kept "first": PyCIL's expansion runs every backbone on each batch and on its synthesised
        samples, so the middle backbones' BatchNorm statistics follow them; they add nothing to the loss."""
        for backbone in self.net.stack.middle:
            for batch in batches:
                backbone(batch)

    def energy_loss(self, synthesised: Tensor, y: Tensor, pseudo: Tensor) -> Tensor:
        """Synthesised samples must fall into the energy class of their source's class (PyCIL's
        get_energy_loss), with the real-class logits of the batch's labels masked to a constant."""
        train, energy = self.net.branch(self.net.stack.newest(synthesised))
        logits = torch.cat([train, energy], dim=1).index_fill(1, pseudo, 1e-9)
        return F.cross_entropy(logits, y + train.shape[1])

    def synthesise(self, x: Tensor) -> Tensor:
        """PyCIL's sample_q: rotate the batch by 180 degrees, then take SGLD steps (gradient + Gaussian
        noise) that lower the log of the total energy-class probability, with the model in eval mode."""
        was_training = self.net.training
        self.net.eval()
        xk = torch.rot90(x, 2, (2, 3)).detach()
        for _ in range(self.params.sgld_steps):
            xk.requires_grad_(True)
            with torch.enable_grad():
                train, energy = self.net.branch(self.net.stack.newest(xk))
                # log of the summed energy-class probability, in log space: the plain sum underflows to 0
                # once the model is confident, and log(0) turns the samples to NaN
                log_probs = F.log_softmax(torch.cat([train, energy], dim=1).float(), dim=1)
                log_mass = torch.logsumexp(log_probs[:, train.shape[1]:].flatten(), dim=0)
                (grad,) = torch.autograd.grad(log_mass, xk)
            xk = (xk - self.params.sgld_lr * grad + self.params.sgld_noise * torch.randn_like(xk)).detach()
        self.net.train(was_training)
        return xk

    # ---- fusion ----------------------------------------------------------------------------------
    def balanced_set(self, task: TaskData) -> tuple[Tensor, Tensor]:
        """The memory plus, per new class, as many random samples as an old class keeps (PyCIL's val
        split)."""
        quota = self.memory.per_class(task.known)
        perm = torch.randperm(len(task.y), device=task.y.device)
        order = perm[torch.argsort(task.y[perm], stable=True)]
        ys = task.y[order]
        counts = torch.bincount(ys, minlength=task.total)
        rank = torch.arange(len(ys), device=ys.device) - (torch.cumsum(counts, 0) - counts)[ys]
        keep = order[rank < quota]
        mx, my = self.memory.tensors()
        if len(my) == 0:
            return task.x[keep], task.y[keep]
        return torch.cat([task.x[keep], mx]), torch.cat([task.y[keep], my])

    def fuse(self, task: TaskData, fit: FitFn) -> None:
        net = self.net
        heads = (required(net.new_head, "BEEF's new head"), required(net.backward, "BEEF's backward prototypes"),
                 required(net.energy_head, "BEEF's energy head"))
        for module in (net.stack.backbones[-1], *heads):
            freeze(module)
        net.alpha.requires_grad_(True)
        net.beta.requires_grad_(True)
        x, y = self.balanced_set(task)
        epochs = task.scaled_epochs(self.params.fusion_epochs)
        recipe = task.recipe.replace(epochs=epochs, lr=self.params.fusion_lr,
                                     milestones=tuple(steplr_milestones(epochs, self.params.milestone_num)))
        # The newest backbone is frozen but, as in PyCIL, in train mode: its BatchNorm statistics follow
        # the balanced set.
        fit([net.alpha, net.beta], lambda xb, yb: F.cross_entropy(net(xb)["logits"], yb), x, y, recipe,
            modules=[net])
