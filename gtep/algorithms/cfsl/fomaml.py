"""First-order MAML for continual few-shot learning (Finn, Abbeel and Levine, "Model-Agnostic Meta-Learning for Fast
Adaptation of Deep Networks", ICML 2017, section 5.2's first-order approximation; the MAML++ baselines of the CFSL
spec's companion code, notes 002.3).

Fast weights: a zero-initialised linear head over the task's labels and (tune_last_block) the backbone's last
stage. Adaptation is plain SGD at `lr` on the support cross-entropy (MAML's inner update).

Meta-training, once before any task, on the classes the backbone was pretrained on (kept out of both phases):
an episode draws `meta_ways` classes with `meta_shots` support and `meta_queries` query images each, adapts the
fast weights with `meta_steps` inner steps on the support, and takes the query loss's gradient at the adapted
weights as the gradient of the initial ones (first order: no second derivatives); Adam at `meta_lr` applies it
to the whole backbone (the stages the inner loop does not adapt get their exact gradient).

Each CFSL task starts from the meta-learned weights and a zero head; each support set, when it arrives, gets
`steps` SGD steps on all fast weights, which carry over to the next set (one pass: nothing else is kept). The
target set is scored by the adapted network. Across-task memory: the fast weights (head and stage), so its ATM
is that of fine-tuning; its MACs are the forward and backward passes of every step.

Simplified (CPU budget): one task per meta-update (Finn et al.: 32 on Omniglot), a few hundred episodes, the
inner loop adapts the last stage and the head (as ANIL / BOIL find the adaptation concentrates there; Raghu et
al. 2020) rather than every layer, and the head is zero-initialised per task instead of meta-learned (a CFSL task
has more labels than an episode, and a zero head treats every label alike; Ye and Chao, "How to train your
MAML to excel in few-shot classification", ICLR 2022). BatchNorm keeps its pretrained statistics (eval mode)
in meta-training and adaptation alike.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gtep.algorithms._episodic import class_indices, draw_episode, generator_from_global_rng
from gtep.algorithms.base import ALGORITHMS, AT_LEAST_ONE, NON_NEGATIVE, POSITIVE, Optimizer
from gtep.algorithms.cfsl.base import LastStage, PretrainImages, load_pretrain_images
from gtep.algorithms.cfsl.finetune import FinetuneParams, HeadLearner
from gtep.models import Backbone


@dataclass(frozen=True)
class FomamlParams(FinetuneParams):
    steps: int = 3  # inner steps per support set in a task (Finn et al. evaluate Omniglot with 3)
    lr: float = 0.4  # the inner step size alpha (Finn et al., Omniglot)
    optimizer: Optimizer = "sgd"
    momentum: float = 0.0  # the inner update is plain SGD
    weight_decay: float = 0.0
    tune_last_block: bool = True
    meta_steps: int = 1  # inner steps per episode in meta-training (Finn et al., Omniglot: 1)
    meta_lr: float = 1e-3  # beta, Adam's
    episodes: int = 200
    meta_ways: int = 5
    meta_shots: int = 1
    meta_queries: int = 5
    ranges = {"meta_steps": AT_LEAST_ONE, "meta_lr": POSITIVE, "episodes": NON_NEGATIVE, "meta_ways": AT_LEAST_ONE,
              "meta_shots": AT_LEAST_ONE, "meta_queries": AT_LEAST_ONE}


class Episode:
    """One meta-training episode's fast weights: a zero head over the episode's classes, and the last stage."""

    def __init__(self, backbone: nn.Module, last: LastStage | None, ways: int, dim: int) -> None:
        self.backbone, self.last = backbone, last
        self.head = nn.Linear(dim, ways).to(next(backbone.parameters()).device)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)
        self.fast = [*self.head.parameters(), *(last.parameters_to_tune() if last is not None else [])]

    def support_logits(self, frozen: Tensor) -> Tensor:
        features = self.last.head_features(frozen) if self.last is not None else frozen
        return self.head(features)

    def frozen(self, x: Tensor) -> Tensor:
        """What the inner loop does not change, once: the input to the last stage, or the features."""
        with torch.no_grad():
            return self.last.frozen(x) if self.last is not None else self.backbone(x)["features"]

    def adapt(self, x: Tensor, y: Tensor, steps: int, lr: float) -> None:
        frozen = self.frozen(x)
        for _ in range(steps):
            grads = torch.autograd.grad(F.cross_entropy(self.support_logits(frozen), y), self.fast)
            with torch.no_grad():
                for p, g in zip(self.fast, grads):
                    p.sub_(lr * g)


@ALGORITHMS.register("cfsl_fomaml")
class CfslFomaml(HeadLearner[FomamlParams]):
    """First-order MAML: meta-learned initial weights, SGD on the fast weights per support set (module docstring)."""

    meta_trains = True

    def meta_train(self, backbone: Backbone) -> None:
        p = self.params
        if p.episodes == 0:
            return
        self.meta_train_on(backbone, load_pretrain_images(self.weights, self.device))

    def meta_train_on(self, backbone: Backbone, images: PretrainImages) -> list[float]:
        """`episodes` meta-updates on `images`; returns each episode's query loss after adaptation."""
        p = self.params
        backbone.to(self.device).eval()  # BatchNorm: the pretrained statistics, as adaptation uses them
        last = LastStage(backbone) if p.tune_last_block else None
        outer = torch.optim.Adam([q for q in backbone.parameters() if q.requires_grad], lr=p.meta_lr)
        by_class = class_indices(images.labels, p.meta_ways, p.meta_shots + p.meta_queries)
        generator = generator_from_global_rng()
        return [self.meta_step(backbone, last, images, by_class, outer, generator) for _ in range(p.episodes)]

    def meta_step(self, backbone: Backbone, last: LastStage | None, images: PretrainImages, by_class: list[Tensor],
                  outer: torch.optim.Optimizer, generator: torch.Generator) -> float:
        """One episode: adapt on the support, the query loss's gradient at the adapted weights applied to the
        initial ones (first order). Returns the query loss after adaptation."""
        p = self.params
        s_idx, q_idx = draw_episode(by_class, p.meta_ways, p.meta_shots, p.meta_queries, generator)
        ways = torch.arange(p.meta_ways, device=images.labels.device)
        episode = Episode(backbone, last, p.meta_ways, backbone.out_dim)
        initial = [q.detach().clone() for q in episode.fast]
        episode.adapt(images.view(images.pixels[s_idx]), ways.repeat_interleave(p.meta_shots), p.meta_steps, p.lr)
        loss = F.cross_entropy(episode.head(backbone(images.view(images.pixels[q_idx]))["features"]),
                               ways.repeat_interleave(p.meta_queries))
        if not torch.isfinite(loss):
            raise FloatingPointError(f"non-finite meta-training loss ({float(loss.detach())})")
        outer.zero_grad(set_to_none=True)
        loss.backward()
        with torch.no_grad():  # the gradient was taken at the adapted weights; it updates the initial ones
            for q, value in zip(episode.fast, initial):
                q.copy_(value)
        outer.step()
        return float(loss.detach())
