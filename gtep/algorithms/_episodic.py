"""Episodic Prototypical Network training (Snell et al., "Prototypical Networks for Few-shot Learning", NeurIPS
2017, Algorithm 1), shared by the learners that meta-train a backbone before their stream (the CFSL and FLUID
ProtoNets).

An episode draws `ways` classes, `shots` support and `queries` query images of each; the support embeddings'
class means are the prototypes, and the loss is the cross-entropy of the queries over their negative squared
Euclidean distances to the prototypes (the paper's d = squared Euclidean, its section 2.4 reason: it makes the
classifier linear in the embedding). Distances go through a matrix product so FLOP counters see their cost
(gtep/algorithms/_distances.py says why).
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor


def prototype_logits(queries: Tensor, support: Tensor, support_y: Tensor) -> Tensor:
    """-||q - mu_c||^2 for every query row and every class c of support_y (its mean support row), columns in
    sorted class order: (queries, classes)."""
    classes, inverse = torch.unique(support_y, sorted=True, return_inverse=True)
    sums = torch.zeros(len(classes), support.shape[1], dtype=support.dtype, device=support.device)
    sums = sums.index_add(0, inverse, support)
    counts = torch.bincount(inverse, minlength=len(classes)).to(support.dtype)
    means = sums / counts[:, None]
    return 2 * (queries @ means.t()) - queries.pow(2).sum(1, keepdim=True) - means.pow(2).sum(1)[None, :]


def class_indices(y: Tensor, ways: int, need: int) -> list[Tensor]:
    """The indices of each class of y that has at least `need` images (classes in sorted order); fewer than `ways`
    such classes is a ValueError naming the shortfall."""
    found = [torch.nonzero(y == c).flatten() for c in torch.unique(y, sorted=True)]
    usable = [idx for idx in found if len(idx) >= need]
    if len(usable) < ways:
        raise ValueError(f"episodes of {ways} ways need {ways} classes with at least shots + queries = {need} images "
                         f"each; y has {len(usable)} such classes ({ways - len(usable)} short)")
    return usable


def generator_from_global_rng() -> torch.Generator:
    """A CPU generator seeded from torch's global RNG, which the engine seeds per ordering: the same seed draws
    the same episodes, and drawing them leaves every other use of the global RNG where it was, but one draw."""
    return torch.Generator().manual_seed(int(torch.randint(0, 2**62, (1,)).item()))


def draw_episode(by_class: list[Tensor], ways: int, shots: int, queries: int,
                 generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """Indices of one episode: support first (ways x shots, class-major), then queries (ways x queries)."""
    chosen = torch.randperm(len(by_class), generator=generator)[:ways].tolist()
    picks = []
    for c in chosen:
        idx = by_class[c]
        picks.append(idx[torch.randperm(len(idx), generator=generator)[:shots + queries].to(idx.device)])
    support = torch.cat([p[:shots] for p in picks])
    query = torch.cat([p[shots:] for p in picks])
    return support, query


def train_prototypical(net: torch.nn.Module, embed: Callable[[Tensor], Tensor], x: Tensor, y: Tensor, *,
                       ways: int, shots: int, queries: int, episodes: int, lr: float,
                       generator: torch.Generator, augment: Callable[[Tensor], Tensor] | None = None) -> list[float]:
    """Episodic ProtoNet training (Snell et al. 2017): each episode samples `ways` classes of y, `shots` support
    and `queries` query images per class; the loss is cross-entropy over negative squared Euclidean distances of
    query embeddings to the class means of support embeddings; Adam at lr on net.parameters(). Returns the
    per-episode losses. Classes with fewer than shots + queries images are skipped; fewer than `ways` usable
    classes is a ValueError naming the shortfall.

    Only parameters with requires_grad train (a net frozen on purpose stays frozen; none trainable is a
    ValueError). The net is in train mode during the episodes (BatchNorm learns from episode batches, as in the
    paper) and back in its previous mode after. `generator` (a CPU generator) draws every episode, so the same
    seed gives the same episodes; `augment` maps each episode's images (support and queries) before `embed`.
    A non-finite loss raises FloatingPointError (the engine's "diverged")."""
    for name, value in (("ways", ways), ("shots", shots), ("queries", queries)):
        if value < 1:
            raise ValueError(f"{name} must be at least 1, got {value}")
    by_class = class_indices(y, ways, shots + queries)
    trainable = [p for p in net.parameters() if p.requires_grad]
    if not trainable:
        raise ValueError("the net has no parameter with requires_grad: nothing to meta-train")
    opt = torch.optim.Adam(trainable, lr=lr)
    # episode labels 0..ways-1 in the order the classes were drawn; the support is class-major, so its labels
    # are sorted and prototype_logits' columns are these labels
    support_y = torch.arange(ways).repeat_interleave(shots)
    query_y = torch.arange(ways).repeat_interleave(queries)
    was_training = net.training
    net.train()
    losses: list[float] = []
    try:
        for _ in range(episodes):
            s_idx, q_idx = draw_episode(by_class, ways, shots, queries, generator)
            images = x[torch.cat([s_idx, q_idx]).to(x.device)]
            features = embed(augment(images) if augment is not None else images)
            logits = prototype_logits(features[len(s_idx):], features[:len(s_idx)], support_y.to(features.device))
            loss = F.cross_entropy(logits, query_y.to(features.device))
            if not torch.isfinite(loss):
                raise FloatingPointError(f"non-finite episode loss ({float(loss.detach())})")
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))
    finally:
        net.train(was_training)
    return losses
