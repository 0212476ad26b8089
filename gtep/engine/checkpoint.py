"""Per-task checkpoints of one ordering run: the learner, the RNG states and the accuracy rows so far.

A learner's structure grows with the tasks (heads, backbones, bias layers, adapters), so the whole learner
object is saved rather than a state dict that would need the structure rebuilt first. Loading stays
`weights_only=True`: the unpickler builds only tensors, plain containers and the classes on an allowlist,
which is every class defined in gtep itself, torch.nn, timm and the plugins' modules (gtep.plugins: the
modules of $GTEP_PLUGINS, and the packages of the gtep.* entry points of installed distributions, e.g. my_lab
for `my_lab.methods`). It never runs a callable named by the file.
"""
from __future__ import annotations

import hashlib
import importlib
import inspect
import json
import os
import sys
import tempfile
import time
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, cast

import numpy as np
import torch

from gtep.plugins import plugin_packages

# Classes from these modules may be rebuilt by a checkpoint; nothing else may.
SAFE_MODULE_PREFIXES = ("gtep.", "torch.nn.modules.", "torch.nn.parameter", "timm.layers.", "timm.models.")


def fingerprint(spec: Any) -> str:
    """A digest of everything a run's result depends on: a checkpoint of another job is never resumed."""
    payload = asdict(spec) if hasattr(spec, "__dataclass_fields__") else spec
    text = json.dumps(payload, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _is_safe_module(name: str, plugins: list[str]) -> bool:
    """gtep, torch.nn and timm, plus the plugins' modules (gtep.plugins.plugin_packages: $GTEP_PLUGINS and the
    entry points' packages): the user already chose to run their code, so rebuilding their classes trusts
    nothing new."""
    return name.startswith(SAFE_MODULE_PREFIXES) or any(name == p or name.startswith(f"{p}.") for p in plugins)


def _safe_classes() -> list[Callable[..., Any] | tuple[Callable[..., Any], str]]:
    """The classes a checkpoint may rebuild, typed as torch.serialization.safe_globals takes them."""
    from gtep.algorithms import ALGORITHMS
    from gtep.models import BACKBONES

    # the plugins a learner's classes come from are imported (read at a registry's first lookup)
    ALGORITHMS.names()
    BACKBONES.names()
    classes: list[Callable[..., Any] | tuple[Callable[..., Any], str]] = []
    plugins = plugin_packages()
    for name, module in list(sys.modules.items()):
        if module is None or not _is_safe_module(name, plugins):
            continue
        for _, obj in inspect.getmembers(module, inspect.isclass):
            if getattr(obj, "__module__", "") == name:
                classes.append(obj)
    return classes


def _import_modules_named_by(path: Path) -> None:
    """Import the allowlisted modules whose classes the file names: _safe_classes lists only imported modules, and a
    worker resuming a run has not built its learner yet, so a ViT learner's timm.models.vision_transformer (imported
    when the backbone is first built) would be missing from the allowlist and the resume refused."""
    plugins = plugin_packages()
    for name in torch.serialization.get_unsafe_globals_in_checkpoint(path):
        module = name.rpartition(".")[0]
        if module and module not in sys.modules and _is_safe_module(module, plugins):
            try:
                importlib.import_module(module)
            except ImportError:  # a nested class's "module.Outer", or no such module: torch.load then refuses it
                continue


def rng_state(generator: torch.Generator) -> dict[str, Any]:
    # the legacy tuple (the default): ("MT19937", key, pos, has_gauss, cached_gaussian)
    numpy_state = cast(tuple[str, np.ndarray, int, int, float], np.random.get_state())
    state = {"torch": torch.get_rng_state(), "generator": generator.get_state(),
             # numpy's MT19937 key as a tensor: numpy arrays are not on weights_only's allowlist
             "numpy": torch.from_numpy(numpy_state[1].astype(np.int64)),
             "numpy_pos": int(numpy_state[2])}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any], generator: torch.Generator) -> None:
    # A checkpoint loaded onto a GPU (map_location) brings its RNG states there too; the setters take
    # CPU byte tensors only, so each state comes back to the host first.
    torch.set_rng_state(state["torch"].cpu())
    generator.set_state(state["generator"].cpu())
    np.random.set_state(("MT19937", state["numpy"].cpu().numpy().astype(np.uint32), state["numpy_pos"], 0, 0.0))
    if "cuda" in state and torch.cuda.is_available():
        saved = [s.cpu() for s in state["cuda"]][: torch.cuda.device_count()]  # a node may have fewer GPUs
        for index, device_state in enumerate(saved):
            torch.cuda.set_rng_state(device_state, index)


@dataclass
class TaskCheckpoint:
    """What an ordering run needs to continue after task `tasks_done` as if it had never stopped."""

    fingerprint: str
    tasks_done: int
    learner: Any
    rng: dict[str, Any]
    acc_matrix: list[list[float]] = field(default_factory=list)
    test_counts: list[int] = field(default_factory=list)
    task_seconds: list[float] = field(default_factory=list)
    status: str = "finished"  # "diverged": the tasks after tasks_done never ran (a stored first task can be)
    message: str = ""
    first_task: str = ""  # how task 1 came about: trained, reused (first-task store) or resumed


# Seconds of training between two per-task checkpoints of an ordering: 0 saves after every task (the engine's
# default); a trial sets it from TrialJob.checkpoint_every_seconds. A task that trains for longer is always saved.
_every_seconds: ContextVar[float] = ContextVar("checkpoint_every_seconds", default=0.0)


@contextmanager
def checkpoints_every(seconds: float) -> Iterator[None]:
    """Inside, an ordering saves its per-task checkpoint only once `seconds` have passed since its last one (or its
    start): a torch.save after every task of tasks that train for milliseconds cost more than the tasks."""
    token = _every_seconds.set(max(0.0, seconds))
    try:
        yield
    finally:
        _every_seconds.reset(token)


class CheckpointClock:
    """Whether an ordering's next per-task checkpoint is due (see checkpoints_every)."""

    def __init__(self) -> None:
        self.every_seconds = _every_seconds.get()
        self.last = time.monotonic()

    def due(self) -> bool:
        return time.monotonic() - self.last >= self.every_seconds

    def saved(self) -> None:
        self.last = time.monotonic()


def save_checkpoint(path: Path, checkpoint: TaskCheckpoint) -> None:
    """Atomic: a worker killed while writing leaves the previous checkpoint in place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    os.close(fd)
    try:
        torch.save(asdict(checkpoint) | {"learner": checkpoint.learner}, tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def load_checkpoint(path: Path, expected_fingerprint: str, device: torch.device) -> TaskCheckpoint | None:
    """The checkpoint at `path` if it belongs to this job; None if there is none or it is another job's."""
    if not path.exists():
        return None
    _import_modules_named_by(path)
    with torch.serialization.safe_globals(_safe_classes()):
        data = torch.load(path, map_location=device, weights_only=True)
    if data.get("fingerprint") != expected_fingerprint:
        return None
    checkpoint = TaskCheckpoint(**data)
    checkpoint.learner.device = device
    return checkpoint
