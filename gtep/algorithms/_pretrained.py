"""What the pretrained-model methods share (the GTEP paper's section 4.2, as PILOT runs them: SimpleCIL,
APER, EASE, RanPAC, L2P, DualPrompt, CODA-Prompt).

- They start from a pretrained ViT (`--weights`) whose own weights never train: new_backbone returns it
  frozen, and each method adds what it learns beside it (adapters, prompts, heads, prototypes).
- They train every task with the sampled hyperparameters (no fixed first-task recipe, as PILOT).
- They keep no exemplars, and none distils an old copy of the network.
- The prototype methods read each training image once, in eval mode, when its task arrives (`encode`),
  and represent a class by its mean feature (`class_means`).
Not auto-imported (leading underscore): it registers nothing.
"""
from __future__ import annotations

from typing import Callable, cast

import torch
from torch import Tensor

from gtep.algorithms.base import IncrementalLearner, P, freeze
from gtep.models.vit import PromptableViT


class PretrainedLearner(IncrementalLearner[P]):
    """The flags and setup of the pretrained-ViT methods; each method still writes its own hooks."""

    uses_memory = False
    fixed_first_task = False
    uses_pretrained = True

    def new_backbone(self) -> PromptableViT:
        """The pretrained ViT, frozen: these methods learn beside it, never in it."""
        # create_backbone wraps every ViT in a PromptableViT, and these methods run on ViTs only
        return freeze(cast(PromptableViT, super().new_backbone()))

    def encode(self, fn: Callable[[Tensor], Tensor], x: Tensor, batch: int = 256) -> Tensor:
        """`fn` over every image of `x` once, `batch` at a time, with the network in eval mode and no
        gradient (PILOT's test-mode loader: no augmentation, no dropout)."""
        self.net.eval()
        with torch.no_grad():
            return self.batched(fn, batch)(x)


def class_means(features: Tensor, labels: Tensor, classes: list[int]) -> Tensor:
    """Mean feature of each class, in the order given (one pass over the features, no per-sample loop)."""
    index = torch.as_tensor(classes, device=labels.device)
    onehot = (labels[:, None] == index[None, :]).float()
    return (onehot.t() @ features) / onehot.sum(0).clamp(min=1)[:, None]
