"""DualPrompt (Wang et al., "DualPrompt: Complementary Prompting for Rehearsal-free Continual Learning",
ECCV 2022), as PILOT implements it.

Two kinds of prompts enter a frozen ViT by prefix-tuning (paper section 4.2): each prompt has a key half
and a value half joined to the attention layer's own keys and values (`Prefix`).
- The G-prompt (length `g_prompt_length`), shared by all tasks, at layers `g_prompt_layers` (PILOT: 0-1).
- E-prompts (length `e_prompt_length`), a pool of `pool_size` with one learnable key each, at layers
  `e_prompt_layers` (PILOT: 2-4). Every layer has its own G- and E-prompt parameters.
Training knows the task: task t uses E-prompt t (PILOT's prompt mask, top_k prompts per task) and its key
is pulled toward the task's queries with weight `lamb`; past the pool's end, training falls back to key
matching as PILOT does. At test time the key most cosine-similar to the query (the frozen ViT's [CLS]
without prompts) picks the E-prompt. The classifier reads the prompted [CLS] (PILOT's `head_type: token`);
old classes' logits are masked while training. Each new task's E-prompt starts as a copy of the previous
one (PILOT's `shared_prompt_pool`; keys are not copied, `shared_prompt_key` false).

Two choices differ from the paper's text and follow PILOT: the key and value halves are each
`e_prompt_length` (`g_prompt_length`) tokens long rather than half of it; the layer lists drop ids beyond
the backbone's depth (a 4-block ViT gets E-prompts at 2-3). Selection is per image (PILOT's
`batchwise_prompt` majority vote over a batch is left out, as in l2p.py).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from gtep.algorithms._prompting import (
    PromptLearner,
    PromptNet,
    PromptParams,
    check_top_k_in_pool,
    key_similarity,
    pull_loss,
    uniform_parameter,
)
from gtep.algorithms.base import ALGORITHMS, AT_LEAST_ONE, NON_NEGATIVE, TaskData
from gtep.models.vit import Prefix, PromptableViT


@dataclass(frozen=True)
class DualPromptParams(PromptParams):
    # Defaults: PILOT's dualprompt.json where it differs from l2p.json (PromptParams); milestone_num only matters
    # for steplr. pool_size counts the E-prompts; top_k is E-prompts per image (and per task while training).
    lr: float = 0.001
    milestone_num: int = 4
    batch_size: int = 24
    g_prompt_length: int = 5  # L_g
    e_prompt_length: int = 5  # L_e
    g_prompt_layers: tuple[int, ...] = (0, 1)
    e_prompt_layers: tuple[int, ...] = (2, 3, 4)
    ranges = {"g_prompt_length": AT_LEAST_ONE, "e_prompt_length": AT_LEAST_ONE, "g_prompt_layers": NON_NEGATIVE,
              "e_prompt_layers": NON_NEGATIVE}

    def __post_init__(self) -> None:  # a YAML preset gives lists; keep the Params hashable
        object.__setattr__(self, "g_prompt_layers", tuple(self.g_prompt_layers))
        object.__setattr__(self, "e_prompt_layers", tuple(self.e_prompt_layers))


class DualPromptNet(PromptNet):
    """Frozen ViT + per-layer G-prompt and E-prompt pool (prefixes) + E-prompt keys + a head on [CLS]."""

    def __init__(self, backbone: PromptableViT, p: DualPromptParams) -> None:
        super().__init__(backbone)
        check_top_k_in_pool("DualPrompt", p.top_k, p.pool_size)
        depth, dim = backbone.depth, backbone.out_dim
        self.g_layers = sorted({i for i in p.g_prompt_layers if 0 <= i < depth})
        self.e_layers = sorted({i for i in p.e_prompt_layers if 0 <= i < depth} - set(self.g_layers))
        # (layer, key/value, L_g, D) and (layer, key/value, pool, L_e, D)
        self.g_prompt = uniform_parameter(len(self.g_layers), 2, p.g_prompt_length, dim)
        self.e_prompt = uniform_parameter(len(self.e_layers), 2, p.pool_size, p.e_prompt_length, dim)
        self.keys = uniform_parameter(p.pool_size, dim)
        self.pool_size, self.top_k = p.pool_size, p.top_k

    def task_prompts(self, task: int) -> slice | None:
        """The pool slots of a task while training, or None once the pool is used up (PILOT)."""
        start = task * self.top_k
        return slice(start, start + self.top_k) if start + self.top_k <= self.pool_size else None

    def select(self, query: Tensor, task: int | None) -> tuple[Tensor, Tensor]:
        """(similarity to every key (B, M), chosen E-prompt indices (B, k)): the task's own when known."""
        similarity = key_similarity(query, self.keys)
        slots = self.task_prompts(task) if task is not None else None
        if slots is None:
            return similarity, similarity.topk(self.top_k, dim=1).indices
        own = torch.arange(slots.start, slots.stop, device=query.device)
        return similarity, own.expand(len(query), -1)

    def prefixes(self, chosen: Tensor) -> dict[int, Prefix]:
        b = len(chosen)
        out = {layer: Prefix(g[0].expand(b, -1, -1), g[1].expand(b, -1, -1))
               for layer, g in zip(self.g_layers, self.g_prompt)}
        for layer, e in zip(self.e_layers, self.e_prompt):
            kv = e[:, chosen].flatten(2, 3)  # (2, B, k * L_e, D)
            out[layer] = Prefix(kv[0], kv[1])
        return out

    def forward(self, x: Tensor, task: int | None = None) -> dict[str, Tensor]:
        similarity, chosen = self.select(self.query(x), task)
        out = self.backbone(x, prefixes=self.prefixes(chosen))
        out.update(logits=self.head(out["features"]), chosen=chosen, pull=pull_loss(similarity, chosen))
        return out


@ALGORITHMS.register("dualprompt")
class DualPrompt(PromptLearner[DualPromptParams]):
    """DualPrompt (Wang et al. 2022): shared G-prompt, key-matched task E-prompts, prefixes in a frozen ViT."""

    net: DualPromptNet

    def make_net(self, backbone: PromptableViT) -> DualPromptNet:
        return DualPromptNet(backbone, self.params)

    def grow(self, task: TaskData) -> None:
        super().grow(task)
        if task.index == 0:
            return
        current, previous = self.net.task_prompts(task.index), self.net.task_prompts(task.index - 1)
        if current is not None and previous is not None:
            # The new task's E-prompt starts from the last one learnt (PILOT's shared_prompt_pool).
            with torch.no_grad():
                self.net.e_prompt[:, :, current] = self.net.e_prompt[:, :, previous]
