"""The shared base of the continual few-shot learners (CFSL; gtep/protocol/families/cfsl/__init__.py).

CFSL's data flow (papers/cfsl-task-definitions.txt section 2) differs from class-incremental learning, so these
learners have their own steps, which gtep/engine/flows/continual_few_shot.py drives:

    start_task(num_labels)   a new task: forget the last one's state, back to the pretrained backbone
    learn_support(x, y)      one support set (float images, labels in 0..num_labels-1); the engine calls it once
                             per support set, from an iterator that yields each once, and the learner never gets
                             the list of them. It may keep state only as tensors it declares in task_state()
                             (prototypes, a head, fast weights): what persists from one support set to the next
    scores(x)                (n, num_labels) scores of target images, asked only after the last support set
    task_state()             the tensors that persist between support sets: after every support set the engine
                             sums their bytes (state_bytes, for `atm`) and counts their vectors (stored_vectors, for
                             `atm_count`; gtep/protocol/families/cfsl/metrics.py)

The backbone is the run's (pretrained on classes kept out of both phases: the study's `pretrain:` section or
`weights:`), frozen in eval mode unless a method tunes part of it per task, in which case it restores the
pretrained values at start_task and counts the tuned part in task_state. A meta-learner trains it further once,
before any task, on the classes it was pretrained on (the `meta_train` hook; `load_pretrain_images` gives them).
The class-incremental steps (learn_task ...) are not used on this path.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, ClassVar, cast

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gtep.algorithms.base import FitFn, IncrementalLearner, P, TaskData
from gtep.data import resolve_dataset
from gtep.data.pipelines import Pipeline, parse_description, pretrained_normalisation
from gtep.models import Backbone
from gtep.models.backbones import CifarResNet
from gtep.models.vit import weights_metadata
from gtep.protocol.holdout import held_out

CONTINUAL_FEW_SHOT = "continual_few_shot"


class FewShotLearner(IncrementalLearner[P]):
    uses_memory = False
    fixed_first_task = False
    data_flows: ClassVar[frozenset[str]] = frozenset({CONTINUAL_FEW_SHOT})

    def build_network(self) -> nn.Module:
        backbone = self.new_backbone()
        self.meta_train(backbone)
        backbone.eval()
        return backbone.requires_grad_(False)

    def meta_train(self, backbone: Backbone) -> None:
        """Hook: train the (pretrained) backbone further before any task, e.g. on episodes of the task's shape drawn
        from the classes it was pretrained on (load_pretrain_images(self.weights, self.device): kept out of both
        phases, so no phase class is seen). Called once, in build_network under the ordering's seed, with the
        backbone as created (train mode, every parameter trainable, on the CPU); build_network freezes it and puts
        it in eval mode afterwards, and the engine moves it to the run's device. May move it to self.device and
        change any of its values. Default: nothing (the backbone stays as pretrained)."""

    @property
    def feature_dim(self) -> int:
        return int(cast(Backbone, self.net).out_dim)

    # ---- the CFSL steps ------------------------------------------------------------------------------
    def start_task(self, num_labels: int) -> None:
        raise NotImplementedError

    def learn_support(self, x: Tensor, y: Tensor) -> None:
        raise NotImplementedError

    def scores(self, x: Tensor) -> Tensor:
        raise NotImplementedError

    def task_state(self) -> list[Tensor]:
        raise NotImplementedError

    def state_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.task_state())

    def stored_vectors(self) -> int:
        """|M_x^| of the paper's Eq. 1 now: the representation vectors held (embeddings, fast weights). A stored
        tensor of shape (n, ...) holds n (a prototype, a head row, a stored image, a filter); a 1-d tensor (a
        bias, per-label counts) holds scalars that annotate those rows, as the paper leaves the targets y out.
        A learner whose state does not fit this reading overrides it."""
        return sum(t.shape[0] for t in self.task_state() if t.dim() >= 2)

    # ---- shared helpers -------------------------------------------------------------------------------
    @torch.no_grad()
    def embed(self, x: Tensor) -> Tensor:
        """Frozen features of `x` (the backbone in eval mode: BatchNorm keeps its pretrained statistics)."""
        self.net.eval()
        return self.net(x)["features"].float()

    def fit_task(self, task: TaskData, fit: FitFn) -> None:
        raise TypeError(f"{type(self).__name__} learns continual few-shot tasks (data flow {CONTINUAL_FEW_SHOT}); "
                        "gtep.engine.flows.continual_few_shot drives it, not the class-incremental loop")


@dataclass(frozen=True)
class PretrainImages:
    """The training images of the classes a weights file was pretrained on, stored, with the view that feeds them
    to the backbone as the phases' images are fed (the test transform, the weights' normalisation)."""

    pixels: Tensor  # uint8, N x 3 x S x S, on the run's device
    labels: Tensor  # the dataset's class ids, on the run's device
    view: Callable[[Tensor], Tensor]  # stored pixels -> the backbone's float input


def load_pretrain_images(weights: str | None, device: torch.device) -> PretrainImages:
    """The images `weights` were pretrained on (the dataset, classes, pipeline, normalisation and held-out images
    its metadata records: gtep pretrain, a study's pretrain section), for a learner that meta-trains on them.
    Weights that do not say (or none) are a ValueError: there are no classes kept out of both phases to use."""
    meta = weights_metadata(Path(weights)) if weights else {}
    if not meta.get("gtep.dataset") or not meta.get("gtep.classes"):
        raise ValueError(f"meta-training needs weights from gtep pretrain (or a pretrain: section), whose metadata "
                         f"names the classes kept out of both phases; {weights or 'no weights'} does not")
    classes = [int(c) for c in meta["gtep.classes"].split(",")]
    data = resolve_dataset(meta["gtep.dataset"]).load().subset(classes)
    used = np.ones(len(data.y_train), dtype=bool)  # pretraining's images: all but a stream's held-out ones
    holdout = [int(c) for c in meta.get("gtep.holdout_classes", "").split(",") if c]
    used[held_out(data.y_train, holdout, float(meta.get("gtep.holdout", "0")))] = False
    normalisation = pretrained_normalisation(weights)
    assert normalisation is not None  # gtep pretrain records it beside the classes
    pipeline = Pipeline(parse_description(meta["gtep.pipeline"]), *normalisation, device)
    pixels = torch.from_numpy(np.ascontiguousarray(data.x_train[used])).to(device).permute(0, 3, 1, 2)
    return PretrainImages(pixels, torch.from_numpy(data.y_train[used]).to(device), pipeline.view)


def label_means(features: Tensor, labels: Tensor, num_labels: int) -> tuple[Tensor, Tensor]:
    """Per label: the sum of its rows' features and their count (zeros for labels without rows)."""
    sums = torch.zeros(num_labels, features.shape[1], device=features.device).index_add_(0, labels, features)
    counts = torch.zeros(num_labels, device=features.device).index_add_(0, labels, torch.ones_like(labels,
                                                                                                  dtype=torch.float))
    return sums, counts


class LastStage(nn.Module):
    """A CIFAR ResNet cut before its last stage: `frozen(x)` gives the last stage's input once per support set,
    `head_features(h)` runs the (tunable) last stage and the pooling, so only it is trained per support set."""

    def __init__(self, backbone: nn.Module) -> None:
        super().__init__()
        if not isinstance(backbone, CifarResNet):
            raise ValueError(f"tuning the last block needs a CIFAR ResNet (resnet8/20/32), not "
                             f"{type(backbone).__name__}; set tune_last_block to false")
        self.backbone = backbone
        self.pretrained = copy.deepcopy(backbone.stages[-1].state_dict())
        backbone.stages[-1].requires_grad_(True)  # the learner froze the whole backbone; this stage trains

    def restore(self) -> None:
        self.backbone.stages[-1].load_state_dict(self.pretrained)

    @torch.no_grad()
    def frozen(self, x: Tensor) -> Tensor:
        h = self.backbone.stem(x)
        for stage in self.backbone.stages[:-1]:
            h = stage(h)
        return h

    def head_features(self, h: Tensor) -> Tensor:
        return torch.flatten(F.adaptive_avg_pool2d(self.backbone.stages[-1](h), 1), 1)

    def parameters_to_tune(self) -> list[nn.Parameter]:
        return list(self.backbone.stages[-1].parameters())
