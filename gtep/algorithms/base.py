"""The learner contract every class-incremental algorithm implements, and the parameters all share.

A learner sees tasks one at a time, with labels already mapped to positions in the class ordering, so
old classes are [0, known) and new ones [known, total). The engine drives it:

    begin_task(task)                  grow the network, snapshot what distillation needs
    learn_task(task, fit)             default: one fit() of loss() over the task data + memory
    end_task(task)                    update the exemplar memory, align or calibrate, freeze
    predict(x) -> scores              over every class seen so far

`fit` is the engine's one training loop (optimiser, schedule, batches, augmentation, divergence check);
an algorithm with extra stages (bias correction, class-balanced fine-tuning, compression) calls it again
with its own parameters and loss, so no algorithm writes its own loop.
"""
from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Iterable, Literal, Protocol

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gtep.algorithms.memory import ExemplarMemory
from gtep.models import IncrementalNet, create_backbone
from gtep.registry import Registry

Scheduler = Literal["steplr", "cosine", "constant"]
Optimizer = Literal["sgd", "adam", "adamw"]


@dataclass(frozen=True)
class CommonParams:
    """General hyperparameters of the paper's Table 4; every algorithm's Params extends this."""

    epochs: int = 70
    lr: float = 0.1
    milestone_num: int = 2
    lr_decay: float = 0.1
    batch_size: int = 128
    weight_decay: float = 2e-4
    scheduler: Scheduler = "steplr"
    optimizer: Optimizer = "sgd"
    momentum: float = 0.9  # fixed by the paper (appendix A.1), kept as a field so presets can state it
    milestones: tuple[int, ...] | None = None  # explicit milestones (PyCIL presets); else the paper's rule

    @classmethod
    def tunable(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls) if f.name not in ("milestones",)]

    @classmethod
    def from_mapping(cls, values: dict[str, Any]) -> "CommonParams":
        """Build from a sampled set, rejecting names the algorithm does not have."""
        known = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - set(known))
        if unknown:
            raise ValueError(f"{cls.__name__} has no hyperparameter(s) {unknown}; it has {sorted(known)}")
        coerced = {k: tuple(v) if k == "milestones" and v is not None else v for k, v in values.items()}
        return cls(**coerced)


@dataclass(frozen=True)
class FitRecipe:
    """How one call of the training loop optimises: everything the optimiser and schedule need."""

    epochs: int
    lr: float
    batch_size: int
    weight_decay: float
    scheduler: Scheduler
    milestones: tuple[int, ...]
    lr_decay: float
    optimizer: Optimizer = "sgd"
    momentum: float = 0.9

    def replace(self, **changes: Any) -> "FitRecipe":
        return dataclasses.replace(self, **changes)


@dataclass
class TaskData:
    """One task as a learner sees it: its images (float, normalised, on the device) and ordered labels."""

    index: int
    known: int  # classes learnt before this task: labels [0, known) are old
    total: int  # classes seen after this task
    x: Tensor
    y: Tensor
    recipe: FitRecipe  # the first task's fixed recipe, or the sampled one from task 2 on
    epoch_scale: float = 1.0  # smoke runs shrink every epoch count, the algorithms' own included

    def scaled_epochs(self, epochs: int) -> int:
        """An algorithm's own epoch count (fine-tuning, compression...) under the run's epoch scale."""
        return max(1, round(epochs * self.epoch_scale))

    @property
    def new_classes(self) -> list[int]:
        return list(range(self.known, self.total))


class FitFn(Protocol):
    def __call__(self, parameters: Iterable[nn.Parameter], loss_fn: Callable[[Tensor, Tensor], Tensor],
                 x: Tensor, y: Tensor, recipe: FitRecipe, *, augment: bool = True,
                 modules: Iterable[nn.Module] = ()) -> None: ...


class IncrementalLearner:
    """Shared machinery: the network, the memory, distillation targets and the default task loop."""

    Params: ClassVar[type[CommonParams]] = CommonParams
    uses_memory: ClassVar[bool] = True
    # ResNet methods train task 1 with the paper's fixed recipe (Table 3); the pretrained-model methods of
    # section 4.2 (PILOT) train every task with the sampled hyperparameters.
    fixed_first_task: ClassVar[bool] = True
    # The method's own hyperparameters that shape task 1 under the fixed recipe (its network, its first-task
    # loss, its memory): they key the study's shared first-task results. tests/engine/test_first_task.py
    # checks that every other value leaves task 1 bit-identical.
    first_task_hparams: ClassVar[tuple[str, ...]] = ()
    uses_pretrained: ClassVar[bool] = False  # True for the ViT methods: they need --weights and a ViT backbone

    def __init__(self, params: CommonParams, backbone: str, memory_size: int, device: torch.device,
                 weights: str | None = None) -> None:
        self.params = params
        self.backbone_name = backbone
        self.weights = weights
        self.device = device
        self.memory = ExemplarMemory(memory_size if self.uses_memory else 0)
        self.net: nn.Module = self.build_network().to(device)
        self.old_net: nn.Module | None = None
        self.known = 0
        self.total = 0

    # ---- construction ------------------------------------------------------------------------
    def new_backbone(self) -> nn.Module:
        return create_backbone(self.backbone_name, self.weights)

    def build_network(self) -> nn.Module:
        return IncrementalNet(self.new_backbone())

    # ---- the task lifecycle --------------------------------------------------------------------
    def begin_task(self, task: TaskData) -> None:
        self.known, self.total = task.known, task.total
        self.old_net = self.frozen_copy(self.net) if task.known > 0 else None
        self.net.expand(task.total)
        self.net.to(self.device)

    def training_data(self, task: TaskData) -> tuple[Tensor, Tensor]:
        """The task's images plus every exemplar in memory (rehearsal)."""
        mx, my = self.memory.tensors()
        if len(my) == 0:
            return task.x, task.y
        return torch.cat([task.x, mx]), torch.cat([task.y, my])

    def learn_task(self, task: TaskData, fit: FitFn) -> None:
        x, y = self.training_data(task)
        fit(self.net.parameters(), self.loss, x, y, task.recipe, modules=[self.net])

    def loss(self, x: Tensor, y: Tensor) -> Tensor:
        """Cross-entropy over all seen classes; algorithms add their own terms."""
        return F.cross_entropy(self.net(x)["logits"], y)

    def end_task(self, task: TaskData) -> None:
        self.update_memory(task)

    # ---- inference -----------------------------------------------------------------------------
    @torch.no_grad()
    def predict(self, x: Tensor) -> Tensor:
        """Scores over the classes seen so far (argmax is the prediction)."""
        return self.net(x)["logits"][:, : self.total]

    @torch.no_grad()
    def features(self, x: Tensor) -> Tensor:
        return self.net(x)["features"]

    # ---- helpers algorithms share ----------------------------------------------------------------
    def update_memory(self, task: TaskData) -> None:
        was_training = self.net.training
        self.net.eval()
        self.memory.update(task.x, task.y, task.new_classes, task.total, self.batched(self.features))
        self.net.train(was_training)

    def batched(self, fn: Callable[[Tensor], Tensor], batch: int = 256) -> Callable[[Tensor], Tensor]:
        return lambda x: torch.cat([fn(x[i : i + batch]) for i in range(0, len(x), batch)]) if len(x) else fn(x)

    def distilled_cross_entropy(self, x: Tensor, y: Tensor, temperature: float, kd_weight: float) -> Tensor:
        """Cross-entropy plus distillation of the old model on the old classes, as PyCIL's BiC and WA train.

        kd_weight = 0 selects the adaptive rule of BiC (Wu et al. 2019) and WA (Zhao et al. 2020):
        (1 - l) * CE + l * KD with l = old classes / seen classes; otherwise CE + kd_weight * KD."""
        logits = self.net(x)["logits"]
        ce = F.cross_entropy(logits, y)
        if self.old_net is None:
            return ce
        with torch.no_grad():
            old_logits = self.old_net(x)["logits"]
        kd = distillation_loss(logits[:, : self.known], old_logits[:, : self.known], temperature)
        if kd_weight == 0:
            share = self.known / self.total
            return (1 - share) * ce + share * kd
        return ce + kd_weight * kd

    @staticmethod
    def frozen_copy(module: nn.Module) -> nn.Module:
        clone = copy.deepcopy(module).eval()
        for p in clone.parameters():
            p.requires_grad_(False)
        return clone

    def parameter_counts(self) -> tuple[int, int]:
        """(all parameters, trainable parameters) of the model used at inference (paper Figures 6 and 9)."""
        params = list(self.net.parameters())
        return sum(p.numel() for p in params), sum(p.numel() for p in params if p.requires_grad)

    def state_dict(self) -> dict[str, Any]:
        return {"net": self.net.state_dict(), "memory": self.memory.state_dict(), "known": self.known,
                "total": self.total}


def distillation_loss(logits: Tensor, old_logits: Tensor, temperature: float) -> Tensor:
    """Knowledge distillation on the old classes (Hinton et al. 2015), as PyCIL's _KD_loss:
    cross-entropy between softened old and new predictions, averaged over the batch."""
    log_p = F.log_softmax(logits / temperature, dim=1)
    q = F.softmax(old_logits / temperature, dim=1)
    return -(q * log_p).sum(dim=1).mean()


ALGORITHMS: Registry[type[IncrementalLearner]] = Registry("algorithm")
