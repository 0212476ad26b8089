"""FACT (Zhou et al., "Forward Compatible Few-Shot Class-Incremental Learning", CVPR 2022), as its reference code
(github.com/zhoudw-zdw/CVPR22-Fact) trains it, on gtep's training-frozen prototypes.

The base session reserves room in the embedding for classes to come: besides the base classes' cosine
classifier it holds `virtual_classes` virtual prototypes (orthogonally initialised and fixed, FACT's
`dummy_orthogonal_classifier`), and trains with

    L = CE(base logits, y) + balance * (L2 + L3 + L4)

- L2: every image's logits with its own class masked out are pushed towards one virtual class, its nearest
  among the `mask_classes` virtual classes linked to its class (FACT's random `mask`): each base class keeps
  a second, virtual, centre close by, so its cluster does not fill the space;
- L3: a mixture of two images of different classes (lambda ~ Beta(alpha, alpha)) is pushed to its nearest
  virtual class: the space between base classes is given to virtual classes, as novel classes will need it;
- L4: with that virtual class masked, the mixture still goes to its nearest base class.
Then the backbone is frozen and every class, base or novel, is its mean feature (FACT's replace_base_fc and
update_fc_avg); prediction is the cosine to every seen class's mean feature.

Simplified: FACT mixes intermediate feature maps (manifold mixup after the backbone's early stages); gtep's
backbones give no such split, so the images are mixed (the input layer of manifold mixup). The nearest linked
virtual class is taken among the linked ones only (the reference code multiplies the logits by the 0/1 mask,
which lets a masked zero beat negative cosines). The test-time `test_intergrate` mixture with scores routed
through the virtual prototypes is left out: prediction is FACT's plain `test` path, cosine to the prototypes.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gtep.algorithms.base import ALGORITHMS, AT_LEAST_ONE, NON_NEGATIVE, POSITIVE, FitFn, TaskData
from gtep.algorithms.fscil.frozen_prototypes import CosinePrototypeNet, FrozenPrototypes, FrozenPrototypesParams
from gtep.models import Backbone


@dataclass(frozen=True)
class FACTParams(FrozenPrototypesParams):
    virtual_classes: int = 40  # FACT pre-allocates every future class: 100 - 60 on CIFAR-100 and miniImageNet
    balance: float = 0.01  # weight of the forward-compatible terms (FACT's `balance`)
    alpha: float = 0.5  # Beta(alpha, alpha) of the mixing coefficient (FACT's `alpha`)
    mask_classes: int = 3  # base classes linked to each virtual class (FACT's `masknum`)
    ranges = {"virtual_classes": AT_LEAST_ONE, "balance": NON_NEGATIVE, "alpha": POSITIVE,  # Beta(alpha, alpha)
              "mask_classes": AT_LEAST_ONE}


class FACTNet(CosinePrototypeNet):
    """The cosine-prototype network with FACT's fixed virtual prototypes."""

    virtual: Tensor

    def __init__(self, backbone: Backbone, scale: float, learn_scale: bool, virtual_classes: int) -> None:
        super().__init__(backbone, scale, learn_scale)
        self.register_buffer("virtual", nn.init.orthogonal_(torch.empty(virtual_classes, backbone.out_dim)))

    def reserved_logits(self, features: Tensor, base: int) -> Tensor:
        """Scaled cosines to the `base` trained class vectors, then to the virtual prototypes."""
        vectors = torch.cat([self.weight[:base], self.virtual])
        return self.scale * F.normalize(features, dim=1) @ F.normalize(vectors, dim=1).t()


@ALGORITHMS.register("fact")
class FACT(FrozenPrototypes):
    """FACT (Zhou et al. 2022): virtual prototypes reserve embedding space in the base session, then a frozen
    backbone and class-mean prototypes, as the training-frozen baseline."""

    Params = FACTParams
    params: FACTParams
    net: FACTNet
    # frozen_prototypes' tuple is inferred as four strings; this one adds FACT's (all act in the base session)
    first_task_hparams = (*FrozenPrototypes.first_task_hparams, "virtual_classes",  # type: ignore[assignment]
                          "balance", "alpha", "mask_classes")
    links: Tensor | None = None  # (base, virtual) bool: the virtual classes each base class may be pushed to

    def build_network(self) -> nn.Module:
        p = self.params
        return FACTNet(self.new_backbone(), p.scale, p.learn_scale, p.virtual_classes)

    def fit_task(self, task: TaskData, fit: FitFn) -> None:
        if task.index == 0:
            self.links = self.draw_links(task.total)
        super().fit_task(task, fit)

    def draw_links(self, base: int) -> Tensor:
        """Each virtual class linked to `mask_classes` random base classes (FACT's mask, drawn once)."""
        links = torch.zeros(base, self.params.virtual_classes, dtype=torch.bool)
        for v in range(self.params.virtual_classes):
            links[torch.randperm(base)[: min(base, self.params.mask_classes)], v] = True
        return links.to(self.device)

    def loss(self, x: Tensor, y: Tensor) -> Tensor:
        """The base session's loss (module docstring); later sessions do not train."""
        base = self.total
        logits = self.net.reserved_logits(self.features_of(x), base)
        loss = F.cross_entropy(logits[:, :base], y)
        if self.params.balance == 0:
            return loss
        own = F.one_hot(y, logits.shape[1]).bool()
        linked = self.linked(y)
        nearest_linked = logits[:, base:].masked_fill(~linked, float("-inf")).argmax(1) + base
        forward = F.cross_entropy(logits.masked_fill(own, -1e9), nearest_linked)
        return loss + self.params.balance * (forward + self.mixture_loss(x, y, base))

    def linked(self, y: Tensor) -> Tensor:
        links = self.links
        assert links is not None, "the links are drawn when the base session starts"
        return links[y]

    def mixture_loss(self, x: Tensor, y: Tensor, base: int) -> Tensor:
        """L3 + L4: mixtures of two classes go to their nearest virtual class, and failing it to a base class."""
        lam = float(torch.distributions.Beta(self.params.alpha, self.params.alpha).sample())
        perm = torch.randperm(len(y), device=y.device)
        apart = y != y[perm]
        if not bool(apart.any()):
            return x.new_zeros(())
        mixed = lam * x[apart] + (1 - lam) * x[perm][apart]
        logits = self.net.reserved_logits(self.features_of(mixed), base)
        virtual_target = logits[:, base:].argmax(1) + base
        base_target = logits[:, :base].argmax(1)
        to_virtual = F.cross_entropy(logits, virtual_target)
        masked = logits.masked_fill(F.one_hot(virtual_target, logits.shape[1]).bool(), -1e9)
        return to_virtual + F.cross_entropy(masked, base_target)

    def features_of(self, x: Tensor) -> Tensor:
        features = self.net.backbone(x)["features"]
        assert isinstance(features, Tensor)
        return features


__all__ = ["FACT", "FACTNet", "FACTParams"]
