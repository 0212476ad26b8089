"""RanPAC (McDonnell et al., "RanPAC: Random Projections and Pre-trained Models for Continual Learning",
NeurIPS 2023), as PILOT implements it (Sun et al. 2023).

Phase 1, first task only (first-session adaptation): parameter-efficient tuning (PETL) of the frozen
pretrained ViT with a cosine linear head trained by cross-entropy; then every weight is frozen for good.
PETL is AdaptFormer adapters beside each block's MLP (bottleneck `ffn_num`, the default: PILOT's RanPAC
runs the `_adapter` ViT-B/16 and Table 5 tunes ffn_num for it) or, with `petl: prompt`, VPT-shallow
(`prompt_token_num` learnable tokens prepended to the input).

Phase 2, every task: a frozen Gaussian random projection W (embed_dim x M) and a ReLU lift each feature to
h = relu(f W). The Gram matrix G = sum h h^T and Q = sum h y^T (one-hot targets) accumulate over all data
seen, so the head W_o = (G + lambda I)^{-1} Q is the ridge-regression solution on every seen image without
keeping any of them. lambda is chosen anew each task among `ridge_candidates` by fitting on part of the
current task and scoring MSE on the held-out rest (PILOT fits on 80%, scores on 20%).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gtep.algorithms._pretrained import PretrainedLearner
from gtep.algorithms.base import ALGORITHMS, AT_LEAST_ONE, NON_NEGATIVE, POSITIVE, CommonParams, FitFn, Range, TaskData
from gtep.models.vit import Adapter, PromptableViT


@dataclass(frozen=True)
class RanPACParams(CommonParams):
    petl: Literal["adapter", "prompt"] = "adapter"  # first-session PETL: AdaptFormer adapters or VPT-shallow
    ffn_num: int = 64  # adapter bottleneck width
    prompt_token_num: int = 30  # learnable input tokens when petl is "prompt"
    M: int = 10000  # random-projection width; 0 = no projection (the paper's decorrelation-only ablation)
    ridge_candidates: tuple[float, ...] = tuple(10.0 ** k for k in range(-8, 9))  # PILOT's 1e-8 ... 1e8
    ridge_holdout: float = 0.2  # share of the current task held out to choose lambda
    ranges = {"ffn_num": AT_LEAST_ONE, "prompt_token_num": AT_LEAST_ONE, "M": NON_NEGATIVE,
              "ridge_candidates": POSITIVE,  # a ridge of 0 leaves the solve singular when M passes the images
              "ridge_holdout": Range(0, 1, low_open=True, high_open=True)}


class CosineHead(nn.Module):
    """PILOT's CosineLinear: a learnt scale times the cosine between feature and class weight."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(0, dim))
        self.sigma = nn.Parameter(torch.ones(1))

    def expand(self, total: int) -> None:
        bound = 1 / math.sqrt(self.weight.shape[1])
        extra = torch.empty(total - len(self.weight), self.weight.shape[1], device=self.weight.device)
        self.weight = nn.Parameter(torch.cat([self.weight.data, extra.uniform_(-bound, bound)]))

    def forward(self, features: Tensor) -> Tensor:
        return self.sigma * F.normalize(features, dim=1) @ F.normalize(self.weight, dim=1).t()


class RanPACNet(nn.Module):
    """Backbone + PETL; a cosine head in the first session, the random-projection ridge head after."""

    w_rand: Tensor
    w_out: Tensor
    prompts: nn.Parameter | None

    def __init__(self, backbone: PromptableViT, params: RanPACParams) -> None:
        super().__init__()
        self.backbone = backbone
        dim = backbone.out_dim
        # Drawn once from the run-seeded RNG before any PETL init, so a seed gives the same W whatever the
        # PETL settings; on the CPU so it is the same W on any device.
        self.register_buffer("w_rand", torch.randn(dim, params.M) if params.M > 0 else torch.empty(dim, 0))
        self.adapters = None
        self.register_parameter("prompts", None)
        if params.petl == "adapter":
            self.adapters = nn.ModuleList(Adapter(dim, params.ffn_num) for _ in range(backbone.depth))
        else:
            # VPT's init (uniform, xavier bound over patch pixels and width): zero tokens would stay identical
            patch = backbone.vit.patch_embed.patch_size
            bound = math.sqrt(6.0 / (3 * patch[0] * patch[1] + dim))
            self.prompts = nn.Parameter(torch.empty(1, params.prompt_token_num, dim).uniform_(-bound, bound))
        self.head: CosineHead | None = CosineHead(dim)
        width = params.M if params.M > 0 else dim
        self.register_buffer("w_out", torch.zeros(width, 0))

    def expand(self, total: int) -> None:
        """The first session's cosine head grows; the ridge head's columns come with its solution."""
        if self.head is not None:
            self.head.expand(total)

    def petl_parameters(self) -> list[nn.Parameter]:
        if self.adapters is not None:
            return list(self.adapters.parameters())
        if self.prompts is None:
            raise RuntimeError("RanPACNet has neither adapters nor prompts")
        return [self.prompts]

    def embed(self, x: Tensor) -> Tensor:
        prompts = self.prompts.expand(len(x), -1, -1) if self.prompts is not None else None
        return self.backbone(x, prompts=prompts, adapters=self.adapters)["features"]

    def project(self, features: Tensor) -> Tensor:
        """h = relu(f W): the nonlinear random expansion the ridge head reads (f itself when M is 0)."""
        return F.relu(features @ self.w_rand) if self.w_rand.shape[1] else features

    def forward(self, x: Tensor) -> dict[str, Tensor]:
        features = self.embed(x)
        logits = self.head(features) if self.head is not None else self.project(features) @ self.w_out
        return {"features": features, "logits": logits}


def solve_ridge(gram: Tensor, targets: Tensor, ridge: float) -> Tensor:
    """W_o = (G + lambda I)^{-1} Q; a solve, not an inverse, for stability (as PILOT)."""
    eye = torch.eye(len(gram), device=gram.device, dtype=gram.dtype)
    return torch.linalg.solve(gram + ridge * eye, targets)


def select_ridge(h: Tensor, y: Tensor, candidates: tuple[float, ...], holdout: float,
                 generator: torch.Generator | None = None) -> float:
    """The candidate whose ridge fit on a random (1 - holdout) share of (h, y) has the lowest MSE on the rest.

    Each candidate is fitted with the same float32 solve as the head, as PILOT does (one M x M solve per
    candidate). A lambda too small for that solve to resolve (M above the number of images) then scores
    badly and is not chosen; an exact SVD path, far cheaper, would choose it and leave the head unusable.
    """
    n = len(h)
    order = torch.randperm(n, generator=generator).to(h.device)
    n_val = min(max(1, round(n * holdout)), n - 1)
    val, fit = order[:n_val], order[n_val:]
    gram, targets = h[fit].t() @ h[fit], h[fit].t() @ y[fit]
    eye = torch.eye(len(gram), device=h.device, dtype=h.dtype)
    losses = []
    for ridge in candidates:
        weights, info = torch.linalg.solve_ex(gram + ridge * eye, targets)
        loss = (h[val] @ weights - y[val]).pow(2).mean()
        losses.append(torch.where((info == 0) & loss.isfinite(), loss, torch.full_like(loss, float("inf"))))
    return candidates[int(torch.stack(losses).argmin())]


@ALGORITHMS.register("ranpac")
class RanPAC(PretrainedLearner[RanPACParams]):
    """RanPAC (McDonnell et al. 2023): first-session PETL, then a random-projection ridge head."""

    net: RanPACNet

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        width = self.net.w_out.shape[0]
        self.gram = torch.zeros(width, width, device=self.device)  # G = sum h h^T over every image seen
        self.targets = torch.zeros(width, 0, device=self.device)  # Q = sum h y^T, one column per class
        self.ridge: float | None = None  # the lambda chosen on the latest task

    def build_network(self) -> nn.Module:
        return RanPACNet(self.new_backbone(), self.params)

    def fit_task(self, task: TaskData, fit: FitFn) -> None:
        if self.net.head is not None:  # first session: the only training RanPAC does
            petl = self.net.petl_parameters()
            head = list(self.net.head.parameters())
            fit(petl + head, self.loss, task.x, task.y, task.recipe, modules=[self.net])
            for p in petl:
                p.requires_grad_(False)
            self.net.head = None  # the ridge head replaces it
        self.update_ridge_head(task)

    @torch.no_grad()
    def update_ridge_head(self, task: TaskData) -> None:
        # Each image is encoded once, without augmentation (PILOT's test-mode loader).
        h = self.encode(lambda x: self.net.project(self.net.embed(x)), task.x, self.params.batch_size)
        y = F.one_hot(task.y, task.total).to(h.dtype)
        new_columns = self.targets.new_zeros(len(self.gram), task.total - self.targets.shape[1])
        self.targets = torch.cat([self.targets, new_columns], dim=1)
        self.gram += h.t() @ h
        self.targets += h.t() @ y
        self.ridge = select_ridge(h, y, tuple(self.params.ridge_candidates), self.params.ridge_holdout)
        self.net.w_out = solve_ridge(self.gram, self.targets, self.ridge)

    def parameter_counts(self) -> tuple[int, int]:
        """Learnt: the PETL modules (first session) and the head (W_o, solved in closed form); the frozen
        backbone and the fixed random W count only in the total."""
        net = self.net
        head = sum(p.numel() for p in net.head.parameters()) if net.head is not None else net.w_out.numel()
        learnt = sum(p.numel() for p in net.petl_parameters()) + head
        return sum(p.numel() for p in net.backbone.parameters()) + net.w_rand.numel() + learnt, learnt

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "gram": self.gram, "targets": self.targets, "ridge": self.ridge}
