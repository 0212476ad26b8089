"""A trial's S orderings trained as one fused network (horizontal fusion: HFTA, Wang et al., MLSys 2021).

A trial's orderings share every hyperparameter and shape; only the classes each one sees differ. So the engine
runs them in lockstep, each as it runs alone (its own learner, network, exemplar memory, RNG, evaluation and
outcome), and fuses only what costs: every `fit` the S learners reach together is one training loop over one
network with an ordering axis.

How `fit` is fused. The fused fit runs the engine's one epoch loop (gtep/engine/loop.py, run_epochs) with an
ordering axis: it counts each ordering's images and prepares the batches as a plain fit does. Each learner's
tensors (its network's and old network's parameters and buffers) are stacked along a new leading ordering axis,
and the loss of ordering 0's learner runs under `torch.func.vmap` over that
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
torch RNG state swapped in: the result is that of S processes. Each unit is given a FusedFit as its fit mode
(gtep/engine/loop.py, FitMode): its trainer's fits park there; once every ordering is parked or finished, the
parked calls that agree (same recipe, data size, parameter shapes and loss code) are run as one fused fit, any
other alone, and the threads go on. A fit that trains alone in a fused trial (a fit option the fused loop does not
run, no sibling at the same fit, a fusion that failed: out of memory, an op with no batched form, a loss drawing
from torch's global RNG) is said in one line and recorded in the unit's FusedFit.report (the unit's event): a trial
never changes mode silently. A learner opts in with `fuses_orderings = True` and keeps the loss contract written
in gtep/algorithms/base.py; `check_fusable` refuses the others.
"""
from __future__ import annotations

import logging
import threading
from functools import partial
from typing import Any, Callable, ClassVar, Iterable, Sequence, TypeVar

import torch
from torch import Tensor, nn
from torch.func import functional_call, vmap

from gtep.engine.loop import FIT_MODES, DivergedError, FitCall, FitMode, LossFn, run_epochs

T = TypeVar("T")
FUSE_MODES = ("off", "on", "auto")
log = logging.getLogger(__name__)


class FusionRefused(ValueError):
    """A study asked for fused orderings that its learner or its way of running orderings cannot give, or a fit
    that cannot be fused (said in one line; the fit then trains alone, recorded)."""


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

class _Tensors(nn.Module):
    """Every module a loss can read (its learner's modules and the call's), under one root, so that one
    functional_call swaps all of their tensors for an ordering's slice."""

    def __init__(self, modules: Iterable[nn.Module]) -> None:
        super().__init__()
        seen: dict[int, nn.Module] = {}
        for module in modules:
            seen.setdefault(id(module), module)
        self.parts = nn.ModuleList(seen.values())


def _root(call: FitCall) -> _Tensors:
    owned = [v for v in vars(call.owner).values() if isinstance(v, nn.Module)]
    return _Tensors([*call.modules, *owned])


def _code(fn: Callable[..., Any]) -> Any:
    return getattr(getattr(fn, "__func__", fn), "__code__", None)


def unfusable(call: FitCall) -> str | None:
    """Why this call cannot train fused, before it trains; None where it can."""
    options = [o for o in call.options() if o not in FusedFit.supports]
    if options:
        return f"the fused loop does not run {' or '.join(options)}"
    if call.owner is None:
        return "its loss names no learner (only a learner's fits, bound by the engine, fuse)"
    return None


def fusion_key(call: FitCall) -> tuple[Any, ...]:
    """What must agree for calls to fuse: data shape and pipeline, labels, recipe, loss code, trained shapes and the
    trainer's settings."""
    x = call.x
    data: tuple[Any, ...] = (type(x).__name__, tuple(x.shape), str(x.dtype) if isinstance(x, Tensor) else "")
    if hasattr(x, "pixels"):  # stored images: their pipeline must agree
        data = (*data, repr(x.pipeline.spec))
    trainer = call.trainer
    return (data, tuple(call.y.shape), call.recipe, call.augment, _code(call.loss_fn),
            tuple(tuple(p.shape) for p in call.parameters if p.requires_grad), str(trainer.device),
            trainer.precision, trainer.compile_backend, trainer.augment)


def _state(root: nn.Module) -> dict[str, Tensor]:
    return {**dict(root.named_parameters()), **dict(root.named_buffers())}


class FusedStep:
    """The loop's step over S networks stacked along an ordering axis (module docstring): built from the calls (it
    refuses networks that differ), `write_back` gives each network its slice after the loop."""

    def __init__(self, calls: Sequence[FitCall]) -> None:
        roots = [_root(c) for c in calls]
        self.states = [_state(root) for root in roots]
        names = list(self.states[0])
        if any(list(s) != names or any(s[n].shape != self.states[0][n].shape for n in names) for s in self.states):
            raise FusionRefused("the orderings' networks differ in structure")
        trained: list[str] = []
        for s, call in enumerate(calls):
            by_id = {id(t): n for n, t in self.states[s].items()}
            mine = [by_id.get(id(p)) for p in call.parameters if p.requires_grad]
            if any(n is None for n in mine):
                raise FusionRefused("a trained parameter lies outside the learner's modules")
            if s == 0:
                trained = [n for n in mine if n is not None]
            elif mine != trained:
                raise FusionRefused("the orderings train different parameters")
        with torch.no_grad():
            stacked = {n: torch.stack([s[n].detach() for s in self.states]) for n in names}
        self.names, self.stacked = names, stacked
        self.leaves = {n: stacked[n].requires_grad_() for n in trained}
        self.fixed = {n: t for n, t in stacked.items() if n not in self.leaves}
        self.params: list[Tensor] = list(self.leaves.values())
        first = calls[0]
        trainer = first.trainer
        # compile_mode: torch.compile's mode where a caller set one on the trainer (benchmarks/fusion.py: CUDA graphs)
        self._losses = stacked_loss(roots[0], first.loss_fn, trainer.compile_backend,
                                    getattr(trainer, "compile_mode", None))
        self.precision = trainer.precision
        self._checked_rng = False

    def losses(self, xb: Tensor, yb: Tensor) -> Tensor:
        before = None if self._checked_rng else torch.get_rng_state()
        with self.precision.autocast():
            out = self._losses(self.leaves, self.fixed, xb, yb).float()
        if before is not None:  # the loss contract (gtep/algorithms/base.py), checked on the first step
            self._checked_rng = True
            if not torch.equal(before, torch.get_rng_state()):
                raise FusionRefused("the loss draws from torch's global RNG, which a fused fit cannot give each "
                                    "ordering (draw from the trainer's generator instead)")
        return out

    def weight_sums(self) -> Tensor:
        return torch.stack([p.detach().float().abs().flatten(1).sum(1) for p in self.params]).sum(0)

    def write_back(self) -> None:
        """Every ordering's network gets its slice back: weights and statistics alike."""
        with torch.no_grad():
            for s, state in enumerate(self.states):
                for n in self.names:
                    state[n].copy_(self.stacked[n][s])


def fit_fused(mode: FitMode, calls: Sequence[FitCall]) -> list[DivergedError | None]:
    """Train the calls' S networks as one (module docstring); returns, per call, None or the DivergedError its
    ordering ends with, as it would alone. The calls must share fusion_key. Raises FusionRefused (or torch's
    error: out of memory, an op with no batched form) before any network is touched."""
    step = FusedStep(calls)
    errors = run_epochs(mode, calls, step)
    step.write_back()
    return errors


def stacked_loss(template: nn.Module, loss_fn: LossFn, backend: str | None = None,
                 mode: str | None = None) -> Callable[..., Tensor]:
    """(trained, fixed, x, y) with a leading ordering axis -> the S losses: `loss_fn`, which reads the
    modules under `template`, run once over the axis with each ordering's tensors swapped in."""
    def one(trained: dict[str, Tensor], fixed: dict[str, Tensor], x: Tensor, y: Tensor) -> Tensor:
        return _call(template, trained, fixed, loss_fn, x, y)

    fused = vmap(one, in_dims=(0, 0, 0, 0), randomness="different")
    return torch.compile(fused, backend=backend, mode=mode) if backend else fused


def _call(template: nn.Module, trained: dict[str, Tensor], fixed: dict[str, Tensor], loss_fn: LossFn, x: Tensor,
          y: Tensor) -> Tensor:
    """functional_call of the template with the loss as its forward: the tensors are swapped for the call."""
    runner = _LossCall(template, loss_fn)
    prefixed = {f"root.{n}": t for n, t in {**trained, **fixed}.items()}
    return functional_call(runner, prefixed, (x, y))


class _LossCall(nn.Module):
    def __init__(self, root: nn.Module, loss_fn: LossFn) -> None:
        super().__init__()
        self.root = root
        self.loss_fn = loss_fn

    def forward(self, x: Tensor, y: Tensor) -> Tensor:
        return self.loss_fn(x, y)


# ------------------------------------------------------------------------------------------ the fused fit mode

@FIT_MODES.register("fused")
class FusedFit(FitMode):
    """A unit of a fused trial: its fits park until the lockstep runs them with its siblings' (module docstring).
    Made without a lockstep (FusedFit()), it is a unit with no siblings: each fit trains alone, recorded so."""

    name = "fused"
    supports: ClassVar[frozenset[str]] = frozenset()  # on_epoch and plateau read one network between epochs

    def __init__(self, worker: "_Worker | None" = None) -> None:
        self.worker = worker
        self.fused_fits = 0
        self.alone: list[str] = []  # why each fit that trained alone did

    def fit(self, call: FitCall) -> None:
        if self.worker is None:
            self.train_alone(call, "no sibling ordering in this trial")
            return
        self.worker.park(call)

    def train_alone(self, call: FitCall, why: str) -> None:
        self.alone.append(why)
        self.run_plain(call)

    def report(self) -> dict[str, Any]:
        reasons = sorted(set(self.alone))
        return {"mode": self.name, "fused_fits": self.fused_fits, "alone_fits": len(self.alone),
                "alone_why": reasons[:5]}

    @classmethod
    def check(cls, algorithm: type, name: str) -> None:
        """Only a learner that opted in trains fused orderings (check_fusable)."""
        check_fusable(algorithm, name)

    @classmethod
    def run_units(cls, units: Sequence[Callable[[FitMode], T]], names: Sequence[str] = ()) -> list[T]:
        """Run each unit as it would run alone, fusing the fits they reach together (module docstring); their
        results in order. The first unit's error is raised once all have stopped."""
        labels = list(names) or [f"unit {i}" for i in range(len(units))]
        outer_rng = torch.get_rng_state()
        cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
        workers = [_Worker(i, labels[i], outer_rng.clone(), torch.cuda.get_rng_state_all() if cuda else None)
                   for i in range(len(units))]
        for worker, unit in zip(workers, units):
            worker.mode = cls(worker)
            worker.start(partial(unit, worker.mode))
        try:
            while any(w.state != "done" for w in workers):
                for worker in workers:
                    if worker.state == "ready":
                        worker.resume()
                _run_parked([w for w in workers if w.state == "parked"])
        finally:
            torch.set_rng_state(outer_rng)
        for worker in workers:
            worker.thread.join()
            if worker.error is not None:
                raise worker.error
        return [w.result for w in workers]


# ------------------------------------------------------------------------------------------------ the lockstep

class _Worker:
    def __init__(self, index: int, label: str, rng: Tensor, cuda_rng: list[Tensor] | None) -> None:
        self.index, self.label = index, label
        self.state = "ready"  # ready | parked | done
        self.call: FitCall | None = None
        self.mode: FusedFit | None = None
        self.reply: BaseException | None = None
        self.result: Any = None
        self.error: BaseException | None = None
        self.rng, self.cuda_rng = rng, cuda_rng
        self.go, self.yielded = threading.Event(), threading.Event()
        self.thread = threading.Thread(target=self._main, name=f"gtep-ordering-{index}", daemon=True)
        self.target: Callable[[], Any] = lambda: None

    def start(self, target: Callable[[], Any]) -> None:
        self.target = target
        self.thread.start()

    def _main(self) -> None:
        self.go.wait()
        self.go.clear()
        try:
            self.result = self.target()
        except BaseException as err:  # noqa: BLE001 - handed to the driver, which raises it
            self.error = err
        self.state = "done"
        self.yielded.set()

    def park(self, call: FitCall) -> None:
        """A fit of this unit, in its thread: wait until the driver has run it (fused or alone)."""
        self.call, self.state = call, "parked"
        self.yielded.set()
        self.go.wait()
        self.go.clear()
        reply, self.reply, self.call = self.reply, None, None
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


def _mode_of(worker: _Worker) -> FusedFit:
    assert worker.mode is not None
    return worker.mode


def _run_parked(parked: list[_Worker]) -> None:
    groups: dict[Any, list[_Worker]] = {}
    alone: list[tuple[_Worker, str]] = []
    for worker in parked:
        assert worker.call is not None
        why = unfusable(worker.call)
        if why is not None:
            alone.append((worker, why))
        else:
            groups.setdefault(fusion_key(worker.call), []).append(worker)
    for group in groups.values():
        if len(group) == 1:
            alone.append((group[0], "no sibling ordering reached the same fit"))
            continue
        calls = [w.call for w in group if w.call is not None]
        generators = [c.trainer.generator.get_state() for c in calls]
        images = [c.trainer.images_trained for c in calls]
        try:
            replies = fit_fused(_mode_of(group[0]), calls)
        except (ValueError, RuntimeError) as err:
            # refused (networks that differ, a loss drawing from the global RNG), out of memory, an op with no
            # batched form: each trains alone from where it was (its tensors untouched, its generator and count
            # put back), said once here and recorded in each unit's event
            for call, state, count in zip(calls, generators, images):
                call.trainer.generator.set_state(state)
                call.trainer.images_trained = count
            units = ", ".join(w.label for w in group)
            why = f"fusing {units} failed: {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"[:300]
            log.warning("gtep: %s; they train this fit one after another", why)
            alone += [(w, why) for w in group]
            continue
        for worker, reply in zip(group, replies):
            _mode_of(worker).fused_fits += 1
            worker.reply, worker.state = reply, "ready"
    for worker, why in sorted(alone, key=lambda pair: pair[0].index):
        assert worker.call is not None
        worker._enter()  # its fit runs here, with its RNG, as it would in its own thread
        try:
            _mode_of(worker).train_alone(worker.call, why)
        except BaseException as err:  # noqa: BLE001 - raised in the worker's thread
            worker.reply = err
        worker._leave()
        worker.state = "ready"
