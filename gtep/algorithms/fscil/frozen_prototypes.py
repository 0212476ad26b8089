"""The training-frozen prototype baseline of few-shot class-incremental learning (FSCIL), as the FSCIL paper
(../shared/papers/fscil-gacc.txt, "Baseline", and ../shared/notes/companions.md, 000.3) describes it after
CEC, FACT, ALICE and others:

1. on the base session (task.index == 0) train the backbone and a cosine classifier with cross-entropy: the
   logits are scale * <x/|x|, w_c/|w_c|> for every class vector w_c, the scale fixed or learnt;
2. freeze the backbone (and the classifier) once the base session ends;
3. for every class of every later (few-shot) session append its prototype, computed from its training images
   (its K shots) as `prototype` says, to the classifier, with no gradient training.

Prediction is the cosine similarity of the image's feature to every seen class's vector (Phi(X) = P^T X with
P and X L2-normalised): nearest class mean with cosine similarity. No exemplar memory is kept.

Prototype (`prototype`):
    mean             the mean feature (the default and the paper's: "the classifier is extended by mean features
                     (i.e. prototypes) extracted by the frozen backbone"; CEC's update_fc_avg and replace_base_fc
                     average the raw embeddings too); the cosine classifier normalises it, so P holds the direction
                     of the class's mean feature
    normalised_mean  the mean of the L2-normalised features (the mean direction: every image weighs the same
                     whatever its feature norm); not the paper's, offered for comparison
Both give unit-free directions to the cosine classifier; they differ when a class's feature norms vary, since
`mean` lets images with larger features pull the prototype further.

Base-class vectors: by default (`base_prototypes`, the `original` preset) the trained base weights are
replaced by the base classes' prototypes when the base session ends, so every class, base or novel, is
represented the same way, by a prototype of the same frozen backbone. This is the reference
implementations' scheme (CEC's `replace_base_fc`, kept by FACT, LIMIT and ALICE: "replace fc.weight with the
embedding average of train data") and the paper's "P^T X" classifier read as NCM. It matters because trained
cosine weights are pushed by the cross-entropy margin away from the other base classes (and, with a large
scale, beyond the region the features occupy), while novel prototypes sit inside the feature cloud: mixing
the two would bias scores between the base and the novel classes. `base_prototypes: false` keeps the trained
weights instead (the paper's wording: the base classifier "if available" is kept, novel prototypes appended).

The method trains only the base session, under the fixed first-task recipe (fixed_first_task). The sampled
general hyperparameters (lr, epochs, ...) reach nothing: later sessions do not train. What shapes results is
the cosine scale, whether it is learnt, and the base-vector and prototype choices, all of which act in task 1
(the base prototypes are set when it ends) and so key the study's shared first-task results (first_task_hparams).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gtep.algorithms._pretrained import class_means
from gtep.algorithms.base import ALGORITHMS, POSITIVE, CommonParams, FitFn, IncrementalLearner, TaskData, freeze
from gtep.models import Backbone

# Images per forward pass when prototypes are extracted: a constant, so no sampled value (batch_size) can
# reach the prototypes through the kernels a batch size selects.
PROTOTYPE_BATCH = 256


@dataclass(frozen=True)
class FrozenPrototypesParams(CommonParams):
    scale: float = 16.0  # cosine-classifier scale (inverse temperature) of the base session; CEC's 16
    learn_scale: bool = False  # learn the scale during the base session (starting at `scale`)
    base_prototypes: bool = True  # replace the trained base weights by the base classes' prototypes
    prototype: Literal["mean", "normalised_mean"] = "mean"  # the paper's mean features (module docstring)
    ranges = {"scale": POSITIVE}


class CosinePrototypeNet(nn.Module):
    """A backbone and one vector per class (trained weights or prototypes), compared by cosine similarity."""

    def __init__(self, backbone: Backbone, scale: float, learn_scale: bool) -> None:
        super().__init__()
        self.backbone = backbone
        self.weight = nn.Parameter(torch.empty(0, backbone.out_dim))
        self.scale = nn.Parameter(torch.tensor(float(scale)), requires_grad=learn_scale)

    def expand(self, total: int) -> None:
        """Rows for new classes (Kaiming-uniform, as LinearHead); old rows are copied, never reset. The new
        rows train like the old ones (in the base session) or stay frozen (after it)."""
        old = self.weight.shape[0]
        if total <= old:
            return
        fresh = torch.empty(total - old, self.weight.shape[1], device=self.weight.device)
        nn.init.kaiming_uniform_(fresh, nonlinearity="linear")
        trains = self.weight.requires_grad
        self.weight = nn.Parameter(torch.cat([self.weight.data, fresh]), requires_grad=trains)

    def cosine(self, features: Tensor) -> Tensor:
        """(batch, classes) cosine similarities of the features to every class vector."""
        return F.normalize(features, dim=1) @ F.normalize(self.weight, dim=1).t()

    def forward(self, x: Tensor) -> dict[str, Tensor | list[Tensor]]:
        out = self.backbone(x)
        features = out["features"]
        assert isinstance(features, Tensor)
        out["logits"] = self.scale * self.cosine(features)
        return out


@ALGORITHMS.register("frozen_prototypes")
class FrozenPrototypes(IncrementalLearner[FrozenPrototypesParams]):
    """Training-frozen prototypes (the FSCIL baseline): a cosine classifier trained on the base session, then
    a frozen backbone and one prototype (by default the paper's mean feature) per novel class, no exemplars."""

    uses_memory = False
    fixed_first_task = True
    first_task_hparams = ("scale", "learn_scale", "base_prototypes", "prototype")
    net: CosinePrototypeNet

    def build_network(self) -> nn.Module:
        return CosinePrototypeNet(self.new_backbone(), self.params.scale, self.params.learn_scale)

    def fit_task(self, task: TaskData, fit: FitFn) -> None:
        """The base session trains backbone and classifier (cross-entropy on the scaled cosine logits, the
        default loss); a later session only appends its classes' prototypes."""
        if task.index == 0:
            super().fit_task(task, fit)
        else:
            self.set_prototypes(task, task.new_classes)

    def consolidate(self, task: TaskData, fit: FitFn) -> None:
        """After the base session: freeze everything (the backbone, its BatchNorm statistics too, since every
        later forward runs in eval mode, and the classifier), then replace the base weights by prototypes if
        `base_prototypes` (see the module docstring for why this is the default)."""
        if task.index != 0:
            return
        freeze(self.net)
        if self.params.base_prototypes:
            self.set_prototypes(task, task.new_classes)

    @torch.no_grad()
    def set_prototypes(self, task: TaskData, classes: list[int]) -> None:
        """Each class's vector becomes its prototype (`prototype`: the mean feature, the paper's, or the mean
        L2-normalised feature) of its training images (in eval mode, the test view of the images, no
        augmentation)."""
        self.net.eval()
        features = self.batched(self.features, PROTOTYPE_BATCH)(task.x)
        if self.params.prototype == "normalised_mean":
            features = F.normalize(features, dim=1)
        prototypes = class_means(features, task.y, classes)
        index = torch.as_tensor(classes, device=self.net.weight.device)
        self.net.weight.data[index] = prototypes.to(self.net.weight.dtype)

    @torch.no_grad()
    def predict(self, x: Tensor) -> Tensor:
        """Cosine similarity to every seen class's vector (the scale does not change the argmax)."""
        features = self.net.backbone(x)["features"]
        assert isinstance(features, Tensor)
        return self.net.cosine(features)[:, : self.total]


__all__ = ["CosinePrototypeNet", "FrozenPrototypes", "FrozenPrototypesParams"]
