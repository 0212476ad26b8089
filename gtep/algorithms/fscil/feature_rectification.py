"""Feature rectification on a ViT, the FSCIL paper's own method (Tang et al., "Rethinking Few-shot
Class-incremental Learning: Learning from Yourself", ECCV 2024; ../shared/papers/fscil-gacc.txt section 4,
appendix A2.2 and A5.3; code github.com/iSEE-Laboratory/Revisting_FSCIL).

On the training-frozen baseline with a ViT (its "ViT baseline": backbone and cosine classifier trained on the
base session, then frozen; every class represented by its mean final feature, P), a Feature Rectification
(FR) module per chosen intermediate layer l rectifies the final feature X_NL with the intermediate one X_l:

    X_FR = M_mix(cat(M_F(X_NL), M_I(X_l)))        (Eq. 7; each M is FC -> GELU -> LayerNorm -> FC, A2.2)

trained, with the backbone frozen, by

    L = b_cos (L_cos + L_NovCE) + b_CR L_CR + b_IR L_IR                                       (Eq. 12)
    L_IR    SmoothL1 between the pairwise distances of the rectified and of the intermediate features (Eq. 8)
    L_CR    KL between softmax(P^T X_l) and softmax(P^T X_FR), both L2-normalised (Eq. 9)
    L_cos   1 - cos(X_FR, X_NL): rectified features stay close to the final ones (Eq. 10, as a loss)
    L_NovCE cross-entropy of P^T X_FR on novel classes only (Eq. 11).

Anti-forgetting: a Gaussian per class and layer (base classes: their features' mean and covariance; a novel
class: its shots' mean and the mean covariance of its `top_k` most similar base classes) supplies the old
classes' features in later sessions, `samples_per_class` each. Prediction averages softmax(scale P^T X_FR)
over the FR branches (the multi-layer ensemble; layers 8, 9, 10 of 12 in the paper: `fr_layers` layers
ending `fr_offset` below the last).

Simplified for a CPU-sized timm ViT with local weights (vit_micro_patch4_32: 4 layers of width 96): the ViT
starts from the run's pretrained weights (classes kept out of both phases) instead of being trained from
scratch, and `train_backbone` (the paper's base-session training, the `original` preset) fine-tunes it on
the base session with the sampled recipe; off, it stays as pretrained. An intermediate feature is the [CLS]
token after block l through the ViT's final LayerNorm. The FR modules train in every session (the base one
included) on features computed once per session in eval mode, without augmentation; the paper does not give
their schedule. L_IR compares distances of L2-normalised features and the branches' losses are averaged;
the paper does not say. The layers' Gaussians are drawn independently, as the paper builds them per layer.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gtep.algorithms._pretrained import class_means
from gtep.algorithms.base import ALGORITHMS, AT_LEAST_ONE, NON_NEGATIVE, FitFn, Scheduler, TaskData, freeze
from gtep.algorithms.fscil.frozen_prototypes import (
    PROTOTYPE_BATCH,
    CosinePrototypeNet,
    FrozenPrototypes,
    FrozenPrototypesParams,
)
from gtep.models.vit import PromptableViT


@dataclass(frozen=True)
class FRParams(FrozenPrototypesParams):
    epochs: int = 20
    lr: float = 0.01
    batch_size: int = 64
    scheduler: Scheduler = "cosine"
    train_backbone: bool = True  # fine-tune the ViT on the base session before freezing it (the paper's)
    fr_layers: int = 3  # FR branches (the paper's 3: layers 8, 9, 10 of 12)
    fr_offset: int = 2  # the highest FR layer is this far below the last (12 - 2 = 10)
    beta_cos: float = 0.1  # weight of L_cos + L_NovCE (A5.3: 0.1 everywhere)
    beta_cr: float = 0.5  # weight of L_CR (A5.3: 0.5 on CIFAR-100, 0.1 on miniImageNet)
    beta_ir: float = 1.0  # weight of L_IR (A5.3: 1.0 on CIFAR-100, 0.5 on miniImageNet)
    top_k: int = 3  # base classes whose covariances a novel class borrows (k is not given in the paper)
    samples_per_class: int = 20  # Gaussian features per old class in a later session (not given)
    ranges = {"fr_layers": AT_LEAST_ONE, "fr_offset": NON_NEGATIVE, "beta_cos": NON_NEGATIVE, "beta_cr": NON_NEGATIVE,
              "beta_ir": NON_NEGATIVE, "top_k": AT_LEAST_ONE, "samples_per_class": AT_LEAST_ONE}


def mlp(dim_in: int, dim_hidden: int, dim_out: int) -> nn.Sequential:
    """The paper's MLP (A2.2): FC -> GELU -> LayerNorm -> FC."""
    return nn.Sequential(nn.Linear(dim_in, dim_hidden), nn.GELU(), nn.LayerNorm(dim_hidden),
                         nn.Linear(dim_hidden, dim_out))


class FeatureRectifier(nn.Module):
    """X_FR = M_mix(cat(M_F(X_NL), M_I(X_l))) (Eq. 7)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.final, self.inter, self.mix = mlp(dim, dim, dim), mlp(dim, dim, dim), mlp(2 * dim, 2 * dim, dim)

    def forward(self, final: Tensor, inter: Tensor) -> Tensor:
        return self.mix(torch.cat([self.final(final), self.inter(inter)], dim=1))


class FRNet(CosinePrototypeNet):
    """A ViT, its cosine classifier (then prototypes P), FR modules and per-class Gaussians per layer."""

    backbone: PromptableViT
    means: Tensor
    covs: Tensor
    base_classes: Tensor

    def __init__(self, backbone: PromptableViT, params: FRParams) -> None:
        super().__init__(backbone, params.scale, params.learn_scale)
        top = backbone.depth - params.fr_offset
        self.layers = sorted(layer for layer in range(top - params.fr_layers + 1, top + 1) if layer >= 1)
        if not self.layers:
            raise ValueError(f"fr_layers {params.fr_layers} and fr_offset {params.fr_offset} leave no layer of "
                             f"this {backbone.depth}-layer ViT below its last")
        dim = backbone.out_dim
        self.rectifiers = nn.ModuleList(FeatureRectifier(dim) for _ in self.layers)
        self.register_buffer("means", torch.empty(0, len(self.layers) + 1, dim))
        self.register_buffer("covs", torch.empty(0, len(self.layers) + 1, dim, dim))
        self.register_buffer("base_classes", torch.zeros((), dtype=torch.long))

    def layer_features(self, x: Tensor) -> Tensor:
        """(batch, 1 + branches, dim): the final [CLS] feature, then each FR layer's, through the final norm."""
        vit, tokens, taken = self.backbone, self.backbone.embed(x), []
        for i in range(vit.depth):
            tokens = vit.run_block(i, tokens)
            if i + 1 in self.layers:
                taken.append(vit.vit.norm(tokens)[:, 0])
        return torch.stack([vit.vit.norm(tokens)[:, 0], *taken], dim=1)

    def rectified(self, stacked: Tensor) -> list[Tensor]:
        """Each branch's X_FR from (batch, 1 + branches, dim) features."""
        return [fr(stacked[:, 0], stacked[:, 1 + b]) for b, fr in enumerate(self.rectifiers)]


@ALGORITHMS.register("feature_rectification")
class FeatureRectification(FrozenPrototypes):
    """The FSCIL paper's method (Tang et al. 2024): a base-trained, then frozen, ViT with class-mean prototypes,
    and FR modules that rectify its final feature with intermediate ones (module docstring)."""

    Params = FRParams
    params: FRParams
    net: FRNet
    uses_pretrained = True
    fixed_first_task = False  # as the other ViT methods: the sampled set trains every session

    scenario_limits = ("fr_layers", "fr_offset")  # checked before any compute (gtep.preflight)

    @classmethod
    def scenario_problem(cls, values: dict[str, Any], facts: dict[str, Any]) -> str | None:
        """The FR branches sit on layers below the ViT's last: they must leave at least one (FRNet's layers)."""
        depth = facts.get("vit_depth")
        if depth is None:
            return None
        top = depth - values["fr_offset"]
        if not [layer for layer in range(top - values["fr_layers"] + 1, top + 1) if layer >= 1]:
            return (f"fr_layers {values['fr_layers']} and fr_offset {values['fr_offset']} leave no layer of the "
                    f"{depth}-layer {facts['backbone']} below its last; lower fr_offset below {depth - 1}")
        return None

    def build_network(self) -> nn.Module:
        backbone = self.new_backbone()
        assert isinstance(backbone, PromptableViT), "feature_rectification runs on a ViT"
        backbone.requires_grad_(self.params.train_backbone)
        return FRNet(backbone, self.params)

    def trainable_parameters(self) -> list[nn.Parameter]:
        """The base training (cross-entropy on the cosine classifier) trains the ViT and the classifier."""
        return [p for name, p in self.net.named_parameters() if not name.startswith("rectifiers.")]

    def fit_task(self, task: TaskData, fit: FitFn) -> None:
        if task.index == 0 and not self.params.train_backbone:
            return  # the pretrained ViT as it is: the base prototypes come when the session ends
        super().fit_task(task, fit)

    def consolidate(self, task: TaskData, fit: FitFn) -> None:
        """Freeze the ViT and set the base prototypes (base session), store the session's Gaussians, then train
        the FR modules on the session's features and the old classes' sampled ones."""
        super().consolidate(task, fit)
        if task.index == 0:
            self.net.base_classes.fill_(task.total)
        feats = self.stacked_features(task)
        old_x, old_y = self.sample_old(task.known)
        self.store_gaussians(feats, task)
        rectifiers = self.net.rectifiers
        rectifiers.requires_grad_(True)
        fit(rectifiers.parameters(), self.fr_loss, torch.cat([feats, old_x]), torch.cat([task.y, old_y]),
            task.recipe, augment=False, modules=[rectifiers])
        freeze(rectifiers).eval()

    @torch.no_grad()
    def stacked_features(self, task: TaskData) -> Tensor:
        self.net.eval()
        return self.batched(self.net.layer_features, PROTOTYPE_BATCH)(task.x)

    @torch.no_grad()
    def store_gaussians(self, feats: Tensor, task: TaskData) -> None:
        """Each new class's mean and covariance per layer; a novel class's covariance is the mean of those of
        its top_k nearest base classes (cosine of final-feature means), its shots being too few."""
        means = torch.stack([class_means(feats[:, b], task.y, task.new_classes) for b in range(feats.shape[1])], 1)
        if task.index == 0:
            covs = torch.stack([torch.stack([torch.cov(feats[task.y == c, b].t()) for b in range(feats.shape[1])])
                                for c in task.new_classes])
        else:
            base = int(self.net.base_classes)
            sims = F.normalize(means[:, 0], dim=1) @ F.normalize(self.net.means[:base, 0], dim=1).t()
            nearest = sims.topk(min(self.params.top_k, base), dim=1).indices
            covs = self.net.covs[nearest].mean(1)
        self.net.means = torch.cat([self.net.means, means])
        self.net.covs = torch.cat([self.net.covs, covs])

    @torch.no_grad()
    def sample_old(self, known: int) -> tuple[Tensor, Tensor]:
        """`samples_per_class` features per old class and layer from its Gaussian."""
        n, means, covs = self.params.samples_per_class, self.net.means[:known], self.net.covs[:known]
        dim = means.shape[-1]
        if known == 0:
            return means.new_empty(0, means.shape[1], dim), torch.empty(0, dtype=torch.long, device=means.device)
        scale = torch.linalg.cholesky(covs + 1e-4 * torch.eye(dim, device=covs.device))
        noise = torch.randn(known, n, means.shape[1], dim, 1, device=means.device)
        samples = means[:, None] + (scale[:, None] @ noise).squeeze(-1)  # (known, n, layers, dim)
        labels = torch.arange(known, device=means.device).repeat_interleave(n)
        return samples.flatten(0, 1), labels

    def fr_loss(self, x: Tensor, y: Tensor) -> Tensor:
        """Eq. 12, averaged over the branches."""
        p = self.params
        prototypes = F.normalize(self.net.weight[: self.total], dim=1)
        novel = y >= self.net.base_classes
        losses = []
        for b, rectified in enumerate(self.net.rectified(x)):
            inter = x[:, 1 + b]
            fr_logits = p.scale * F.normalize(rectified, dim=1) @ prototypes.t()
            inter_logits = p.scale * F.normalize(inter, dim=1) @ prototypes.t()
            cos = (1 - F.cosine_similarity(rectified, x[:, 0], dim=1)).mean()
            nov = F.cross_entropy(fr_logits[novel], y[novel]) if bool(novel.any()) else x.new_zeros(())
            cr = F.kl_div(F.log_softmax(fr_logits, 1), F.softmax(inter_logits, 1), reduction="batchmean")
            ir = F.smooth_l1_loss(pairwise(rectified), pairwise(inter))
            losses.append(p.beta_cos * (cos + nov) + p.beta_cr * cr + p.beta_ir * ir)
        return torch.stack(losses).mean()

    @torch.no_grad()
    def predict(self, x: Tensor) -> Tensor:
        """The mean over FR branches of softmax(scale * cosine to every seen class's prototype)."""
        prototypes = F.normalize(self.net.weight[: self.total], dim=1)
        branches = self.net.rectified(self.net.layer_features(x))
        return torch.stack([torch.softmax(self.params.scale * F.normalize(r, dim=1) @ prototypes.t(), 1)
                            for r in branches]).mean(0)


def pairwise(features: Tensor) -> Tensor:
    """Euclidean distances between every pair of L2-normalised features of a batch."""
    normed = F.normalize(features, dim=1)
    return torch.cdist(normed, normed)


__all__ = ["FRNet", "FRParams", "FeatureRectification", "FeatureRectifier"]
