"""Pretrained vision transformers from timm, opened up for prompts, prefixes and adapters.

The pretrained-model algorithms of the GTEP paper (section 4.2; PILOT) change a frozen ViT in three ways:
tokens prepended to the input (L2P), key/value prefixes inside chosen layers (DualPrompt, CODA-Prompt),
and small bottleneck adapters beside each MLP (APER, RanPAC, EASE; AdaptFormer style). `PromptableViT`
runs timm's blocks one by one so each of these can be passed in per call, without editing timm.

Backbones: any timm ViT by name (`vit_base_patch16_224` is the paper's) and `vit_micro_patch4_32`, a
4-layer, 96-wide ViT for 32 px images that trains on a CPU. Weights come from a local file only.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gtep.models.base import Backbone

SMALL_VITS = {
    # name: (img_size, patch_size, embed_dim, depth, num_heads)
    "vit_micro_patch4_32": (32, 4, 96, 4, 3),
    "vit_mini_patch4_32": (32, 4, 192, 6, 3),
}


class WeightsError(ValueError):
    """A weights file that cannot be used with the backbone, with the path and the fix."""


def load_state(path: Path) -> dict[str, Tensor]:
    """safetensors, or a PyTorch state dict read with weights_only=True (never arbitrary pickles)."""
    path = Path(path)
    if not path.exists():
        raise WeightsError(f"weights file {path} does not exist; "
                           "train one with gtep pretrain or pass the right --weights")
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(str(path))
    state = torch.load(path, map_location="cpu", weights_only=True)
    for key in ("state_dict", "model"):
        if isinstance(state, dict) and key in state and isinstance(state[key], dict):
            state = state[key]
    return state


def weights_metadata(path: Path) -> dict[str, str]:
    """The metadata gtep pretrain stores in a safetensors file (backbone, dataset, classes)."""
    if Path(path).suffix != ".safetensors":
        return {}
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as fh:
        return dict(fh.metadata() or {})


def create_timm_vit(name: str, weights: str | Path | None = None) -> nn.Module:
    import timm
    from timm.models.vision_transformer import VisionTransformer

    model: nn.Module
    if name in SMALL_VITS:
        img, patch, dim, depth, heads = SMALL_VITS[name]
        model = VisionTransformer(img_size=img, patch_size=patch, embed_dim=dim, depth=depth, num_heads=heads,
                                  num_classes=0)
    else:
        try:
            model = timm.create_model(name, pretrained=False, num_classes=0)
        except RuntimeError as err:
            raise WeightsError(f"timm has no model {name!r} ({err})") from None
    if weights:
        state = {k: v for k, v in load_state(Path(weights)).items() if not k.startswith("head.")}
        missing, unexpected = model.load_state_dict(state, strict=False)
        if missing or unexpected:
            raise WeightsError(f"weights {weights} do not fit {name}: "
                               f"missing {missing[:3]}, unexpected {unexpected[:3]}")
    return model


@dataclass
class Prefix:
    """Key and value tokens prepended inside one attention layer (prefix-tuning): (B, L, D) each."""

    key: Tensor
    value: Tensor


def attention_with_prefix(attn: Any, x: Tensor, prefix: Prefix | None) -> Tensor:
    """timm's Attention, with optional prefix keys/values joined to the layer's own (Li & Liang 2021)."""
    if prefix is None:
        return attn(x)
    b, n, c = x.shape
    qkv = attn.qkv(x).reshape(b, n, 3, attn.num_heads, attn.head_dim).permute(2, 0, 3, 1, 4)
    q, k, v = qkv.unbind(0)
    q, k = attn.q_norm(q), attn.k_norm(k)

    def heads(t: Tensor) -> Tensor:
        return t.reshape(b, t.shape[1], attn.num_heads, attn.head_dim).permute(0, 2, 1, 3)

    k = torch.cat([heads(prefix.key), k], dim=2)
    v = torch.cat([heads(prefix.value), v], dim=2)
    out = F.scaled_dot_product_attention(q, k, v)
    out = out.transpose(1, 2).reshape(b, n, -1)
    return attn.proj_drop(attn.proj(attn.norm(out)))


class Adapter(nn.Module):
    """A bottleneck adapter beside a block's MLP (AdaptFormer, Chen et al. 2022; as APER uses it):
    down-projection to `bottleneck` (ffn_num), ReLU, up-projection initialised to zero, scaled by 0.1."""

    def __init__(self, dim: int, bottleneck: int, scale: float = 0.1) -> None:
        super().__init__()
        self.down = nn.Linear(dim, bottleneck)
        self.up = nn.Linear(bottleneck, dim)
        self.scale = scale
        nn.init.kaiming_uniform_(self.down.weight, a=5 ** 0.5)
        nn.init.zeros_(self.up.weight)
        nn.init.zeros_(self.down.bias)
        nn.init.zeros_(self.up.bias)

    def forward(self, x: Tensor) -> Tensor:
        return self.up(F.relu(self.down(x))) * self.scale


class PromptableViT(Backbone):
    """A timm ViT whose forward accepts prompt tokens, per-layer prefixes and per-layer adapters.

    forward(x) returns {"features": [CLS] after the final norm, "tokens": all tokens}; with nothing passed
    it equals timm's own forward_features + CLS pooling.
    """

    def __init__(self, vit: Any) -> None:  # timm's VisionTransformer: its parts are reached by name, untyped
        super().__init__()
        self.vit = vit
        self.out_dim = int(vit.embed_dim)
        self.depth = len(vit.blocks)

    def embed(self, x: Tensor) -> Tensor:
        v = self.vit
        size = v.patch_embed.img_size
        if tuple(x.shape[-2:]) != tuple(size):  # e.g. 32 px data into ViT-B/16 at 224 px
            x = F.interpolate(x, size=size, mode="bilinear", align_corners=False)
        return v.norm_pre(v.patch_drop(v._pos_embed(v.patch_embed(x))))

    def run_block(self, index: int, x: Tensor, prefix: Prefix | None = None,
                  adapter: nn.Module | None = None) -> Tensor:
        block = self.vit.blocks[index]
        x = x + block.drop_path1(block.ls1(attention_with_prefix(block.attn, block.norm1(x), prefix)))
        h = block.mlp(block.norm2(x))
        if adapter is not None:
            h = h + adapter(x)
        return x + block.drop_path2(block.ls2(h))

    def forward(self, x: Tensor, prompts: Tensor | None = None, prefixes: dict[int, Prefix] | None = None,
                adapters: nn.ModuleList | list | None = None) -> dict[str, Tensor]:
        tokens = self.embed(x)
        if prompts is not None:  # prompt tuning: after the [CLS] token, before the patches (L2P)
            tokens = torch.cat([tokens[:, :1], prompts, tokens[:, 1:]], dim=1)
        for i in range(self.depth):
            tokens = self.run_block(i, tokens, (prefixes or {}).get(i), adapters[i] if adapters is not None else None)
        tokens = self.vit.norm(tokens)
        return {"features": tokens[:, 0], "tokens": tokens, "fmaps": []}


def vit_depth(name: str) -> int | None:
    """A ViT's number of blocks from its name, without building its weights (timm's on the meta device); None for a
    name that is not a ViT timm knows."""
    if name in SMALL_VITS:
        return SMALL_VITS[name][3]
    if not is_vit(name):
        return None
    import timm

    try:
        with torch.device("meta"):
            model: Any = timm.create_model(name, pretrained=False)  # timm's VisionTransformer: .blocks by name
            return len(model.blocks)
    except Exception:  # noqa: BLE001 - an unknown name: resolve() reports it
        return None


def is_vit(name: str) -> bool:
    return name in SMALL_VITS or name.startswith(("vit_", "deit_"))
