"""CEC (Zhang et al., "Few-Shot Incremental Learning with Continually Evolved Classifiers", CVPR 2021), as its
reference code (github.com/icoz69/CEC-CVPR2021) runs it, on gtep's training-frozen prototypes:

1. base session: backbone and cosine classifier trained with cross-entropy (the frozen_prototypes stage);
   then the backbone is frozen and every base class is represented by its mean feature (`replace_base_fc`);
2. still in the base session, a graph attention model over the classifier (CEC's `slf_attn`, FEAT's one-head
   self-attention with residual and LayerNorm) is trained on pseudo-incremental episodes: `way` base classes
   and `low_way` "pseudo-novel" classes made by rotating the images of other base classes by 90, 180 or 270
   degrees, `shots` support and `queries` query images each; the episode's classifier is the support means,
   and for every query the set {all class vectors, the query} passes through the attention, which adapts the
   vectors to each other and to the query; the loss is cross-entropy on the scaled cosine of the adapted query
   to the adapted vectors;
3. few-shot sessions append each novel class's mean feature (no training); prediction adapts every seen
   class's vector (and the query) with the trained attention, as CEC's `_forward` at test time.

Simplified: the reference code also fine-tunes the encoder during the episodes (at lr_base 0.002, 10 to 50
times below the attention's); here the backbone stays frozen once the base training ends (the paper's
decoupling of representation and classifier), so episode features are computed once per rotation, in eval
mode, without augmentation. A step of the engine's loop takes two episodes (it skips single-sample batches).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gtep.algorithms.base import ALGORITHMS, AT_LEAST_ONE, DROPOUT, POSITIVE, FitFn, TaskData, freeze
from gtep.algorithms.fscil.frozen_prototypes import (
    PROTOTYPE_BATCH,
    CosinePrototypeNet,
    FrozenPrototypes,
    FrozenPrototypesParams,
)
from gtep.models import Backbone

EPISODES_PER_STEP = 2  # the loop skips one-sample batches (BatchNorm); CEC's code steps on one episode


@dataclass(frozen=True)
class CECParams(FrozenPrototypesParams):
    way: int = 15  # real base classes per episode (CEC's episode_way, CIFAR-100 and miniImageNet)
    low_way: int = 15  # rotated pseudo-novel classes per episode (low_way)
    shots: int = 1  # support images per class (episode_shot, low_shot)
    queries: int = 10  # query images per class (episode_query)
    episodes: int = 50  # episodes per epoch of the attention's training (train_episode)
    meta_epochs: int = 100  # epochs of the attention's training (epochs_new)
    meta_lr: float = 0.1  # the attention's learning rate (lrg); halved every 20 epochs (step 20, gamma 0.5)
    dropout: float = 0.5  # dropout of the attention (FEAT's MultiHeadAttention as CEC builds it)
    ranges = {"way": AT_LEAST_ONE, "low_way": AT_LEAST_ONE, "shots": AT_LEAST_ONE, "queries": AT_LEAST_ONE,
              "episodes": AT_LEAST_ONE, "meta_epochs": AT_LEAST_ONE, "meta_lr": POSITIVE, "dropout": DROPOUT}


class GraphAttention(nn.Module):
    """CEC's classifier adaptation module: one-head self-attention over a set of vectors (FEAT's
    MultiHeadAttention(1, d, d, d)), residual connection and LayerNorm."""

    def __init__(self, dim: int, dropout: float) -> None:
        super().__init__()
        self.q, self.k, self.v = (nn.Linear(dim, dim, bias=False) for _ in range(3))
        for layer in (self.q, self.k, self.v):
            nn.init.normal_(layer.weight, 0.0, math.sqrt(1.0 / dim))  # FEAT: std sqrt(2 / (d_model + d_k))
        self.out = nn.Linear(dim, dim)
        nn.init.xavier_normal_(self.out.weight)
        self.norm = nn.LayerNorm(dim)
        self.attn_drop, self.drop = nn.Dropout(0.1), nn.Dropout(dropout)  # FEAT's attention dropout is 0.1
        self.temperature = math.sqrt(dim)

    def forward(self, x: Tensor) -> Tensor:
        """(sets, members, dim) -> the same shape, each member updated from every member of its set."""
        attention = self.attn_drop(torch.softmax(self.q(x) @ self.k(x).transpose(1, 2) / self.temperature, dim=2))
        return self.norm(self.drop(self.out(attention @ self.v(x))) + x)


class CECNet(CosinePrototypeNet):
    """The cosine-prototype network with CEC's attention over the classifier."""

    def __init__(self, backbone: Backbone, scale: float, learn_scale: bool, dropout: float) -> None:
        super().__init__(backbone, scale, learn_scale)
        self.attention = GraphAttention(backbone.out_dim, dropout)

    def adapted_cosine(self, vectors: Tensor, queries: Tensor) -> Tensor:
        """(episodes, classes, d) vectors and (episodes, queries, d) features -> (episodes, queries, classes):
        for each query, the attention runs over {the episode's class vectors, the query} and the adapted query
        is compared with the adapted vectors (CEC's `_forward`)."""
        e, c, d = vectors.shape
        q = queries.shape[1]
        sets = torch.cat([vectors[:, None].expand(e, q, c, d), queries[:, :, None]], dim=2).reshape(e * q, c + 1, d)
        adapted = self.attention(sets)
        cos = F.cosine_similarity(adapted[:, -1:], adapted[:, :-1], dim=2)
        return cos.reshape(e, q, c)


@ALGORITHMS.register("cec")
class CEC(FrozenPrototypes):
    """CEC (Zhang et al. 2021): a frozen base-trained backbone, class-mean vectors, and a graph attention that
    adapts the classifier, trained on pseudo-incremental episodes of the base session."""

    Params = CECParams
    params: CECParams
    net: CECNet
    # frozen_prototypes' tuple is inferred as four strings; this one adds the episodes' values (all in task 1)
    first_task_hparams = (*FrozenPrototypes.first_task_hparams, "way", "low_way",  # type: ignore[assignment]
                          "shots", "queries", "episodes", "meta_epochs", "meta_lr", "dropout")
    scenario_limits = ("way", "low_way")  # checked before any compute (gtep.preflight)

    @classmethod
    def scenario_problem(cls, values: dict[str, Any], facts: dict[str, Any]) -> str | None:
        """An episode holds at least one real and one rotated class, drawn from different base classes (Episodes
        narrows `way` and `low_way` to the base session, down to one each)."""
        if facts["base_classes"] < 2:
            return (f"cec draws episodes of a real and a rotated base class, and the base session has "
                    f"{facts['base_classes']} class; give the first session at least 2 classes (scenario.increments)")
        return None

    def build_network(self) -> nn.Module:
        p = self.params
        return CECNet(self.new_backbone(), p.scale, p.learn_scale, p.dropout)

    def trainable_parameters(self) -> list[nn.Parameter]:
        """The base training (cross-entropy) trains the backbone and classifier; the attention trains later."""
        return [p for name, p in self.net.named_parameters() if not name.startswith("attention.")]

    def consolidate(self, task: TaskData, fit: FitFn) -> None:
        """After the base session: freeze and take the base prototypes (as frozen_prototypes), then train the
        attention on pseudo-incremental episodes, then freeze it too."""
        super().consolidate(task, fit)
        if task.index != 0:
            return
        bank, labels = self.rotated_features(task)
        episodes = Episodes(labels, self.params, generator_seed=int(torch.randint(2**31 - 1, ()).item()))
        self.net.attention.requires_grad_(True)
        p = self.params
        epochs = task.scaled_epochs(p.meta_epochs)
        recipe = task.recipe.replace(epochs=epochs, lr=p.meta_lr, batch_size=EPISODES_PER_STEP, scheduler="steplr",
                                     milestones=tuple(range(max(1, epochs // 5), epochs, max(1, epochs // 5))),
                                     lr_decay=0.5, weight_decay=5e-4, optimizer="sgd")

        def loss(x: Tensor, y: Tensor) -> Tensor:
            index, targets = episodes.draw(len(x), bank.device)
            return self.episode_loss(bank, index, targets)

        dummy = torch.zeros(p.episodes, 1, device=bank.device)  # one row per episode of an epoch
        fit(self.net.attention.parameters(), loss, dummy, dummy[:, 0].long(), recipe, augment=False,
            modules=[self.net.attention])
        freeze(self.net.attention)

    @torch.no_grad()
    def rotated_features(self, task: TaskData) -> tuple[Tensor, Tensor]:
        """(4 * N, d) features of the base images rotated by 0, 90, 180, 270 degrees (rotation-major), and the
        N labels; frozen backbone, eval mode."""
        self.net.eval()
        feats = [self.batched(partial(self.rotated, quarter_turns=k), PROTOTYPE_BATCH)(task.x) for k in range(4)]
        return torch.cat(feats), task.y

    def rotated(self, x: Tensor, quarter_turns: int) -> Tensor:
        return self.features(torch.rot90(x, quarter_turns, (2, 3)))

    def episode_loss(self, bank: Tensor, index: Tensor, targets: Tensor) -> Tensor:
        """Cross-entropy of the episodes' queries against their support means, all adapted by the attention."""
        s = self.params.shots
        feats = bank[index]  # (episodes, classes, shots + queries, d)
        vectors = feats[:, :, :s].mean(2)
        queries = feats[:, :, s:].flatten(1, 2)
        logits = self.net.scale * self.net.adapted_cosine(vectors, queries)
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())

    @torch.no_grad()
    def predict(self, x: Tensor) -> Tensor:
        """Cosine of each adapted query to every seen class's adapted vector (CEC's test-time `_forward`)."""
        features = self.net.backbone(x)["features"]
        assert isinstance(features, Tensor)
        return self.net.adapted_cosine(self.net.weight[None, : self.total], features[None])[0]


class Episodes:
    """Pseudo-incremental episodes drawn from the base session: `way` real classes, then `low_way` classes
    rotated by a random quarter turn (a rotated class is a new class, CEC section 4.2). Each draw gives indices
    into the rotation-major feature bank, (episodes, classes, shots + queries), and the query targets."""

    def __init__(self, labels: Tensor, params: CECParams, generator_seed: int) -> None:
        classes = int(labels.max()) + 1
        self.way = max(1, min(params.way, classes // 2))  # a small base session cannot hold 15 + 15 classes
        self.low_way = max(1, min(params.low_way, classes - self.way))
        self.shots, self.queries, self.n = params.shots, params.queries, len(labels)
        self.members = (labels.cpu()[None, :] == torch.arange(classes)[:, None]).float()  # (classes, N)
        self.replace = int(self.members.sum(1).min()) < self.shots + self.queries
        self.generator = torch.Generator().manual_seed(generator_seed)

    def draw(self, count: int, device: torch.device) -> tuple[Tensor, Tensor]:
        g, ways, per = self.generator, self.way + self.low_way, self.shots + self.queries
        classes = torch.stack([torch.randperm(len(self.members), generator=g)[:ways] for _ in range(count)])
        picks = torch.multinomial(self.members[classes.flatten()], per, self.replace, generator=g)
        picks = picks.view(count, ways, per)
        rotation = torch.cat([torch.zeros(count, self.way, dtype=torch.long),
                              torch.randint(1, 4, (count, self.low_way), generator=g)], dim=1)
        index = rotation[:, :, None] * self.n + picks
        targets = torch.arange(ways).repeat_interleave(self.queries).expand(count, -1)
        return index.to(device), targets.to(device)


__all__ = ["CEC", "CECNet", "CECParams", "Episodes", "GraphAttention"]
