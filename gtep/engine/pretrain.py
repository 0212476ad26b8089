"""Supervised pretraining of a ViT backbone on classes kept out of both GTEP phases.

No pretrained image weights can be downloaded here, so `gtep pretrain` makes them: a ViT plus a linear
head trained with cross-entropy (AdamW, cosine schedule) on the given classes, fed by the pipeline a
study feeds the ViT with (PILOT's, gtep.data.pipelines: its crops, its [0, 1] inputs), saved as
safetensors with metadata naming the backbone, dataset, classes and pipeline, so that a study
can refuse weights pretrained on the classes it evaluates. The code path is the same for ViT-B/16 on a
GPU as for the small CPU configurations.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, cast

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from gtep.algorithms.base import FitRecipe
from gtep.data import ImageSet
from gtep.data.pipelines import choose_pipeline
from gtep.engine.device import resolve_device
from gtep.engine.loop import Trainer
from gtep.engine.runner import PhaseTensors
from gtep.models import create_backbone
from gtep.models.vit import PromptableViT, is_vit


@dataclass(frozen=True)
class PretrainSpec:
    backbone: str
    classes: tuple[int, ...]
    epochs: int = 30
    lr: float = 1e-3
    batch_size: int = 64
    weight_decay: float = 0.05
    seed: int = 0
    device: str = "auto"


@dataclass
class PretrainResult:
    train_accuracy: float
    test_accuracy: float
    seconds: float
    parameters: int


def pretrain(spec: PretrainSpec, data: ImageSet, dataset_name: str, out: Path,
             on_epoch: Callable[[int], None] | None = None) -> PretrainResult:
    if not is_vit(spec.backbone):
        raise ValueError(f"gtep pretrain makes ViT weights; {spec.backbone!r} is not a ViT")
    device = resolve_device(spec.device)
    torch.manual_seed(spec.seed)
    subset = data.subset(list(spec.classes))
    relabel = np.full(int(max(data.y_train.max(), data.y_test.max())) + 1, -1, dtype=np.int64)
    relabel[list(spec.classes)] = np.arange(len(spec.classes))
    # The ViT's pipeline for this dataset (its crops and input side), normalised by the pretraining images'
    # statistics, which the weights record and a study then feeds them with: a small ViT trained from scratch
    # on PILOT's unnormalised [0, 1] inputs takes several times the epochs to start learning.
    pipeline = replace(choose_pipeline(True, dataset_name, spec.backbone, algorithm=""), normalise="dataset")
    images = PhaseTensors(subset, list(spec.classes), device, pipeline)
    x = images.images("train", np.ones(len(subset.y_train), dtype=bool))
    y = torch.from_numpy(relabel[subset.y_train]).to(device)
    # a ViT (checked above): create_backbone wraps every ViT in a PromptableViT
    backbone = cast(PromptableViT, create_backbone(spec.backbone)).to(device)
    head = nn.Linear(backbone.out_dim, len(spec.classes)).to(device)
    model = nn.ModuleDict({"backbone": backbone, "head": head})

    def loss(xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(head(backbone(xb)["features"]), yb, label_smoothing=0.1)

    recipe = FitRecipe(spec.epochs, spec.lr, spec.batch_size, spec.weight_decay, "cosine", (), 0.1, "adamw")
    start = time.perf_counter()
    Trainer(device, spec.seed).fit(model.parameters(), loss, x, y, recipe, modules=[model], on_epoch=on_epoch)
    seconds = time.perf_counter() - start

    @torch.no_grad()
    def accuracy(split: str, labels: np.ndarray) -> float:
        model.eval()
        xt, yt = images.images(split, np.ones(len(labels), dtype=bool)), torch.from_numpy(relabel[labels]).to(device)
        preds = torch.cat([head(backbone(xt[i:i + 256])["features"]).argmax(1) for i in range(0, len(xt), 256)])
        return float((preds == yt).float().mean())

    result = PretrainResult(accuracy("train", subset.y_train), accuracy("test", subset.y_test), seconds,
                            sum(p.numel() for p in backbone.parameters()))
    save_weights(backbone.vit, out, {"gtep.backbone": spec.backbone, "gtep.dataset": dataset_name,
                                     "gtep.classes": ",".join(map(str, spec.classes)),
                                     "gtep.pipeline": images.pipeline.spec.describe(),
                                     "gtep.mean": ",".join(map(repr, images.pipeline.mean.flatten().tolist())),
                                     "gtep.std": ",".join(map(repr, images.pipeline.std.flatten().tolist())),
                                     "gtep.test_accuracy": f"{result.test_accuracy:.4f}",
                                     "gtep.epochs": str(spec.epochs)})
    return result


def save_weights(vit: nn.Module, out: Path, metadata: dict[str, str]) -> None:
    from safetensors.torch import save_file

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().cpu().contiguous() for k, v in vit.state_dict().items()}
    tmp = out.with_suffix(out.suffix + ".tmp")
    save_file(state, str(tmp), metadata=metadata)
    tmp.replace(out)
