"""A trial's S orderings trained as one fused network (horizontal fusion: HFTA, Wang et al., MLSys 2021).

A trial's orderings share every hyperparameter and shape; only the classes each one sees differ. So the engine
runs them in lockstep, each as it runs alone (its own learner, network, exemplar memory, RNG, evaluation and
outcome), and fuses only what costs: every `fit` the S learners reach together is one training loop over one
network with an ordering axis.

How `fit` is fused. Each learner's tensors (its network's and old network's parameters and buffers) are stacked
along a new leading ordering axis, and the loss of ordering 0's learner runs under `torch.func.vmap` over that
axis with `torch.func.functional_call`: a convolution whose input and weight both carry the axis runs as one
convolution of S groups, a batch norm over S x C channels keeps every ordering's statistics (the running
buffers are stacked, so each ordering's move with its own batches), a linear layer as one batched matmul. The
S losses' sum is differentiated once, and one optimiser steps the stacked parameters: SGD and Adam(W) are
element-wise, so with the shared learning rate, momentum and weight decay each ordering's slice has exactly its
own momentum / moments, as S optimisers would. Each ordering keeps its own batches (its trainer's generator
draws its permutation and augmentation) and its own divergence check. After the loop each learner's tensors
get their slice back, and the learners go on alone: herding, class means, weight aligning and evaluation run on
each learner's own network, so no learner code needs the ordering axis, and none is written twice.

How the lockstep runs. Each ordering runs its whole unit (gtep/engine/flows, or the orchestration's unit with
its files) in a thread of its own, but only one thread runs at a time, in ordering order, each with its own
torch RNG state swapped in: the result is that of S processes. A thread that calls `Trainer.fit` parks there;
once every ordering is parked or finished, the parked calls that agree (same recipe, data size, parameter
shapes and loss code) are run as one fused fit, any other alone, and the threads go on. A learner opts in with
`fuses_orderings = True` (gtep/algorithms/base.py); `check_fusable` refuses the others.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Callable, Iterable, Sequence, TypeVar

import torch
from torch import Tensor, nn
from torch.func import functional_call, vmap

from gtep.engine.loop import (
    BatchSource,
    DivergedError,
    Plateau,
    Trainer,
    make_optimizer,
    make_scheduler,
    parking,
)

T = TypeVar("T")
FUSE_MODES = ("off", "on", "auto")


class FusionRefused(ValueError):
    """A study asked for fused orderings that its learner or its way of running orderings cannot give."""


def check_fusable(algorithm: type, name: str | None = None) -> None:
    """Refuse, in one line, a learner that has not opted in to fused orderings."""
    if not getattr(algorithm, "fuses_orderings", False):
        shown = name or getattr(algorithm, "__name__", str(algorithm))
        raise FusionRefused(f"algorithm {shown!r} does not train fused orderings (its learner does not set "
                            "fuses_orderings = True); set compute.fuse_orderings: off or auto")


def fusion_wanted(mode: str, algorithm: type, device: str, parallel: int = 1) -> bool:
    """Whether a trial's orderings are fused: 'on' always (check_fusable refuses a learner that cannot), 'auto'
    where the learner opts in, the orderings run one after another in the trial's process and the device is a
    GPU (on a CPU the fused network is no faster: docs/speed.md), 'off' never."""
    if mode == "on":
        return True
    if mode == "auto":
        return bool(getattr(algorithm, "fuses_orderings", False)) and parallel <= 1 and device.startswith("cuda")
    return False


# ---------------------------------------------------------------------------------------------- one fused fit

@dataclass
class FitRequest:
    """One ordering's call of Trainer.fit, as the learner made it."""

    trainer: Trainer
    parameters: list[nn.Parameter]
    loss_fn: Callable[[Tensor, Tensor], Tensor]
    x: Any
    y: Tensor
    recipe: Any
    augment: bool = True
    modules: list[nn.Module] = field(default_factory=list)
    on_epoch: Callable[[int], None] | None = None
    plateau: Plateau | None = None

    def run_alone(self) -> None:
        self.trainer.fit(self.parameters, self.loss_fn, self.x, self.y, self.recipe, augment=self.augment,
                         modules=self.modules, on_epoch=self.on_epoch, plateau=self.plateau)


def _owner(fn: Callable[..., Any]) -> Any:
    """The object whose method (or closure over `self`) the loss is: the learner, whose modules it reads."""
    owner = getattr(fn, "__self__", None)
    if owner is not None:
        return owner
    for cell in getattr(fn, "__closure__", None) or ():
        try:
            value = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        if not isinstance(value, (nn.Module, Tensor)) and any(isinstance(v, nn.Module) for v in vars_of(value)):
            return value
    return None


def vars_of(obj: Any) -> list[Any]:
    try:
        return list(vars(obj).values())
    except TypeError:
        return []


def _code(fn: Callable[..., Any]) -> Any:
    return getattr(getattr(fn, "__func__", fn), "__code__", None)


class _Tensors(nn.Module):
    """Every module a loss can read (the learner's modules and fit's), under one root, so that one
    functional_call swaps all of their tensors for an ordering's slice."""

    def __init__(self, modules: Iterable[nn.Module]) -> None:
        super().__init__()
        seen: dict[int, nn.Module] = {}
        for module in modules:
            seen.setdefault(id(module), module)
        self.parts = nn.ModuleList(seen.values())


def _root(request: FitRequest) -> _Tensors | None:
    owner = _owner(request.loss_fn)
    if owner is None:
        return None
    return _Tensors([*request.modules, *(v for v in vars_of(owner) if isinstance(v, nn.Module))])


def fusion_key(request: FitRequest) -> tuple[Any, ...] | None:
    """What must agree for requests to fuse; None where this request cannot (a plateau schedule, a per-epoch hook,
    a loss that is no learner's)."""
    if request.on_epoch is not None or request.plateau is not None or _owner(request.loss_fn) is None:
        return None
    x = request.x
    data: tuple[Any, ...] = (type(x).__name__, tuple(x.shape), str(x.dtype) if isinstance(x, Tensor) else "")
    if hasattr(x, "pixels"):  # stored images: their pipeline must agree
        data = (*data, repr(x.pipeline.spec))
    trainer = request.trainer
    return (data, tuple(request.y.shape), request.recipe, request.augment, _code(request.loss_fn),
            tuple(tuple(p.shape) for p in request.parameters if p.requires_grad), str(trainer.device),
            trainer.precision, trainer.compile_backend, trainer.augment)


def _state(root: nn.Module) -> dict[str, Tensor]:
    return {**dict(root.named_parameters()), **dict(root.named_buffers())}


def fit_fused(requests: Sequence[FitRequest]) -> list[BaseException | None]:
    """Train the requests' S networks as one (module docstring); returns, per request, None or the
    DivergedError its ordering raised alone. The requests must share fusion_key."""
    roots = [_root(r) for r in requests]
    if any(root is None for root in roots):
        raise ValueError("fit_fused: a request's loss belongs to no learner")
    states = [_state(root) for root in roots]  # type: ignore[arg-type]
    names = list(states[0])
    if any(list(s) != names or any(s[n].shape != states[0][n].shape for n in names) for s in states):
        raise ValueError("fit_fused: the orderings' networks differ in structure")
    trained: list[str] = []
    for s, request in enumerate(requests):
        by_id = {id(t): n for n, t in states[s].items()}
        mine = [by_id.get(id(p)) for p in request.parameters if p.requires_grad]
        if any(n is None for n in mine):
            raise ValueError("fit_fused: a trained parameter lies outside the learner's modules")
        if s == 0:
            trained = [n for n in mine if n is not None]
        elif mine != trained:
            raise ValueError("fit_fused: the orderings train different parameters")
    template = roots[0]
    assert template is not None
    for request in requests:
        for module in request.modules:
            module.train()
    with torch.no_grad():
        stacked = {n: torch.stack([s[n].detach() for s in states]) for n in names}
    leaves = {n: stacked[n].requires_grad_() for n in trained}
    fixed = {n: t for n, t in stacked.items() if n not in leaves}
    errors = _fused_loop(requests, template, leaves, fixed)
    with torch.no_grad():  # every ordering's network gets its slice back: weights and statistics alike
        for s, state in enumerate(states):
            for n in names:
                state[n].copy_(stacked[n][s])
    return errors


def stacked_loss(template: nn.Module, loss_fn: Callable[[Tensor, Tensor], Tensor],
                 backend: str | None = None, mode: str | None = None) -> Callable[..., Tensor]:
    """(trained, fixed, x, y) with a leading ordering axis -> the S losses: `loss_fn`, which reads the
    modules under `template`, run once over the axis with each ordering's tensors swapped in."""
    def one(trained: dict[str, Tensor], fixed: dict[str, Tensor], x: Tensor, y: Tensor) -> Tensor:
        return _call(template, trained, fixed, loss_fn, x, y)

    fused = vmap(one, in_dims=(0, 0, 0, 0), randomness="different")
    return torch.compile(fused, backend=backend, mode=mode) if backend else fused


def _call(template: nn.Module, trained: dict[str, Tensor], fixed: dict[str, Tensor],
          loss_fn: Callable[[Tensor, Tensor], Tensor], x: Tensor, y: Tensor) -> Tensor:
    """functional_call of the template with the loss as its forward: the tensors are swapped for the call."""
    runner = _LossCall(template, loss_fn)
    prefixed = {f"root.{n}": t for n, t in {**trained, **fixed}.items()}
    return functional_call(runner, prefixed, (x, y))


class _LossCall(nn.Module):
    def __init__(self, root: nn.Module, loss_fn: Callable[[Tensor, Tensor], Tensor]) -> None:
        super().__init__()
        self.root = root
        self.loss_fn = loss_fn

    def forward(self, x: Tensor, y: Tensor) -> Tensor:
        return self.loss_fn(x, y)


def _fused_loop(requests: Sequence[FitRequest], template: nn.Module, leaves: dict[str, Tensor],
                fixed: dict[str, Tensor]) -> list[BaseException | None]:
    """Trainer.fit's loop, with an ordering axis: each ordering's batches from its own generator."""
    first = requests[0]
    trainer, recipe = first.trainer, first.recipe
    n_orderings = len(requests)
    errors: list[BaseException | None] = [None] * n_orderings
    params = list(leaves.values())
    if not params or len(first.x) == 0 or recipe.epochs < 1:
        return errors
    # compile_mode: torch.compile's mode where a caller set one on the trainer (benchmarks/fusion.py: CUDA graphs)
    losses = stacked_loss(template, first.loss_fn, trainer.compile_backend, getattr(trainer, "compile_mode", None))
    precision = trainer.precision
    optimizer = make_optimizer(params, recipe)  # type: ignore[arg-type]
    scheduler = make_scheduler(optimizer, recipe)
    device = first.y.device
    n, batch = len(first.x), max(1, recipe.batch_size)
    sources = [BatchSource(r.x, r.trainer.generator, r.augment and r.trainer.augment) for r in requests]
    diverged = torch.zeros(n_orderings, dtype=torch.bool)
    for epoch in range(recipe.epochs):
        orders = []
        for request, source in zip(requests, sources):
            orders.append(torch.randperm(n, generator=request.trainer.generator).to(request.x.device))
            source.new_epoch()
        epoch_loss = torch.zeros(n_orderings, device=device)
        for start in range(0, n, batch):
            idx = [order[start : start + batch] for order in orders]
            if len(idx[0]) < 2 and n >= 2:  # BatchNorm cannot train on a single image
                continue
            xb = torch.stack([source.batch(i, start) for source, i in zip(sources, idx)])
            yb = torch.stack([r.y[i] for r, i in zip(requests, idx)])
            with precision.autocast():
                loss = losses(leaves, fixed, xb, yb).float()
            optimizer.zero_grad(set_to_none=True)
            loss.sum().backward()
            optimizer.step()
            epoch_loss = epoch_loss + loss.detach()
        weights = torch.stack([p.detach().float().abs().flatten(1).sum(1) for p in params]).sum(0)
        finite = torch.isfinite(epoch_loss + weights).cpu()
        for s in range(n_orderings):
            if not finite[s] and not diverged[s]:
                diverged[s] = True
                errors[s] = DivergedError(f"non-finite training loss or weights in epoch {epoch + 1}")
        if bool(diverged.all()):
            break
        scheduler.step()
    return errors


# ------------------------------------------------------------------------------------------------ the lockstep

class _Worker:
    def __init__(self, index: int, target: Callable[[], Any], rng: Tensor, cuda_rng: list[Tensor] | None) -> None:
        self.index, self.target = index, target
        self.state = "ready"  # ready | parked | done
        self.request: FitRequest | None = None
        self.reply: BaseException | None = None
        self.result: Any = None
        self.error: BaseException | None = None
        self.rng, self.cuda_rng = rng, cuda_rng
        self.go, self.yielded = threading.Event(), threading.Event()
        self.thread = threading.Thread(target=self._main, name=f"gtep-ordering-{index}", daemon=True)

    def _main(self) -> None:
        parking.fit = self.park_call
        self.go.wait()
        self.go.clear()
        try:
            self.result = self.target()
        except BaseException as err:  # noqa: BLE001 - handed to the driver, which raises it
            self.error = err
        self.state = "done"
        self.yielded.set()

    def park_call(self, trainer: Trainer, parameters: Iterable[nn.Parameter],
                  loss_fn: Callable[[Tensor, Tensor], Tensor], x: Any, y: Tensor, recipe: Any, *,
                  augment: bool = True, modules: Iterable[nn.Module] = (),
                  on_epoch: Callable[[int], None] | None = None, plateau: Plateau | None = None) -> None:
        """Trainer.fit in this thread: park the call until the driver has run it (fused or alone)."""
        self.park(FitRequest(trainer, list(parameters), loss_fn, x, y, recipe, augment, list(modules), on_epoch,
                             plateau))

    def park(self, request: FitRequest) -> None:
        self.request, self.state = request, "parked"
        self.yielded.set()
        self.go.wait()
        self.go.clear()
        reply, self.reply, self.request = self.reply, None, None
        if reply is not None:
            raise reply

    def resume(self) -> None:
        """Run this thread, with its own RNG state, until it parks or finishes."""
        self._enter()
        self.state = "ready"
        self.go.set()
        self.yielded.wait()
        self.yielded.clear()
        self._leave()

    def _enter(self) -> None:
        torch.set_rng_state(self.rng)
        if self.cuda_rng is not None:
            torch.cuda.set_rng_state_all(self.cuda_rng)

    def _leave(self) -> None:
        # CUDA's generators too (a head grown on the GPU draws from them), from the moment CUDA is up: each ordering
        # seeds them itself before it builds its network (OrderingRun.learner), which brings CUDA up in its turn
        self.rng = torch.get_rng_state()
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            self.cuda_rng = torch.cuda.get_rng_state_all()


@dataclass
class LockstepStats:
    """What a lockstep did, for logs and tests: fits fused (with how many orderings each) and fits run alone."""

    fused: list[int] = field(default_factory=list)
    alone: int = 0
    refused: list[str] = field(default_factory=list)  # why a group that agreed still trained alone


def run_in_lockstep(targets: Sequence[Callable[[], T]], stats: LockstepStats | None = None) -> list[T]:
    """Run each target (one ordering's whole unit) as it would run alone, fusing the fits they reach together
    (module docstring); their results in order. The first target's error is raised once all have stopped."""
    stats = stats if stats is not None else LockstepStats()
    outer_rng = torch.get_rng_state()
    cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
    workers = [_Worker(i, t, outer_rng.clone(), torch.cuda.get_rng_state_all() if cuda else None)
               for i, t in enumerate(targets)]
    for worker in workers:
        worker.thread.start()
    try:
        while any(w.state != "done" for w in workers):
            for worker in workers:
                if worker.state == "ready":
                    worker.resume()
            _run_parked([w for w in workers if w.state == "parked"], stats)
    finally:
        torch.set_rng_state(outer_rng)
    for worker in workers:
        worker.thread.join()
        if worker.error is not None:
            raise worker.error
    return [w.result for w in workers]


def _run_parked(parked: list[_Worker], stats: LockstepStats) -> None:
    groups: dict[Any, list[_Worker]] = {}
    alone: list[_Worker] = []
    for worker in parked:
        assert worker.request is not None
        key = fusion_key(worker.request)
        if key is None:
            alone.append(worker)
        else:
            groups.setdefault(key, []).append(worker)
    for group in groups.values():
        if len(group) == 1:
            alone += group
            continue
        requests = [w.request for w in group if w.request is not None]
        generators = [r.trainer.generator.get_state() for r in requests]
        try:
            replies = fit_fused(requests)
        except (ValueError, RuntimeError) as err:
            # the networks differ after all, or an op of the loss has no batched form: each trains alone, from
            # where it was (its tensors were not touched; its generator is put back)
            for request, state in zip(requests, generators):
                request.trainer.generator.set_state(state)
            stats.refused.append(f"{type(err).__name__}: {err}"[:300])
            alone += group
            continue
        stats.fused.append(len(group))
        for worker, reply in zip(group, replies):
            worker.reply, worker.state = reply, "ready"
    for worker in sorted(alone, key=lambda w: w.index):
        assert worker.request is not None
        worker._enter()  # its fit runs here, with its RNG, as it would in its own thread
        try:
            worker.request.run_alone()
        except BaseException as err:  # noqa: BLE001 - raised in the worker's thread
            worker.reply = err
        worker._leave()
        stats.alone += 1
        worker.state = "ready"


def run_fused_orderings(jobs: Sequence[Any], data: Any, on_task_end: Any = None,
                        checkpoints: Sequence[Any] | None = None, first_tasks: Any = None,
                        stats: LockstepStats | None = None) -> list[Any]:
    """A trial's orderings (OrderingJobs that differ only in `ordering`) trained fused: their outcomes, each that
    of run_ordering alone. Refuses, in one line, a learner that has not opted in."""
    from gtep.algorithms import ALGORITHMS
    from gtep.engine.flows import run_ordering

    names = {job.algorithm for job in jobs}
    for name in names:
        check_fusable(ALGORITHMS.get(name), name)
    paths = list(checkpoints) if checkpoints is not None else [None] * len(jobs)
    return run_in_lockstep([partial(run_ordering, job, data, on_task_end, path, first_tasks)
                            for job, path in zip(jobs, paths)], stats)
