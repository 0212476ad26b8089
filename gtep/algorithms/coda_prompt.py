"""CODA-Prompt (Smith et al., "CODA-Prompt: COntinual Decomposed Attention-based Prompting for
Rehearsal-Free Continual Learning", CVPR 2023), as PILOT implements it (Sun et al. 2023).

Each prompted layer holds a pool of M components: prompts P_m (L tokens), keys K_m and attention vectors
A_m. The query q is the frozen ViT's [CLS] feature (no prompts, no gradient). The weights are
alpha_m = cos(q * A_m, K_m) (paper eq. 4-5) and the prompt is sum_m alpha_m P_m, attached as a prefix: its
first L/2 tokens extend the layer's keys, the rest its values (prefix-tuning, layers 0-4 as PILOT).

The pool is split evenly over tasks. In task t only its own block of M / n_tasks components trains;
earlier blocks are frozen (stored apart from the optimised parameters, so not even weight decay
touches them) and later ones are unused. A new block starts orthonormal and orthogonal to every earlier
component (the paper's Gram-Schmidt, done here by QR), and `ortho_mu` * mean((B B^T - I)^2) over K, A
and flattened P (earlier components included, without gradient) keeps it so (paper eq. 6, PILOT's
scale). The head is linear (nn.Linear's init, as PILOT's); logits of earlier tasks' classes are masked
out in training (PILOT's train mask), so a task's cross-entropy only separates its own classes.

The learner does not see the scenario's length, so `n_tasks` is a hyperparameter (default 10, the
paper's 10-task scenarios; set it to 20 for the 20-task ones). Tasks past n_tasks each get one more
block, so the pool grows beyond pool_size instead of failing mid-study.
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gtep.algorithms._pretrained import PretrainedLearner
from gtep.algorithms.base import (
    ALGORITHMS,
    AT_LEAST_ONE,
    NON_NEGATIVE,
    CommonParams,
    Constraint,
    FitFn,
    Optimizer,
    Range,
    Scheduler,
    TaskData,
)
from gtep.models.heads import LinearHead
from gtep.models.vit import Prefix, PromptableViT


@dataclass(frozen=True)
class CodaPromptParams(CommonParams):
    # General defaults are PILOT's original CODA-Prompt recipe (paper appendix A.2).
    epochs: int = 50
    lr: float = 0.001
    batch_size: int = 128
    weight_decay: float = 0.0
    scheduler: Scheduler = "cosine"
    optimizer: Optimizer = "adam"
    pool_size: int = 100  # e_pool_size: components over all tasks, per prompted layer
    prompt_length: int = 8  # e_p_length: tokens per component, half key prefix and half value prefix
    ortho_mu: float = 0.0  # weight of the orthogonality penalty
    n_tasks: int = 10  # tasks the pool is split over (the scenario's length; see the module docstring)
    prompt_layers: tuple[int, ...] = (0, 1, 2, 3, 4)  # PILOT's e_layers, clamped to the model depth
    ranges = {"pool_size": AT_LEAST_ONE, "prompt_length": Range(2), "ortho_mu": NON_NEGATIVE, "n_tasks": AT_LEAST_ONE,
              "prompt_layers": NON_NEGATIVE}
    constraints = (Constraint(("prompt_length",), lambda length: length % 2 == 0,
                              "prompt_length must be even (half key, half value prefix)"),)


def orthogonal_block(earlier: Tensor, n: int) -> Tensor:
    """n unit rows per layer, orthogonal to one another and to the span of `earlier` (layers, s, d).

    Gram-Schmidt of random vectors against the earlier ones, as the paper, in closed form: project out an
    orthonormal basis of the earlier span, then orthonormalise (QR). A d-dimensional space holds at most d
    orthogonal rows; when the earlier ones leave no room, the block is only orthonormal in itself."""
    layers, s, d = earlier.shape
    new = torch.randn(layers, n, d, device=earlier.device, dtype=earlier.dtype)
    if s and s + n <= d:
        basis = torch.linalg.qr(earlier.mT).Q  # (layers, d, s)
        new = new - (new @ basis) @ basis.mT
    if n <= d:
        return torch.linalg.qr(new.mT).Q.mT
    return F.normalize(new, dim=-1)


def ortho_penalty(t: Tensor) -> Tensor:
    """mean((T T^T - I)^2) per layer, summed over layers; T is (layers, n, d). Zero iff T's rows are
    orthonormal. PILOT's scale (a mean, not the paper's squared norm), which its ortho_mu values assume."""
    eye = torch.eye(t.shape[-2], device=t.device, dtype=t.dtype)
    return ((t @ t.mT - eye) ** 2).mean(dim=(-2, -1)).sum()


class CodaPromptNet(nn.Module):
    """Frozen PromptableViT, the component pool of every prompted layer and a growing linear head.

    Finished components live in buffers `pool_*` (layers, capacity, ...); the current task's block is the
    parameters `p`, `k`, `a`, copied into the pool when the task ends."""

    pool_p: Tensor
    pool_k: Tensor
    pool_a: Tensor

    def __init__(self, backbone: PromptableViT, layers: tuple[int, ...], pool_size: int, length: int) -> None:
        super().__init__()
        self.backbone = backbone
        self.layers = tuple(sorted({layer for layer in layers if 0 <= layer < backbone.depth}))
        nl, d = len(self.layers), backbone.out_dim
        self.length = length
        self.register_buffer("pool_p", torch.zeros(nl, pool_size, length, d))
        self.register_buffer("pool_k", torch.zeros(nl, pool_size, d))
        self.register_buffer("pool_a", torch.zeros(nl, pool_size, d))
        self.start = 0  # components of finished tasks
        self.p = nn.Parameter(torch.zeros(nl, 0, length, d))
        self.k = nn.Parameter(torch.zeros(nl, 0, d))
        self.a = nn.Parameter(torch.zeros(nl, 0, d))
        self.head = LinearHead(d)

    def expand(self, total: int) -> None:
        """New head rows with nn.Linear's default init, which PILOT's CODA-Prompt head (nn.Linear) has."""
        known = self.head.out_dim
        self.head.expand(total)
        bound = 1 / math.sqrt(self.head.in_dim)
        with torch.no_grad():
            self.head.weight[known:].uniform_(-bound, bound)
            self.head.bias[known:].uniform_(-bound, bound)

    def start_block(self, n: int) -> None:
        """Open the next task's n components, orthogonal to all earlier ones (P flattened, as the paper)."""
        self.start += self.k.shape[1]
        if self.start + n > self.pool_k.shape[1]:
            warnings.warn(f"CODA-Prompt: more tasks than n_tasks; the pool grows to {self.start + n} "
                          "components (set n_tasks to the scenario's number of tasks)")
            extra = self.start + n - self.pool_k.shape[1]
            for name in ("pool_p", "pool_k", "pool_a"):
                pool = getattr(self, name)
                grown = torch.cat([pool, pool.new_zeros(pool.shape[0], extra, *pool.shape[2:])], dim=1)
                setattr(self, name, grown)
        s, nl = self.start, len(self.layers)
        self.p = nn.Parameter(orthogonal_block(self.pool_p[:, :s].flatten(2), n).view(nl, n, self.length, -1))
        self.k = nn.Parameter(orthogonal_block(self.pool_k[:, :s], n))
        self.a = nn.Parameter(orthogonal_block(self.pool_a[:, :s], n))

    @torch.no_grad()
    def end_block(self) -> None:
        s, f = self.start, self.start + self.k.shape[1]
        self.pool_p[:, s:f], self.pool_k[:, s:f], self.pool_a[:, s:f] = self.p, self.k, self.a

    def components(self) -> tuple[Tensor, Tensor, Tensor]:
        """P, K, A of every task so far: earlier blocks without gradient, then the current one."""
        s = self.start
        return (torch.cat([self.pool_p[:, :s], self.p], 1), torch.cat([self.pool_k[:, :s], self.k], 1),
                torch.cat([self.pool_a[:, :s], self.a], 1))

    def prompts(self, q: Tensor) -> Tensor:
        """sum_m alpha_m P_m with alpha_m = cos(q * A_m, K_m): (B, layers, L, D).

        (q*A).K = q.(A*K) and |q*A|^2 = q^2.A^2, so no (batch, components, dim) tensor is built."""
        p, k, a = self.components()
        dot = torch.einsum("bd,lmd->blm", q, a * k)
        q_norm = torch.einsum("bd,lmd->blm", q * q, a * a).clamp(min=1e-24).sqrt()
        alpha = dot / (q_norm * k.norm(dim=-1).clamp(min=1e-12))
        return torch.einsum("blm,lmtd->bltd", alpha, p)

    def forward(self, x: Tensor) -> dict[str, Tensor]:
        with torch.no_grad():  # the query is the frozen model's [CLS] feature, as in the paper
            q = self.backbone(x)["features"]
        prompt, half = self.prompts(q), self.length // 2
        prefixes = {layer: Prefix(key=prompt[:, i, :half], value=prompt[:, i, half:])
                    for i, layer in enumerate(self.layers)}
        out = self.backbone(x, prefixes=prefixes)
        out["logits"] = self.head(out["features"])
        return out


@ALGORITHMS.register("coda_prompt")
class CodaPrompt(PretrainedLearner[CodaPromptParams]):
    """CODA-Prompt (Smith et al. 2023): attention-weighted sums of a task-partitioned component pool."""

    net: CodaPromptNet

    def build_network(self) -> nn.Module:
        p = self.params
        if p.prompt_length < 2 or p.prompt_length % 2:
            raise ValueError(f"prompt_length={p.prompt_length} must be even: half key, half value prefix")
        problem = p.range_problem("pool_size", p.pool_size) or p.range_problem("n_tasks", p.n_tasks)
        if problem:  # the one at fault, not both
            raise ValueError(problem)
        return CodaPromptNet(self.new_backbone(), tuple(p.prompt_layers), p.pool_size, p.prompt_length)

    def grow(self, task: TaskData) -> None:
        self.net.expand(task.total)
        # PILOT's int(pool / n_tasks); at least one, or a task would have nothing to train.
        self.net.start_block(max(1, self.params.pool_size // self.params.n_tasks))

    def trainable_parameters(self) -> list[nn.Parameter]:
        # The current block and the head; finished blocks are buffers, the ViT is frozen.
        return [self.net.p, self.net.k, self.net.a, *self.net.head.parameters()]

    def loss(self, x: Tensor, y: Tensor) -> Tensor:
        logits = self.net(x)["logits"][:, : self.total]
        old = torch.arange(self.total, device=logits.device) < self.known
        loss = F.cross_entropy(logits.masked_fill(old, float("-inf")), y)
        if self.params.ortho_mu > 0:
            loss = loss + self.params.ortho_mu * self.orthogonality()
        return loss

    def orthogonality(self) -> Tensor:
        """The penalty on K, A and flattened P of all tasks so far; only the current block gets gradient."""
        p, k, a = self.net.components()
        return ortho_penalty(k) + ortho_penalty(a) + ortho_penalty(p.flatten(2))

    def consolidate(self, task: TaskData, fit: FitFn) -> None:
        self.net.end_block()

    def parameter_counts(self) -> tuple[int, int]:
        """Trainable: the whole component pool (each block trains during its task; PILOT counts the pool
        allocated up front) and the head. The working copy of the current block is not counted twice."""
        pool = sum(b.numel() for b in (self.net.pool_p, self.net.pool_k, self.net.pool_a))
        head = sum(p.numel() for p in self.net.head.parameters())
        frozen = sum(p.numel() for p in self.net.backbone.parameters())
        return frozen + pool + head, pool + head
