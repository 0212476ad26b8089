"""Supervised pretraining of a backbone on classes kept out of both GTEP phases.

No pretrained image weights can be downloaded here, so `gtep pretrain` (and a study's `pretrain:` section)
makes them: a backbone plus a linear head trained with cross-entropy on the given classes, saved as
safetensors with metadata naming the backbone, dataset, classes, pipeline and normalisation, so that a
study can refuse weights pretrained on the classes it evaluates and feed them as they learnt.

* A ViT: AdamW with a cosine schedule, fed by the pipeline a study feeds the ViT with (PILOT's crops),
  normalised by the pretraining images' statistics. The code path is the same for ViT-B/16 on a GPU as for
  the small CPU configurations.
* A CNN (the ResNets of gtep.models.backbones): SGD with momentum and a cosine schedule, fed by the pipeline
  gtep.data.pipelines chooses for it (PyCIL's: padded crops, flips, brightness), as PyCIL trains them.

`method: protonet` meta-trains instead (a CNN or a ViT alike): episodic Prototypical Network training (Snell et al.
2017) on the same classes through the shared core gtep/algorithms/_episodic.py, `ways`-way `shots`-shot episodes
with `queries` queries a class, Adam at `lr`, `epochs` x (images / images per episode) episodes, no head. It is
the "Meta" pretraining of FLUID's few-shot methods (papers/fluid.txt App. C: 30-way 5-shot, 100 epochs, lr 0.01);
its accuracies are nearest-prototype ones (the training images' class means). No augmentation in the episodes.

`holdout` > 0 leaves that share of the training images of `holdout_classes` out (gtep.protocol.holdout: the
same images whatever the seed), so a scenario can show them as images the backbone never saw (its family's
ScenarioFamily.pretrain_holdout); the weights' metadata records it. Those images are out of the normalisation
statistics too: pretraining computes them over what it trains on.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Literal, cast

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from gtep.algorithms._episodic import prototype_logits, train_prototypical
from gtep.algorithms.base import FitRecipe
from gtep.data import ImageSet
from gtep.data.pipelines import PipelineSpec, choose_pipeline
from gtep.engine.device import resolve_device
from gtep.engine.loop import Trainer
from gtep.engine.runner import PhaseTensors
from gtep.models import create_backbone
from gtep.models.vit import PromptableViT, is_vit
from gtep.protocol.holdout import held_out

PretrainMethod = Literal["supervised", "protonet"]


@dataclass(frozen=True)
class PretrainSpec:
    backbone: str
    classes: tuple[int, ...]
    epochs: int = 30
    lr: float = 1e-3
    batch_size: int = 64
    weight_decay: float = 0.05  # AdamW's for a ViT; a CNN's SGD takes e.g. 5e-4 (default_spec)
    seed: int = 0
    device: str = "auto"
    holdout: float = 0.0  # share of the training images of holdout_classes left out (module docstring)
    holdout_classes: tuple[int, ...] = ()
    method: PretrainMethod = "supervised"  # or protonet: episodic meta-training (module docstring)
    ways: int = 30  # protonet's episodes: FLUID's 30-way 5-shot
    shots: int = 5
    queries: int = 5


@dataclass
class PretrainResult:
    train_accuracy: float
    test_accuracy: float
    seconds: float
    parameters: int


def default_spec(backbone: str, classes: tuple[int, ...], **given: Any) -> PretrainSpec:
    """A spec with the defaults of the backbone's kind (a CNN's SGD wants a larger lr and a smaller decay than
    a ViT's AdamW); `given` overrides them (None entries are ignored)."""
    kind: dict[str, Any] = {} if is_vit(backbone) else {"epochs": 30, "lr": 0.05, "weight_decay": 5e-4}
    if given.get("method") == "protonet":
        kind["lr"] = 1e-3  # the episodic core's Adam, at Snell et al.'s rate
    return PretrainSpec(backbone, tuple(classes), **{**kind, **{k: v for k, v in given.items() if v is not None}})


def pretraining_pipeline(backbone: str, dataset_name: str) -> PipelineSpec:
    """The pipeline a study would feed the backbone with, normalised by the pretraining images' statistics
    (the weights record them, and a study then feeds the weights with the same): a small ViT trained from
    scratch on PILOT's unnormalised [0, 1] inputs takes several times the epochs to start learning."""
    return replace(choose_pipeline(True, dataset_name, backbone, algorithm=""), normalise="dataset")


def pretrain(spec: PretrainSpec, data: ImageSet, dataset_name: str, out: Path,
             on_epoch: Callable[[int], None] | None = None) -> PretrainResult:
    vit = is_vit(spec.backbone)
    device = resolve_device(spec.device)
    torch.manual_seed(spec.seed)
    subset = training_subset(data.subset(list(spec.classes)), spec)
    relabel = np.full(int(max(data.y_train.max(), data.y_test.max())) + 1, -1, dtype=np.int64)
    relabel[list(spec.classes)] = np.arange(len(spec.classes))
    # built on what it trains on: the normalisation statistics never see the images held out for the streams
    images = PhaseTensors(subset, list(spec.classes), device, pretraining_pipeline(spec.backbone, dataset_name))
    used = np.ones(len(subset.y_train), dtype=bool)
    x = images.images("train", used)
    y = torch.from_numpy(relabel[subset.y_train[used]]).to(device)
    backbone = create_backbone(spec.backbone).to(device)
    head = nn.Linear(backbone.out_dim, len(spec.classes)).to(device)
    start = time.perf_counter()
    if spec.method == "protonet":
        meta_train(backbone, x, y, spec)
    else:
        train_supervised(backbone, head, x, y, spec, on_epoch)
    seconds = time.perf_counter() - start
    classify = nearest_prototype(backbone, x, y) if spec.method == "protonet" else \
        (lambda xb: head(backbone(xb)["features"]))

    @torch.no_grad()
    def accuracy(split: str, labels: np.ndarray, rows: np.ndarray | None = None) -> float:
        backbone.eval()
        rows = np.ones(len(labels), dtype=bool) if rows is None else rows
        xt, yt = images.images(split, rows), torch.from_numpy(relabel[labels[rows]]).to(device)
        preds = torch.cat([classify(xt[i:i + 256]).argmax(1) for i in range(0, len(xt), 256)])
        return float((preds == yt).float().mean())

    result = PretrainResult(accuracy("train", subset.y_train, used), accuracy("test", subset.y_test), seconds,
                            sum(p.numel() for p in backbone.parameters()))
    # A ViT's file holds the timm model (what create_timm_vit loads, as any timm checkpoint); a CNN's holds the
    # backbone's own state, BatchNorm statistics included.
    module = cast(PromptableViT, backbone).vit if vit else backbone
    save_weights(module, out, {"gtep.backbone": spec.backbone, "gtep.dataset": dataset_name,
                                     "gtep.classes": ",".join(map(str, spec.classes)),
                                     "gtep.pipeline": images.pipeline.spec.describe(),
                                     "gtep.mean": ",".join(map(repr, images.pipeline.mean.flatten().tolist())),
                                     "gtep.std": ",".join(map(repr, images.pipeline.std.flatten().tolist())),
                                     "gtep.test_accuracy": f"{result.test_accuracy:.4f}",
                                     "gtep.epochs": str(spec.epochs),
                                     **({"gtep.method": spec.method} if spec.method != "supervised" else {}),
                                     **({"gtep.holdout": f"{spec.holdout:g}",
                                         "gtep.holdout_classes": ",".join(map(str, spec.holdout_classes))}
                                        if spec.holdout else {})})
    return result


def train_supervised(backbone: nn.Module, head: nn.Module, x: torch.Tensor, y: torch.Tensor, spec: PretrainSpec,
                     on_epoch: Callable[[int], None] | None) -> None:
    """Cross-entropy (label smoothing 0.1) of a linear head on the backbone; AdamW for a ViT, SGD for a CNN."""
    model = nn.ModuleDict({"backbone": backbone, "head": head})

    def loss(xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(head(backbone(xb)["features"]), yb, label_smoothing=0.1)

    recipe = FitRecipe(spec.epochs, spec.lr, spec.batch_size, spec.weight_decay, "cosine", (), 0.1,
                       "adamw" if is_vit(spec.backbone) else "sgd")
    Trainer(x.device, spec.seed).fit(model.parameters(), loss, x, y, recipe, modules=[model], on_epoch=on_epoch)


def meta_train(backbone: nn.Module, x: torch.Tensor, y: torch.Tensor, spec: PretrainSpec) -> list[float]:
    """Episodic ProtoNet training of the backbone's features: `epochs` passes' worth of episodes (module
    docstring); the per-episode losses."""
    per_episode = spec.ways * (spec.shots + spec.queries)
    episodes = spec.epochs * max(1, len(y) // per_episode)

    def embed(xb: torch.Tensor) -> torch.Tensor:
        return cast(torch.Tensor, backbone(xb)["features"])

    return train_prototypical(backbone, embed, x, y, ways=spec.ways, shots=spec.shots, queries=spec.queries,
                              episodes=episodes, lr=spec.lr, generator=torch.Generator().manual_seed(spec.seed))


@torch.no_grad()
def nearest_prototype(backbone: nn.Module, x: torch.Tensor, y: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
    """A classifier of images by their nearest class mean of the training images' features (labels 0..n-1)."""
    backbone.eval()
    support = torch.cat([backbone(x[i:i + 256])["features"] for i in range(0, len(y), 256)])
    return lambda xb: prototype_logits(backbone(xb)["features"], support, y)


def pretraining_images(y_train: np.ndarray, spec: PretrainSpec) -> np.ndarray:
    """Which training images (bool per row of `y_train`, the pretraining classes' images in dataset order)
    pretraining uses: all but those held out for a FLUID stream."""
    used = np.ones(len(y_train), dtype=bool)
    used[held_out(y_train, spec.holdout_classes, spec.holdout)] = False
    return used


def training_subset(subset: ImageSet, spec: PretrainSpec) -> ImageSet:
    """The pretraining classes' images without the training images held out for a FLUID stream
    (`pretraining_images`); the test images all stay (pretraining's test accuracy reads them)."""
    used = pretraining_images(subset.y_train, spec)
    if used.all():
        return subset
    return replace(subset, x_train=subset.x_train[used], y_train=subset.y_train[used],
                   train_index=subset.dataset_train_index()[used])


def save_weights(vit: nn.Module, out: Path, metadata: dict[str, str]) -> None:
    from safetensors.torch import save_file

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().cpu().contiguous() for k, v in vit.state_dict().items()}
    tmp = out.with_suffix(out.suffix + ".tmp")
    save_file(state, str(tmp), metadata=metadata)
    tmp.replace(out)
