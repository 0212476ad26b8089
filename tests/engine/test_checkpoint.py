"""Per-task checkpoints: a run stopped after any task and started again ends with the uninterrupted result."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from gtep.engine.checkpoint import TaskCheckpoint, load_checkpoint, save_checkpoint
from tests.helpers import run_small, run_small_vit


class Stop(Exception):
    """Stands in for a worker that dies after a task's checkpoint was written."""


def stop_after(task_index: int):
    def hook(index, outcome):
        if index == task_index:
            raise Stop
    return hook


def interrupted_then_resumed(run, algorithm: str, tmp_path, stop_at: int):
    path = tmp_path / f"{algorithm}.pt"
    with pytest.raises(Stop):
        run(algorithm, checkpoint=path, on_task_end=stop_after(stop_at))
    assert path.exists()
    return run(algorithm, checkpoint=path)


# One method per kind of state: plain head growth, a per-task bias layer, a growing stack of backbones,
# two-stage boosting/compression, and a prompt pool on a pretrained ViT.
@pytest.mark.parametrize("algorithm", ["replay", "bic", "der", "foster"])
def test_resumed_resnet_run_equals_the_uninterrupted_one(algorithm, tmp_path):
    quick = {"foster": {"compression_epochs": 2}}.get(algorithm, {})
    run = lambda name, **kw: run_small(name, quick, epochs=2, **kw)  # noqa: E731
    whole = run(algorithm)
    resumed = interrupted_then_resumed(run, algorithm, tmp_path, stop_at=1)
    assert resumed.resumed_tasks == 2
    np.testing.assert_array_equal(resumed.acc_matrix, whole.acc_matrix)  # NaN above the diagonal
    assert resumed.metrics == whole.metrics
    assert (resumed.params_total, resumed.params_trainable) == (whole.params_total, whole.params_trainable)


def test_resumed_vit_run_equals_the_uninterrupted_one(tmp_path):
    run = lambda name, **kw: run_small_vit(name, epochs=1, **kw)  # noqa: E731
    whole = run("l2p")
    resumed = interrupted_then_resumed(run, "l2p", tmp_path, stop_at=0)
    assert resumed.resumed_tasks == 1
    np.testing.assert_array_equal(resumed.acc_matrix, whole.acc_matrix)  # NaN above the diagonal


def test_a_checkpoint_of_another_job_is_not_resumed(tmp_path):
    path = tmp_path / "ck.pt"
    with pytest.raises(Stop):
        run_small("replay", epochs=1, checkpoint=path, on_task_end=stop_after(0))
    other = run_small("replay", {"lr": 0.01}, epochs=1, checkpoint=path)
    assert other.resumed_tasks == 0


class Evil:
    def __reduce__(self):
        return (print, ("this must never run",))


def test_checkpoints_load_with_weights_only(tmp_path):
    """A file naming a callable outside the allowlist is refused, not executed."""
    path = tmp_path / "evil.pt"
    save_checkpoint(path, TaskCheckpoint("x", 1, Evil(), {}))
    with pytest.raises(Exception, match="weights_only|Unsupported global"):
        load_checkpoint(path, "x", torch.device("cpu"))


def test_a_checkpoint_naming_a_gtep_module_that_does_not_exist_is_refused_by_the_allowlist(tmp_path, monkeypatch):
    """The modules a file names are imported only to allow their classes; one that does not import is left to
    torch.load's refusal, never an ImportError of its own."""
    import sys
    import types

    module = types.ModuleType("gtep.no_such_module")

    class Thing:
        pass

    Thing.__module__, Thing.__qualname__ = module.__name__, "Thing"
    module.Thing = Thing
    monkeypatch.setitem(sys.modules, module.__name__, module)  # only while the file is written
    path = tmp_path / "gone.pt"
    save_checkpoint(path, TaskCheckpoint("x", 1, Thing(), {}))
    monkeypatch.delitem(sys.modules, module.__name__)
    with pytest.raises(Exception, match="weights_only|Unsupported global") as refused:
        load_checkpoint(path, "x", torch.device("cpu"))
    assert not isinstance(refused.value, ImportError)


def test_a_worker_that_never_built_the_backbone_resumes_a_vit_checkpoint(tmp_path):
    """A resuming Ray worker loads the checkpoint before it builds a learner, so timm's vision_transformer module
    is not imported yet; its classes must still be allowed (the protocol atlas's RanPAC resume was refused)."""
    import subprocess
    import sys

    path = tmp_path / "vit.pt"
    save = ("import torch, timm; from gtep.engine.checkpoint import TaskCheckpoint, save_checkpoint; "
            "vit = timm.create_model('vit_tiny_patch16_224', pretrained=False, img_size=32, patch_size=8, depth=1); "
            f"save_checkpoint(__import__('pathlib').Path({str(path)!r}), TaskCheckpoint('x', 1, vit, {{}}))")
    load = ("import sys, torch; from gtep.engine.checkpoint import load_checkpoint; "
            "assert 'timm.models.vision_transformer' not in sys.modules; "
            f"ck = load_checkpoint(__import__('pathlib').Path({str(path)!r}), 'x', torch.device('cpu')); "
            "print(type(ck.learner).__name__, ck.learner(torch.zeros(1, 3, 32, 32)).shape[1])")
    for code in (save, load):
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["VisionTransformer", "1000"]


def test_a_checkpoint_window_saves_tasks_of_milliseconds_only_once_it_has_passed(tmp_path, monkeypatch):
    """Inside `checkpoints_every(s)` an ordering saves its task checkpoint only once s seconds passed since its last
    one: an interrupted run then restarts from that checkpoint (or from scratch) with the same result."""
    from gtep.engine import checkpoint as module

    clock = [0.0]
    monkeypatch.setattr(module.time, "monotonic", lambda: clock[0])
    saved_after = []

    def tick(index, outcome):  # record whether this task's checkpoint was written; the next task "trains" 4 s
        saved_after.append(path.exists())
        clock[0] += 4.0

    path = tmp_path / "replay.pt"
    with module.checkpoints_every(3.0):
        whole = run_small("replay", {}, epochs=2, checkpoint=path, on_task_end=tick)
    assert saved_after == [False, True, True], "after task 1, 0 s had passed: not due; after task 2, 4 s: due"

    path.unlink(missing_ok=True)
    with module.checkpoints_every(3600.0), pytest.raises(Stop):
        run_small("replay", {}, epochs=2, checkpoint=path, on_task_end=stop_after(1))
    assert not path.exists(), "nothing was due: the run restarts from its first task"
    resumed = run_small("replay", {}, epochs=2, checkpoint=path)
    assert resumed.resumed_tasks == 0 and resumed.metrics == whole.metrics
