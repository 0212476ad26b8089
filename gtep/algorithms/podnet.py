"""PODNet (Douillard et al., ECCV 2020, "PODNet: Pooled Outputs Distillation for Small-Tasks Incremental
Learning"), as PyCIL runs it (models/podnet.py):

- a Local Similarity Classifier (LSC, section 3.2): `nb_proxy` cosine proxies per class, a class's score is
  the softmax-weighted (over its proxies) sum of their cosine similarities, times a learnt scale eta;
  proxies of new classes start random (PyCIL's CosineLinear init; no imprinting);
- the NCA loss with a margin on the LSC outputs (eq. 7);
- pooled-outputs distillation from a frozen copy of the previous model: POD-spatial on every stage's
  feature maps (width and height pooling, L2-normalised, Frobenius distance) weighted by lambda_c, and
  POD-flat (cosine distance of the final embeddings) weighted by lambda_f, both times
  sqrt(total / new classes) when adaptive_factor is set (PyCIL's factor);
- while a new task trains, the proxies of old classes stay fixed (PyCIL: lr 0 for fc1);
- after each incremental task, class-balanced fine-tuning of the classifier alone (all proxies and eta,
  the backbone frozen) on the herded memory, which holds the same number of images of every seen class,
  for ft_epochs at ft_lr under a cosine schedule (PyCIL's ft_epochs / ft_lrate).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gtep.algorithms.base import (
    ALGORITHMS,
    AT_LEAST_ONE,
    NON_NEGATIVE,
    POSITIVE,
    CommonParams,
    FitFn,
    IncrementalLearner,
    TaskData,
)
from gtep.models import Backbone
from gtep.models.heads import BackboneAndHead


@dataclass(frozen=True)
class PODNetParams(CommonParams):
    lambda_c: float = 5.0  # weight of POD-spatial
    lambda_f: float = 1.0  # weight of POD-flat
    nb_proxy: int = 10  # LSC proxies per class
    ft_epochs: int = 20  # class-balanced fine-tuning of the classifier
    ft_lr: float = 0.005  # PyCIL's ft_lrate
    adaptive_factor: bool = True  # scale both distillation terms by sqrt(total / new classes)
    nca_margin: float = 0.6  # NCA margin on the true class (PyCIL's nca default; not tuned)
    nca_scale: float = 1.0  # NCA's extra scale on top of the learnt eta (PyCIL's default; not tuned)
    ranges = {"lambda_c": NON_NEGATIVE, "lambda_f": NON_NEGATIVE, "nb_proxy": AT_LEAST_ONE, "ft_epochs": AT_LEAST_ONE,
              "ft_lr": POSITIVE, "nca_margin": NON_NEGATIVE, "nca_scale": POSITIVE}


class LSCHead(nn.Module):
    """Local Similarity Classifier with one block of proxies per task, so old blocks can be frozen.

    Proxies of class c are rows [c * nb_proxy, (c + 1) * nb_proxy) of the concatenated blocks."""

    def __init__(self, in_dim: int, nb_proxy: int) -> None:
        super().__init__()
        self.in_dim, self.nb_proxy = in_dim, nb_proxy
        self.blocks = nn.ParameterList()
        self.eta = nn.Parameter(torch.ones(1))  # learnt scale, PyCIL's sigma (initialised to 1)

    @property
    def out_dim(self) -> int:
        return sum(b.shape[0] for b in self.blocks) // self.nb_proxy

    @property
    def proxies(self) -> Tensor:
        return torch.cat(list(self.blocks)) if len(self.blocks) else self.eta.new_zeros(0, self.in_dim)

    def expand(self, total: int) -> None:
        new = total - self.out_dim
        if new <= 0:
            return
        bound = 1.0 / math.sqrt(self.in_dim)  # CosineLinear.reset_parameters in PyCIL
        weight = torch.empty(new * self.nb_proxy, self.in_dim, device=self.eta.device).uniform_(-bound, bound)
        self.blocks.append(nn.Parameter(weight))

    def forward(self, features: Tensor) -> Tensor:
        sims = F.normalize(features, dim=1) @ F.normalize(self.proxies, dim=1).t()
        sims = sims.view(len(features), -1, self.nb_proxy)
        return self.eta * (sims.softmax(dim=-1) * sims).sum(dim=-1)


class PODNetNet(BackboneAndHead[LSCHead]):
    """Backbone + LSC head; returns the backbone's fmaps and features plus the LSC logits."""

    def __init__(self, backbone: Backbone, nb_proxy: int) -> None:
        super().__init__(backbone, LSCHead(backbone.out_dim, nb_proxy))


def nca_loss(logits: Tensor, y: Tensor, margin: float, scale: float) -> Tensor:
    """NCA with margin (PODNet section 3.2): [LSE_{i != y}(s * l_i) - s * (l_y - margin)]_+, averaged.

    The margin is subtracted from the true class only, as the paper defines it; PyCIL's nca subtracts it
    from every logit, where it cancels out. The positive is excluded from the denominator, so the hinge
    keeps the loss bounded below while eta grows."""
    positive = F.one_hot(y, logits.shape[1]).bool()
    target = logits.gather(1, y[:, None]).squeeze(1)
    others = (scale * logits).masked_fill(positive, float("-inf"))
    return F.relu(torch.logsumexp(others, dim=1) - scale * (target - margin)).mean()


def pool_width_height(fmap: Tensor) -> Tensor:
    """Squared activations summed along the width and along the height, concatenated, L2-normalised."""
    squared = fmap.pow(2)
    pooled = torch.cat([squared.sum(dim=3).flatten(1), squared.sum(dim=2).flatten(1)], dim=1)
    return F.normalize(pooled, dim=1)


def pod_spatial_loss(fmaps: list[Tensor], old_fmaps: list[Tensor]) -> Tensor:
    """POD-spatial (PODNet section 3.1): per stage, the Euclidean (Frobenius) distance between the width- and
    height-pooled maps of the new and old models, averaged over images; then over stages."""
    loss = fmaps[0].new_zeros(())
    for new, old in zip(fmaps, old_fmaps):
        loss = loss + (pool_width_height(new) - pool_width_height(old)).norm(dim=1).mean()
    return loss / len(fmaps)


def pod_flat_loss(features: Tensor, old_features: Tensor) -> Tensor:
    """POD-flat: cosine distance of the final embeddings (PyCIL's cosine_embedding_loss with targets 1)."""
    return (1 - F.cosine_similarity(features, old_features, dim=1)).mean()


@ALGORITHMS.register("podnet")
class PODNet(IncrementalLearner[PODNetParams]):
    first_task_hparams = ("nb_proxy", "nca_margin", "nca_scale")  # proxies shape the head; NCA trains task 1
    distills = True
    net: PODNetNet

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.factor = 1.0

    def build_network(self) -> nn.Module:
        return PODNetNet(self.new_backbone(), self.params.nb_proxy)

    def grow(self, task: TaskData) -> None:
        super().grow(task)
        # Fewer new classes relative to all seen ones -> stronger distillation (PyCIL, after UCIR).
        ratio = task.total / max(task.total - task.known, 1)
        self.factor = math.sqrt(ratio) if self.params.adaptive_factor else 1.0

    def trainable_parameters(self) -> list[nn.Parameter]:
        # Old classes' proxies are not optimised while the new task trains (PyCIL: lr 0 on fc1).
        head = self.net.head
        return [*self.net.backbone.parameters(), head.eta, head.blocks[-1]]

    def consolidate(self, task: TaskData, fit: FitFn) -> None:
        # After the memory update: the balanced fine-tuning trains on the memory just rebuilt.
        if task.known > 0:
            self.finetune_classifier(task, fit)

    def loss(self, x: Tensor, y: Tensor) -> Tensor:
        out = self.net(x)
        loss = nca_loss(out["logits"], y, self.params.nca_margin, self.params.nca_scale)
        if self.old_net is not None:
            with torch.no_grad():
                old = self.old_net(x)
            spatial = pod_spatial_loss(out["fmaps"], old["fmaps"])
            flat = pod_flat_loss(out["features"], old["features"])
            loss = loss + self.factor * (self.params.lambda_c * spatial + self.params.lambda_f * flat)
        return loss

    def finetune_classifier(self, task: TaskData, fit: FitFn) -> None:
        """Class-balanced fine-tuning of the LSC head on the memory (same count per seen class)."""
        x, y = self.memory.tensors()
        if len(y) == 0:
            return
        self.net.backbone.eval()  # frozen features: BatchNorm statistics must not drift either
        recipe = task.recipe.replace(epochs=task.scaled_epochs(self.params.ft_epochs), lr=self.params.ft_lr,
                                     scheduler="cosine")
        fit(self.net.head.parameters(), self.head_loss, x, y, recipe, modules=[self.net.head])

    def head_loss(self, x: Tensor, y: Tensor) -> Tensor:
        with torch.no_grad():
            features = self.net.backbone(x)["features"]
        logits = self.net.head(features)
        return nca_loss(logits, y, self.params.nca_margin, self.params.nca_scale)
