"""What every backbone is, for the learners and the type checker alike."""
from __future__ import annotations

from torch import nn


class Backbone(nn.Module):
    """Maps images (N, 3, H, W) to {"features": (N, out_dim), "fmaps": [stage outputs], ...}.

    `out_dim` is declared here because nn.Module's attribute lookup cannot say it is an int."""

    out_dim: int
