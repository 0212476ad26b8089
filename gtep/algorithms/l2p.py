"""L2P (Wang et al., "Learning to Prompt for Continual Learning", CVPR 2022), as PILOT implements it.

A pool of M prompts, each `prompt_length` tokens with one learnable key. The query is the frozen
pretrained ViT's [CLS] feature of the image without prompts; the `top_k` prompts whose keys are most
cosine-similar to it are prepended to the patch tokens (after [CLS], paper section 4.2), and the
classifier reads the mean of the prompt tokens' outputs (PILOT's `head_type: prompt`; the paper's
"prompt-tuned [CLS]" alternative is not used). The loss is the cross-entropy on the current task's classes
(old logits masked, PILOT) plus `lamb` times the surrogate loss pulling the chosen keys to the queries
(paper eq. 5). The ViT stays frozen; prompts, keys and the head train. Exemplar-free.

Selection is per image, as the paper states it. PILOT's `batchwise_prompt` (every image of a batch takes
the batch's most frequent top-k prompts, at test time too) is left out: it makes one image's prediction
depend on the other images of its test batch.
"""
from __future__ import annotations

from dataclasses import dataclass

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
from gtep.algorithms.base import ALGORITHMS, AT_LEAST_ONE
from gtep.models.vit import PromptableViT


@dataclass(frozen=True)
class L2PParams(PromptParams):
    # Defaults: PILOT's l2p.json where it differs from dualprompt.json (PromptParams); milestone_num only matters
    # for steplr. pool_size is M, the prompts in the pool.
    lr: float = 0.001875
    milestone_num: int = 3
    batch_size: int = 32
    prompt_length: int = 5  # L_p, tokens per prompt
    top_k: int = 5  # prompts chosen per image (N in the paper)
    ranges = {"prompt_length": AT_LEAST_ONE}


class L2PNet(PromptNet):
    """Frozen ViT + prompt pool with keys + a head on the averaged prompt-token outputs."""

    def __init__(self, backbone: PromptableViT, pool_size: int, prompt_length: int, top_k: int) -> None:
        super().__init__(backbone)
        check_top_k_in_pool("L2P", top_k, pool_size)
        dim = backbone.out_dim
        self.prompts = uniform_parameter(pool_size, prompt_length, dim)
        self.keys = uniform_parameter(pool_size, dim)
        self.top_k = top_k

    def select(self, query: Tensor) -> tuple[Tensor, Tensor]:
        """(similarity to every key (B, M), indices of the top_k keys (B, k))."""
        similarity = key_similarity(query, self.keys)
        return similarity, similarity.topk(self.top_k, dim=1).indices

    def forward(self, x: Tensor, task: int | None = None) -> dict[str, Tensor]:
        similarity, chosen = self.select(self.query(x))
        prompts = self.prompts[chosen].flatten(1, 2)  # (B, k * L_p, D), in order of similarity
        out = self.backbone(x, prompts=prompts)
        pooled = out["tokens"][:, 1 : 1 + prompts.shape[1]].mean(1)
        out.update(features=pooled, logits=self.head(pooled), chosen=chosen,
                   pull=pull_loss(similarity, chosen))
        return out


@ALGORITHMS.register("l2p")
class L2P(PromptLearner[L2PParams]):
    """L2P (Wang et al. 2022): a key-matched prompt pool on a frozen ViT, trained with a pull constraint."""

    def make_net(self, backbone: PromptableViT) -> L2PNet:
        p = self.params
        return L2PNet(backbone, p.pool_size, p.prompt_length, p.top_k)
