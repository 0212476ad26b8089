"""A content-addressed store of first-task results, shared by every trial of a study.

With the paper's fixed first-task recipe (appendix A.1, Table 3) the model after task 1 depends on the
phase's data, the ordering, the backbone, the algorithm's first-task recipe, the seed and only those
sampled hyperparameters that reach task 1 (the scheduler, when the recipe takes the sampled one; a few
algorithms' own, such as PODNet's proxies). The paper's reference code trains it R x S times per study;
this store trains it once per key and hands the result (the learner, its memory, the RNG states and the
accuracy row of task 1) to every other trial.

Trials on several processes or nodes meet on shared storage: whoever creates `<key>.lock` first (an
O_EXCL create, atomic on local filesystems and NFS) trains; the others wait for `<key>.pt`. The owner
refreshes the lock's mtime while it trains, so a lock whose owner died (a dead pid on this host, or no
heartbeat for `stale_after` seconds) is broken and another trial takes over.
"""
from __future__ import annotations

import dataclasses
import json
import os
import socket
import threading
import time
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

from gtep.engine.checkpoint import TaskCheckpoint, fingerprint, load_checkpoint, save_checkpoint

TRAINED, REUSED, RESUMED = "trained", "reused", "resumed"


def first_task_key(job: Any, dataset: str, reaching_hparams: set[str] | None) -> str:
    """The digest of everything task 1's result depends on. `reaching_hparams` names the sampled values that
    reach task 1; None means all of them do (methods without a fixed first-task recipe)."""
    hparams = dict(job.hparams)
    if reaching_hparams is not None:
        hparams = {k: v for k, v in hparams.items() if k in reaching_hparams}
    spec = dataclasses.asdict(job) | {"hparams": hparams, "dataset": dataset, "stage": "first-task"}
    return fingerprint(spec)


class FirstTaskStore:
    """`<root>/<key>.pt` results and `<key>.lock` claims; see the module docstring."""

    def __init__(self, root: Path, poll: float = 0.5, heartbeat: float = 5.0, stale_after: float = 120.0) -> None:
        self.root = Path(root)
        self.poll, self.heartbeat, self.stale_after = poll, heartbeat, stale_after

    def result_path(self, key: str) -> Path:
        return self.root / f"{key}.pt"

    def lock_path(self, key: str) -> Path:
        return self.root / f"{key}.lock"

    def state(self, key: str) -> str:
        """'ready' (stored), 'claimed' (someone trains it) or 'free': lets a trial pick an ordering it need not
        wait for."""
        if self.result_path(key).exists():
            return "ready"
        return "claimed" if self.lock_path(key).exists() and not self._stale(key) else "free"

    def obtain(self, key: str, train: Callable[[], TaskCheckpoint], device: torch.device
               ) -> tuple[TaskCheckpoint | None, str]:
        """(the stored result, REUSED), or (None, TRAINED) after `train` ran here and its result was stored.

        `train` returns the checkpoint to store, including a diverged first task (status 'diverged'), so
        trials waiting for it do not train it again only to diverge too."""
        self.root.mkdir(parents=True, exist_ok=True)
        while True:
            stored = load_checkpoint(self.result_path(key), key, device)
            if stored is not None:
                return stored, REUSED
            if self._claim(key):
                try:
                    stored = load_checkpoint(self.result_path(key), key, device)  # stored between our look and claim
                    if stored is not None:
                        return stored, REUSED
                    with self._heartbeat(key):
                        result = train()
                    save_checkpoint(self.result_path(key), result)
                    return None, TRAINED
                finally:
                    self._release(key)
            if self._stale(key):
                self._break(key)
            else:
                time.sleep(self.poll)

    # ---- the lock ------------------------------------------------------------------------------------
    def _claim(self, key: str) -> bool:
        try:
            fd = os.open(self.lock_path(key), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "w") as fh:
            json.dump({"host": socket.gethostname(), "pid": os.getpid(), "since": time.time()}, fh)
        return True

    def _release(self, key: str) -> None:
        try:
            os.remove(self.lock_path(key))
        except FileNotFoundError:
            pass

    def _stale(self, key: str) -> bool:
        """The owner is gone: a dead process on this host, or no heartbeat for stale_after seconds."""
        lock = self.lock_path(key)
        try:
            age = time.time() - lock.stat().st_mtime
            owner = json.loads(lock.read_text() or "{}")
        except (FileNotFoundError, json.JSONDecodeError):
            return False  # gone already, or being written right now
        if owner.get("host") == socket.gethostname() and not _alive(int(owner.get("pid", 0))):
            return True
        return age > self.stale_after

    def _break(self, key: str) -> None:
        """Rename first, so two trials breaking the same lock do not remove a fresh claim of a third."""
        graveyard = self.root / f".{key}.stale-{uuid.uuid4().hex[:8]}"
        try:
            os.rename(self.lock_path(key), graveyard)
            os.remove(graveyard)
        except FileNotFoundError:
            pass

    @contextmanager
    def _heartbeat(self, key: str) -> Iterator[None]:
        stop = threading.Event()

        def beat() -> None:
            while not stop.wait(self.heartbeat):
                try:
                    os.utime(self.lock_path(key))
                except FileNotFoundError:
                    return

        thread = threading.Thread(target=beat, name=f"gtep-lock-{key}", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
