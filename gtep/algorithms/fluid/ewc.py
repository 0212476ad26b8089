"""Elastic Weight Consolidation in FLUID (Kirkpatrick et al., PNAS 2017; papers/fluid.txt Sec. 4, App. C; notes
004.3): standard training on the fine-tune schedule (every layer, lr 0.01) plus the penalty
(lambda / 2) * sum_i F_i (theta_i - theta*_i)^2 that pulls each backbone weight back to theta*, the network frozen
after pretraining (the paper's "optimal model of the pretrain task"), in proportion to its Fisher information F_i.

As in the paper, F is recomputed at the start of every update ("to mitigate catastrophic forgetting"), and its
compute is counted with the update's. The paper computes it on the ImageNet-1K validation images of the pretrain
classes; a gtep learner has no pretraining images and knows the stream's classes by position only, so F here is
the empirical Fisher of the current network on the images seen so far (the stream's pretrain classes among them):
the mean over samples of the squared gradient of -log p(y|x) per weight, over at most `fisher_samples` of them (a
seeded draw; 0: all). The head has no pretrained value (its rows are the stream's classes) and is not penalised;
with `depth` 0 nothing of the backbone trains and the penalty is 0."""
from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.func import functional_call, grad, vmap

from gtep.algorithms.base import ALGORITHMS, NON_NEGATIVE, FitFn, FitRecipe
from gtep.algorithms.fluid.base import Meter
from gtep.algorithms.fluid.finetune import FinetuneParams, FluidFinetune


@dataclass(frozen=True)
class EWCParams(FinetuneParams):
    lr: float = 0.01  # standard training's (EWC trains every layer)
    depth: int = -1
    ewc_lambda: float = 100.0
    fisher_samples: int = 256  # images the Fisher is estimated on at each update (0: every seen image)
    ranges = {"ewc_lambda": NON_NEGATIVE, "fisher_samples": NON_NEGATIVE}  # 0 samples: every seen image


@ALGORITHMS.register("fluid_ewc")
class FluidEWC(FluidFinetune[EWCParams]):
    """Standard training with the EWC penalty towards the pretrained backbone."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.penalised = {n: p for n, p in self.backbone.named_parameters() if p.requires_grad}
        self.anchor = {n: p.detach().clone() for n, p in self.penalised.items()}  # theta*: the pretrained weights
        self.fisher = {n: torch.zeros_like(p) for n, p in self.penalised.items()}

    def penalty(self) -> Tensor:
        terms = [(self.fisher[n] * (p - self.anchor[n]).pow(2)).sum() for n, p in self.penalised.items()]
        return self.params.ewc_lambda / 2 * torch.stack(terms).sum() if terms else torch.zeros(())

    def loss(self, x: Tensor, y: Tensor) -> Tensor:
        return F.cross_entropy(self.net(x)["logits"][:, : self.total], y) + self.penalty()

    def fisher_images(self) -> tuple[Tensor, Tensor]:
        x, y = self.seen()
        cap = self.params.fisher_samples
        if 0 < cap < len(x):
            rows = torch.randperm(len(x), generator=torch.Generator().manual_seed(len(x)))[:cap].to(x.device)
            x, y = x[rows], y[rows]
        return x, y

    def estimate_fisher(self, meter: Meter) -> None:
        """The empirical Fisher of the backbone's trainable weights (module docstring), batched per sample with
        torch.func, the network in eval mode (BatchNorm statistics as at inference)."""
        if not self.penalised:
            return
        x, y = self.fisher_images()
        self.net.eval()
        frozen = {n: t.detach() for n, t in [*self.net.named_parameters(), *self.net.named_buffers()]
                  if n.removeprefix("backbone.") not in self.penalised}
        total = self.total

        def nll(weights: dict[str, Tensor], xi: Tensor, yi: Tensor) -> Tensor:
            state = {**frozen, **{f"backbone.{n}": w for n, w in weights.items()}}
            out = cast(dict[str, Tensor], functional_call(self.net, state, (xi[None],)))
            return F.cross_entropy(out["logits"][:, :total], yi[None])

        weights = {n: p.detach() for n, p in self.penalised.items()}
        squares = {n: torch.zeros_like(p) for n, p in weights.items()}
        per_sample = vmap(grad(nll), in_dims=(None, 0, 0))
        for i in range(0, len(x), 64):
            chunk = x[i: i + 64].to(torch.float32)  # stored images: their test view as a plain tensor
            grads = per_sample(weights, chunk, y[i: i + 64])
            for n, g in grads.items():
                squares[n] += g.detach().pow(2).sum(0)
        self.fisher = {n: s / len(x) for n, s in squares.items()}
        meter.training(lambda xi: self.net(xi), x[:1], len(x))  # a forward and a backward per sample

    def update(self, fit: FitFn, recipe: FitRecipe, meter: Meter) -> None:
        if self.caches_features:  # depth 0: nothing penalised trains; plain fine-tuning
            super().update(fit, recipe, meter)
            return
        self.estimate_fisher(meter)
        self.train_network(fit, recipe, meter, [*self.tuned, self.head], self.loss, self.net)
