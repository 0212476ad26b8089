"""OLTR in FLUID (Liu et al., "Large-Scale Long-Tailed Recognition in an Open World", CVPR 2019; papers/fluid.txt
Sec. 4, App. B/C; notes 004.3). Its dynamic meta-embedding over frozen backbone features v = f(x), as the authors'
MetaEmbedding_Classifier computes it:

    memory      M: the class centroids of the direct features (here the running means of every seen sample's)
    v_memory    = softmax(T_hal v) . M            the hallucinator's attention over the memory
    e           = tanh(T_sel v)                    the concept selector
    gamma       = scale / min_i ||v - m_i||        reachability: large near a known class, small far from all
    v_meta      = gamma * (v + e * v_memory)
    logits      = s * (|v_meta| / (1 + |v_meta|)) * cos(v_meta, w_i)   the cosine-norm classifier (s = 16)

Open-set detection is OLTR's own: the maximum softmax probability of these logits (the base's `msp`), which the
reachability makes distance-aware: far from every centroid, v_meta shrinks, the cosine-norm squashes it, and the
softmax flattens. The paper's schedule: 4 epochs every 200 samples for the first 10,000, then every 5,000, the
classifier at lr 0.1 ("0.01 for feature extraction parameters").

Kept: the meta-embedding (memory of centroids, hallucinator, selector, reachability), the cosine-norm classifier,
the open-set score and the dense-then-sparse schedule. Simplified: the backbone is frozen and its features cached
(FLUID reports cached GMACs for OLTR, which a trained backbone could not have), so the modulated attention, which
acts on the backbone's feature maps, and the discriminative-centroid loss, which moves the direct features, are
left out; one learning rate trains the hallucinator, the selector and the classifier."""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gtep.algorithms._distances import euclidean
from gtep.algorithms.base import ALGORITHMS, AT_LEAST_ONE, NON_NEGATIVE, POSITIVE, FitFn, FitRecipe
from gtep.algorithms.fluid.base import Meter, StreamLearner, StreamParams


@dataclass(frozen=True)
class OLTRParams(StreamParams):
    early_every: int = 2  # samples between updates while the stream is short (the paper: 200 ...)
    early_until: int = 100  # ... for its first 10,000 samples; then every `update_every` (its 5,000)
    reachability_scale: float = 10.0  # the authors' code
    cosnorm_scale: float = 16.0  # the authors' CosNorm_Classifier
    ranges = {"early_every": AT_LEAST_ONE, "early_until": NON_NEGATIVE, "reachability_scale": POSITIVE,
              "cosnorm_scale": POSITIVE}


@ALGORITHMS.register("fluid_oltr")
class FluidOLTR(StreamLearner[OLTRParams]):
    """Dynamic meta-embedding and a cosine-norm classifier over frozen features (module docstring)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        dim = self.centroid_sum.shape[1]
        self.selector = nn.Linear(dim, dim).to(self.device)
        self.hallucinator = nn.Parameter(torch.zeros(0, dim, device=self.device))  # T_hal's rows, one per class
        self.classifier = nn.Parameter(torch.zeros(0, dim, device=self.device))  # the cosine-norm weights

    def grow_classes(self, total: int) -> None:
        super().grow_classes(total)
        fresh = total - len(self.classifier)
        dim = self.classifier.shape[1]
        bound = 1 / dim ** 0.5  # CosNorm_Classifier's uniform initialisation
        rows = torch.empty(fresh, dim, device=self.device).uniform_(-bound, bound)
        self.classifier = nn.Parameter(torch.cat([self.classifier.data, rows]))
        # a new class's attention logit starts at 0: the hallucinator begins as the memory's mean
        self.hallucinator = nn.Parameter(torch.cat([self.hallucinator.data, rows.new_zeros(fresh, dim)]))

    def due(self, step: int) -> bool:
        every = self.params.early_every if step <= self.params.early_until else self.params.update_every
        return step % max(1, every) == 0

    def meta_embedding(self, features: Tensor) -> Tensor:
        memory = self.class_means()
        reachability = self.params.reachability_scale / euclidean(features, memory).min(1).values.clamp_min(1e-6)
        attention = F.softmax(features @ self.hallucinator.t(), dim=1)
        selector = torch.tanh(self.selector(features))
        return reachability[:, None] * (features + selector * (attention @ memory))

    def class_scores(self, features: Tensor) -> Tensor:
        v = self.meta_embedding(features)
        norm = v.norm(dim=1, keepdim=True)
        squashed = norm / (1 + norm) * v / norm.clamp_min(1e-12)
        return self.params.cosnorm_scale * squashed @ F.normalize(self.classifier, dim=1).t()

    def update(self, fit: FitFn, recipe: FitRecipe, meter: Meter) -> None:
        def loss(f: Tensor, y: Tensor) -> Tensor:
            return F.cross_entropy(self.class_scores(f), y)

        parameters = [self.hallucinator, self.classifier, *self.selector.parameters()]
        self.train_head(fit, recipe, meter, parameters, loss)

    def parameter_counts(self) -> tuple[int, int]:
        """The backbone and OLTR's modules (the unused linear head is not counted; the memory is statistics)."""
        backbone = sum(p.numel() for p in self.backbone.parameters())
        trained = self.hallucinator.numel() + self.classifier.numel() + sum(
            p.numel() for p in self.selector.parameters())
        return backbone + trained, trained
