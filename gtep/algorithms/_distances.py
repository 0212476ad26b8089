"""Euclidean distances through a matrix product, so that compute meters see their cost.

torch.utils.flop_counter.FlopCounterMode counts no FLOPs for torch.cdist, so a nearest-mean classifier or a
distance-based unseen-class detector built on it looked free wherever MACs are reported (FLUID's GMACs, issue
31). ||a - b||^2 = ||a||^2 + ||b||^2 - 2 a.b puts the cost (rows(a) x rows(b) x dim MACs) in one matmul the
counter sees; the norms are a lower-order term it does not count, as it counts no elementwise op.
"""
from __future__ import annotations

from torch import Tensor


def euclidean(a: Tensor, b: Tensor) -> Tensor:
    """||a_i - b_j|| for the rows of a (n, d) and b (m, d): (n, m), as torch.cdist gives it up to rounding."""
    squared = a.pow(2).sum(1, keepdim=True) + b.pow(2).sum(1)[None, :] - 2 * (a @ b.t())
    return squared.clamp_min(0).sqrt()  # rounding can leave a tiny negative where a_i == b_j
