"""The learner contract every class-incremental algorithm implements, and the parameters all share.

A learner sees tasks one at a time, with labels already mapped to positions in the class ordering, so old
classes are [0, known) and new ones [known, total). The engine drives every learner through the same three
steps, written once here:

    begin_task(task)        take the task's known/total classes; snapshot the old network (methods that
                            distil); grow(task); put the network on the run's device
    learn_task(task, fit)   fit_task(task, fit): the method's training stages
    end_task(task, fit)     update the exemplar memory (methods that keep one); consolidate(task, fit)
    predict(x) -> scores    after end_task, for the test images of every class seen so far

A method overrides only what differs, through these hooks (each documented where it is defined, with what
it must and what it may do; the defaults are plain training with rehearsal):

    build_network()         the network before the first task
    grow(task)              room for the task's new classes: head rows, a backbone, prompts
    trainable_parameters()  what the default fit_task optimises
    training_data(task)     what the default fit_task trains on: the task plus the memory
    loss(x, y)              what the default fit_task minimises
    fit_task(task, fit)     the training stages: by default one fit() of loss() over training_data()
    consolidate(task, fit)  after the memory update: align, calibrate, fine-tune on the memory, freeze
    predict(x)              scores over the classes seen so far
    parameter_counts()      the (all, trainable) parameters the paper's figures count
    herding_batch_size      the batch of the feature extraction behind the memory update

The steps themselves are not hooks: a class that defines begin_task, learn_task, end_task or update_memory
is a TypeError when it is created, so no method can forget the bookkeeping every task needs.

`fit` is the engine's one training loop (optimiser, schedule, batches, augmentation, divergence check); an
algorithm with extra stages (bias correction, class-balanced fine-tuning, compression) calls it again with
its own parameters, data and loss, so no algorithm writes its own loop.

What a learner is told about a task is TaskData and nothing else: the steps read only its index and
known/total, and the hooks what they need of it. Other kinds of task (images with several labels, a stream
to predict before its labels arrive, support sets one at a time) would come as other task data and hooks
of their own, beside these steps, not as changes to them.
"""
from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass
from typing import (
    Any,
    Callable,
    ClassVar,
    Generic,
    Iterable,
    Literal,
    Protocol,
    Self,
    TypeVar,
    cast,
    get_args,
    get_origin,
)

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gtep.algorithms.memory import ExemplarMemory
from gtep.models import Backbone, IncrementalNet, create_backbone
from gtep.registry import Registry

Scheduler = Literal["steplr", "cosine", "constant"]
Optimizer = Literal["sgd", "adam", "adamw"]


@dataclass(frozen=True)
class Range:
    """The values a numeric hyperparameter accepts: from `low` to `high` (None: unbounded), each bound in the range
    unless marked open. A tuple-valued hyperparameter (milestones, prompt layers) applies it to every element."""

    low: float
    high: float | None = None
    low_open: bool = False
    high_open: bool = False

    def __contains__(self, value: object) -> bool:
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value != value:  # NaN: in no range
            return False
        if value < self.low or (self.low_open and value == self.low):
            return False
        return self.high is None or value < self.high or (not self.high_open and value == self.high)

    def __str__(self) -> str:
        if self.high is None:
            return f"{'>' if self.low_open else '>='} {self.low:g}"
        return f"in {'(' if self.low_open else '['}{self.low:g}, {self.high:g}{')' if self.high_open else ']'}"


# The ranges most hyperparameters share: a rate, a temperature or a scale (> 0), a weight or a count that may be
# zero (>= 0), a count of things there must be at least one of (>= 1), a probability or a share ([0, 1]).
POSITIVE = Range(0, low_open=True)
NON_NEGATIVE = Range(0)
AT_LEAST_ONE = Range(1)
PROBABILITY = Range(0, 1)
DROPOUT = Range(0, 1, high_open=True)  # a dropout of 1 drops everything


@dataclass(frozen=True)
class Constraint:
    """A rule that a range cannot say: between two hyperparameters (top_k at most pool_size), or on one beyond its
    range (an even prompt length). `holds` takes the values of `names`, in order; `rule` says the rule and the fix.
    A broken rule's message names every one of `names` with its value, so none is blamed for the other."""

    names: tuple[str, ...]
    holds: Callable[..., bool]
    rule: str

    def problem(self, values: dict[str, Any]) -> str | None:
        given = [values[name] for name in self.names]
        if self.holds(*given):
            return None
        stated = " and ".join(f"{name}={value!r}" for name, value in zip(self.names, given))
        return f"{stated} {'conflict' if len(self.names) > 1 else 'is refused'}: {self.rule}"


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

    # Every numeric hyperparameter's valid values, from what the code does with it; each Params class gives its
    # own fields' (a subclass's entry wins) and tests/preflight/test_param_ranges.py checks that none is left out. The
    # pre-flight pass checks every value of a search space against them (gtep/preflight/checks.py).
    ranges: ClassVar[dict[str, Range]] = {
        "epochs": AT_LEAST_ONE,
        "lr": POSITIVE,
        "milestone_num": AT_LEAST_ONE,
        # 0 would stop training at the first milestone; torch's plateau schedule (IIRC) refuses 1 (use constant)
        "lr_decay": Range(0, 1, low_open=True, high_open=True),
        "batch_size": AT_LEAST_ONE,
        "weight_decay": NON_NEGATIVE,
        "momentum": Range(0, 1, high_open=True),  # 1 never forgets a step: the velocity grows without bound
        "milestones": NON_NEGATIVE,
    }
    # Rules across hyperparameters, checked with the ranges; each Params class adds its own
    constraints: ClassVar[tuple[Constraint, ...]] = ()

    @classmethod
    def tunable(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls) if f.name not in ("milestones",)]

    @classmethod
    def value_ranges(cls) -> dict[str, Range]:
        """The range of every numeric hyperparameter: the `ranges` of each class of the Params' lineage merged."""
        merged: dict[str, Range] = {}
        for klass in reversed(cls.__mro__):
            merged.update(vars(klass).get("ranges", {}))
        return merged

    @classmethod
    def all_constraints(cls) -> list[Constraint]:
        """The `constraints` of each class of the Params' lineage, the base's first."""
        found: list[Constraint] = []
        for klass in reversed(cls.__mro__):
            found += [c for c in vars(klass).get("constraints", ()) if c not in found]
        return found

    @classmethod
    def range_problem(cls, name: str, value: Any) -> str | None:
        """What is wrong with `value` for the hyperparameter `name` beyond its type: a number (or, for a tuple, an
        element) outside the declared range; None if nothing."""
        valid = cls.value_ranges().get(name)
        if valid is None or value is None:
            return None
        for item in value if isinstance(value, (list, tuple)) else (value,):
            if item not in valid:
                return f"{name}={item!r} is outside its range: {name} must be {valid}"
        return None

    def constraint_problem(self) -> str | None:
        """The first rule across hyperparameters these values break (Params.constraints); None if none."""
        values = dataclasses.asdict(self)
        problems = (c.problem(values) for c in self.all_constraints())
        return next((p for p in problems if p is not None), None)

    @classmethod
    def from_mapping(cls, values: dict[str, Any]) -> Self:
        """Build from a sampled set, rejecting names the algorithm does not have and values outside their ranges
        or against its constraints (the pre-flight pass refuses those earlier, naming the search-space file)."""
        known = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - set(known))
        if unknown:
            raise ValueError(f"{cls.__name__} has no hyperparameter(s) {unknown}; it has {sorted(known)}")
        problem = next((p for p in (cls.range_problem(k, v) for k, v in values.items()) if p), None)
        if problem:
            raise ValueError(f"{cls.__name__}: {problem}")
        coerced: dict[str, Any] = {k: tuple(v) if k == "milestones" and v is not None else v for k, v in values.items()}
        params = cls(**coerced)
        problem = params.constraint_problem()
        if problem:
            raise ValueError(f"{cls.__name__}: {problem}")
        return params


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


P = TypeVar("P", bound=CommonParams)
M = TypeVar("M", bound=nn.Module)
T = TypeVar("T")

# The engine's steps: written once below, never overridden (see the module docstring).
ENGINE_STEPS = ("begin_task", "learn_task", "end_task", "update_memory")


class IncrementalLearner(Generic[P]):
    """The engine's steps and shared machinery: the network, the memory, distillation, the default hooks.

    A method subclasses `IncrementalLearner[ItsParams]`: `Params` (the dataclass the sampled values build)
    is taken from that argument, and `self.params` is typed as ItsParams."""

    Params: ClassVar[type[CommonParams]] = CommonParams
    params: P
    uses_memory: ClassVar[bool] = True  # keep herded exemplars, updated after every task, replayed in training
    # Keep a frozen copy of the network as it was before each task (self.old_net, None in the first task),
    # for methods whose loss distils the old model.
    distills: ClassVar[bool] = False
    # ResNet methods train task 1 with the paper's fixed recipe (Table 3); the pretrained-model methods of
    # section 4.2 (PILOT) train every task with the sampled hyperparameters.
    fixed_first_task: ClassVar[bool] = True
    # The engine may train a trial's S orderings of this method as one fused network (compute.fuse_orderings,
    # gtep/engine/fusion.py): set where an equivalence test shows the fused trial gives the S separate runs'
    # results (tests/engine/test_fusion.py). The loss contract of a fused learner, for every loss it gives `fit`
    # (tests/engine/test_fit_modes.py checks each learner that sets it):
    # - it reads the batch, the tensors of the learner's modules (parameters and buffers: each ordering's are
    #   swapped in) and plain values that are equal across a trial's orderings (class counts, the sampled set);
    #   never a tensor attribute that is not a module's parameter or buffer (ordering 0's would serve them all);
    # - it draws nothing from torch's global RNG (no dropout, no torch.rand): the fused fit runs once for all
    #   orderings, with no ordering's global RNG in place; randomness comes from the trainer's generator, which
    #   draws each ordering's batches and augmentation (a fused fit refuses a loss that draws, and trains alone);
    # - it runs under torch.func.vmap: no .item() or data-dependent Python branching on tensors.
    fuses_orderings: ClassVar[bool] = False
    # The method's own hyperparameters that shape task 1 under the fixed recipe (its network, its first-task
    # loss, its memory): they key the study's shared first-task results. tests/engine/test_first_task.py
    # checks that every other value leaves task 1 bit-identical.
    first_task_hparams: ClassVar[tuple[str, ...]] = ()
    uses_pretrained: ClassVar[bool] = False  # True for the ViT methods: they need --weights and a ViT backbone
    # True where the method meta-trains on the classes its weights were pretrained on: the weights must name them
    # (gtep pretrain's metadata, or a pretrain: section), which the pre-flight pass checks
    meta_trains: ClassVar[bool] = False
    # The scenario families' data flows the method can learn from (gtep/protocol/families/): every method here
    # learns single-label tasks of new classes, which class-incremental and few-shot class-incremental are.
    data_flows: ClassVar[frozenset[str]] = frozenset({"class_incremental"})

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        overridden = [name for name in ENGINE_STEPS if name in vars(cls)]
        if overridden:
            raise TypeError(f"{cls.__name__} defines {overridden}: these steps keep the bookkeeping every task "
                            "needs and are not overridden; change the hooks instead (grow, fit_task, "
                            "consolidate...; see gtep/algorithms/base.py)")
        params = _params_argument(cls)
        if params is not None and vars(cls).get("Params", params) is not params:
            raise TypeError(f"{cls.__name__} is typed by {params.__name__} but sets Params = "
                            f"{vars(cls)['Params'].__name__}; give the Params class once, as the generic argument")
        if params is not None:
            cls.Params = params

    def __init__(self, params: P, backbone: str, memory_size: int, device: torch.device,
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

    # ---- the engine's steps, once per task, in this order --------------------------------------------
    def begin_task(self, task: TaskData) -> None:
        """Take the task's classes, snapshot the old network if the method distils, grow, place on the device."""
        self.known, self.total = task.known, task.total
        if self.distills:
            self.old_net = self.frozen_copy(self.net) if task.known > 0 else None
        self.grow(task)
        self.net.to(self.device)

    def learn_task(self, task: TaskData, fit: FitFn) -> None:
        """The method's training stages on this task."""
        self.fit_task(task, fit)

    def end_task(self, task: TaskData, fit: FitFn) -> None:
        """Update the exemplar memory with the trained network, then the method's after-training stages."""
        if self.uses_memory:
            self.update_memory(task)
        self.consolidate(task, fit)

    def update_memory(self, task: TaskData) -> None:
        """Herd the new classes' exemplars on the network's features (in eval mode) and cut the old ones."""
        was_training = self.net.training
        self.net.eval()
        features = self.batched(self.features, self.herding_batch_size)
        self.memory.update(task.x, task.y, task.new_classes, task.total, features)
        self.net.train(was_training)

    # ---- hooks: construction -------------------------------------------------------------------------
    def build_network(self) -> nn.Module:
        """The network before the first task, built once in __init__ under the run's seed and then moved to
        the device. Must be a module whose forward returns a dict with "logits" (the default loss and
        predict read them) and "features" (the memory herds on them), and which grow() can grow; a
        method that replaces those readers may return what they need instead. May read self.params."""
        return IncrementalNet(self.new_backbone())

    def new_backbone(self) -> Backbone:
        """A freshly initialised (or pretrained, with --weights) backbone of the run's architecture."""
        return create_backbone(self.backbone_name, self.weights)

    # ---- hooks: the task ----------------------------------------------------------------------------
    def grow(self, task: TaskData) -> None:
        """Make room for the task's new classes. Called by begin_task after self.known/self.total are set
        (and after self.old_net is snapshot), before the network is moved to the device. Must leave the
        network able to score task.total classes. May add head rows, backbones, prompts or heads that only
        train during this task, and set per-task state. Default: self.net.expand(task.total)."""
        # nn.Module's attribute lookup types `expand` as Tensor | Module; every default-grown net defines it
        expand = cast(Callable[[int], None], self.net.expand)
        expand(task.total)

    def trainable_parameters(self) -> Iterable[nn.Parameter]:
        """What the default fit_task optimises (fit skips those with requires_grad False). Default: all."""
        return self.net.parameters()

    def training_data(self, task: TaskData) -> tuple[Tensor, Tensor]:
        """What the default fit_task trains on: the task's images plus every exemplar in memory (rehearsal)."""
        mx, my = self.memory.tensors()
        if len(my) == 0:
            return task.x, task.y
        return torch.cat([task.x, mx]), torch.cat([task.y, my])

    def loss(self, x: Tensor, y: Tensor) -> Tensor:
        """The default fit_task's loss on one batch: cross-entropy over all seen classes. May add the
        method's terms (distillation, auxiliary heads); must return a scalar."""
        return F.cross_entropy(self.net(x)["logits"], y)

    def fit_task(self, task: TaskData, fit: FitFn) -> None:
        """The method's training stages on the task. Called once per task between begin_task and end_task;
        the memory still holds the exemplars of earlier tasks only. Must train through `fit` (the engine's
        loop: a non-finite loss there ends the ordering as diverged), with task.recipe for the main stage.
        May call fit several times with other parameters, data, losses and recipes (stretched by
        task.scaled_epochs), replace self.net, or train nothing (prototype methods). Default: one fit of
        self.loss over self.training_data(task), optimising self.trainable_parameters()."""
        x, y = self.training_data(task)
        fit(self.trainable_parameters(), self.loss, x, y, task.recipe, modules=[self.net])

    def consolidate(self, task: TaskData, fit: FitFn) -> None:
        """After-training stages. Called by end_task once the memory holds this task's exemplars (methods
        with a memory). May align or calibrate the head, fine-tune on the memory through `fit`, build class
        means, merge or freeze modules. Default: nothing."""

    # ---- hooks: inference ---------------------------------------------------------------------------
    @torch.no_grad()
    def predict(self, x: Tensor) -> Tensor:
        """Scores (batch, classes seen so far) for test images: argmax is the prediction. Called after
        end_task with the network in eval mode. Default: the network's logits over the seen classes."""
        return self.net(x)["logits"][:, : self.total]

    @torch.no_grad()
    def features(self, x: Tensor) -> Tensor:
        return self.net(x)["features"]

    @property
    def herding_batch_size(self) -> int:
        """Images per forward pass when the memory update extracts features (eval mode, no gradient)."""
        return 256

    def parameter_counts(self) -> tuple[int, int]:
        """(all parameters, trainable parameters) of the model used at inference (paper Figures 6 and 9).
        Methods that discard or freeze parts, or keep learnt state outside parameters, count their own."""
        params = list(self.net.parameters())
        return sum(p.numel() for p in params), sum(p.numel() for p in params if p.requires_grad)

    # ---- helpers methods share ----------------------------------------------------------------------
    def batched(self, fn: Callable[[Tensor], Tensor], batch: int = 256) -> Callable[[Tensor], Tensor]:
        return lambda x: torch.cat([fn(x[i : i + batch]) for i in range(0, len(x), batch)]) if len(x) else fn(x)

    def distilled_cross_entropy(self, x: Tensor, y: Tensor, temperature: float, kd_weight: float) -> Tensor:
        """Cross-entropy plus distillation of the old model on the old classes, as PyCIL's BiC and WA train.

        kd_weight = 0 selects the adaptive rule of BiC (Wu et al. 2019) and WA (Zhao et al. 2020):
        (1 - l) * CE + l * KD with l = old classes / seen classes; otherwise CE + kd_weight * KD."""
        if not self.distills:
            raise TypeError(f"{type(self).__name__} distils but does not set `distills = True`: no old network")
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
        return freeze(copy.deepcopy(module).eval())

    def state_dict(self) -> dict[str, Any]:
        return {"net": self.net.state_dict(), "memory": self.memory.state_dict(), "known": self.known,
                "total": self.total}


def _params_argument(cls: type) -> type[CommonParams] | None:
    """The Params class given as `IncrementalLearner[...]` (or a generic subclass's) argument, if any."""
    for base in vars(cls).get("__orig_bases__", ()):
        origin, args = get_origin(base), get_args(base)
        learner = isinstance(origin, type) and issubclass(origin, IncrementalLearner)
        if learner and args and isinstance(args[0], type) and issubclass(args[0], CommonParams):
            return args[0]
    return None


def names_reaching_first_task(algorithm: type[IncrementalLearner], first_task_scheduler: str) -> set[str] | None:
    """The sampled names task 1 depends on, from the config's first_task.scheduler alone; None (all of them) for
    methods that train task 1 with the set. Pure: the engine keys shared first tasks with it, the config checks
    first_task's sets with it."""
    if not algorithm.fixed_first_task:
        return None
    names = {"optimizer", "momentum", *algorithm.first_task_hparams}
    if first_task_scheduler == "sampled":  # the reference code lets the set's scheduler reach task 1
        names.add("scheduler")
    return names


def freeze(module: M) -> M:
    """Stop a module's parameters from training (its BatchNorm statistics are the caller's business)."""
    module.requires_grad_(False)
    return module


def required(value: T | None, what: str) -> T:
    """`value`, which the learner's state at this point guarantees is set (a head that exists while a task
    trains, weights set before they are read); a RuntimeError naming `what` if it is not."""
    if value is None:
        raise RuntimeError(f"{what} is not set at this point")
    return value


def parameter_count(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def distillation_loss(logits: Tensor, old_logits: Tensor, temperature: float) -> Tensor:
    """Knowledge distillation on the old classes (Hinton et al. 2015), as PyCIL's _KD_loss:
    cross-entropy between softened old and new predictions, averaged over the batch."""
    log_p = F.log_softmax(logits / temperature, dim=1)
    q = F.softmax(old_logits / temperature, dim=1)
    return -(q * log_p).sum(dim=1).mean()


# plugins: the gtep.algorithms entry points (gtep.plugins), loaded at the first lookup
ALGORITHMS: Registry[type[IncrementalLearner[Any]]] = Registry("algorithm", group="gtep.algorithms")
