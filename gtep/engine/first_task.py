"""A content-addressed store of first-task results, shared by every trial of a study.

With the paper's fixed first-task recipe (appendix A.1, Table 3) the model after task 1 depends on the
phase's data, the ordering, the backbone, the algorithm's first-task recipe, the seed and only those
sampled hyperparameters that reach task 1 (the scheduler, when the recipe takes the sampled one; a few
algorithms' own, such as PODNet's proxies). The paper's reference code trains it R x S times per study;
this store trains it once per key and hands the result (the learner, its memory, the RNG states and the
accuracy row of task 1) to every other trial.

Trials on several processes or nodes meet on shared storage: whoever creates `<key>.lock` first (a hard
link to its fully written claim, atomic on local filesystems and NFS) trains; the others wait for `<key>.pt`.
The owner refreshes the lock's mtime while it trains, so a lock whose owner died (a dead pid on this host, or
no heartbeat for `stale_after` seconds) is broken and another trial takes over. Each claim carries a unique
token: a trial releases, refreshes or breaks only the claim it means, never a fresh one made meanwhile.
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
        return "claimed" if self.lock_path(key).exists() and self._stale_claim(key) is None else "free"

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
            token = self._claim(key)
            if token is not None:
                try:
                    stored = load_checkpoint(self.result_path(key), key, device)  # stored between our look and claim
                    if stored is not None:
                        return stored, REUSED
                    with self._heartbeat(key, token):
                        result = train()
                    save_checkpoint(self.result_path(key), result)
                    return None, TRAINED
                finally:
                    self._release(key, token)
            stale = self._stale_claim(key)
            if stale is not None:
                self._break(key, stale)
            else:
                time.sleep(self.poll)

    # ---- the lock ------------------------------------------------------------------------------------
    # A claim is `<key>.lock` holding {host, pid, since, token}; the token (a uuid4) names one claim, so a
    # trial acts only on the claim it means: its own (release, heartbeat) or the stale one it examined
    # (takeover). POSIX has no compare-and-delete, so whoever removes a claim first moves it aside with a
    # rename (atomic: exactly one mover gets a given file), reads the token of what it moved, and puts back a
    # claim that turns out to be someone else's (a link, which never replaces a claim made meanwhile).
    def _claim(self, key: str) -> str | None:
        """Our claim's token, or None when the key is claimed already. The claim is written in full to a
        file of our own, then linked to `<key>.lock` (atomic, fails if it exists, also on NFS), so a claim is
        never seen half-written: an empty lock could not be told apart from another empty one."""
        token = uuid.uuid4().hex
        draft = self.root / f".{key}.claim-{token}"
        draft.write_text(json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "since": time.time(),
                                     "token": token}))
        try:
            os.link(draft, self.lock_path(key))
        except FileExistsError:
            return None
        finally:
            os.remove(draft)
        return token

    def _owner(self, path: Path) -> dict[str, Any] | None:
        """The claim in `path`; None if there is none. A claim we cannot read (left by an older gtep, which
        wrote the lock after creating it) has no token and is judged by its age alone."""
        try:
            text = path.read_text()
        except FileNotFoundError:
            return None
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            return {}

    def _release(self, key: str, token: str) -> None:
        """Remove our claim; a claim that is not ours any more (ours went stale and was taken over) stays.
        Should a trial checking our claim hold it aside right now, it stays too: it goes stale once we are gone."""
        owner = self._owner(self.lock_path(key))
        if owner is not None and owner.get("token") == token:
            self._remove_if(key, token)

    def _stale_claim(self, key: str) -> dict[str, Any] | None:
        """The claim as we found it if its owner is gone (a dead process on this host, or no heartbeat for
        stale_after seconds); None if the key is free or its claim is alive."""
        lock = self.lock_path(key)
        try:
            age = time.time() - lock.stat().st_mtime
        except FileNotFoundError:
            return None
        owner = self._owner(lock)
        if owner is None:
            return None  # gone meanwhile
        if owner.get("host") == socket.gethostname() and not _alive(int(owner.get("pid", 0))):
            return owner
        return owner if age > self.stale_after else None

    def _break(self, key: str, stale: dict[str, Any]) -> None:
        """Remove the stale claim we examined, and only that one.

        The race this guards: trials A and B both find the same stale claim; A removes it and claims the key
        afresh; B, a moment later, would remove what is at `<key>.lock` by then: A's fresh claim, and train
        too. So B moves the lock aside and compares tokens: it holds A's claim, not the stale one, and puts it
        back. Put back with a link, it can never replace a claim that a third trial made in the instant the
        path was empty; then B drops A's claim, A and the third trial both train (once more than needed, the
        result is the same) and neither's release removes the other's claim."""
        self._remove_if(key, stale.get("token"))

    def _remove_if(self, key: str, token: str | None) -> bool:
        """Remove `<key>.lock` if it holds the claim `token` (None: a claim written without one); True if it did."""
        aside = self.root / f".{key}.aside-{uuid.uuid4().hex}"
        try:
            os.rename(self.lock_path(key), aside)
        except FileNotFoundError:
            return False  # removed by someone else already
        moved = self._owner(aside)
        if moved is not None and moved.get("token") == token:
            os.remove(aside)
            return True
        try:
            os.link(aside, self.lock_path(key))  # someone else's claim: back where it was (same file)
        except FileExistsError:
            pass  # a third trial claimed the key meanwhile: see _break
        os.remove(aside)
        return False

    @contextmanager
    def _heartbeat(self, key: str, token: str) -> Iterator[None]:
        """Refresh our claim's mtime while we train; stop once it holds another claim (ours was taken over)."""
        stop = threading.Event()

        def beat() -> None:
            while not stop.wait(self.heartbeat):
                owner = self._owner(self.lock_path(key))
                if owner is None:
                    continue  # moved aside for a moment by a trial checking it, or removed: look again next beat
                if owner.get("token") != token:
                    return
                try:
                    os.utime(self.lock_path(key))
                except FileNotFoundError:
                    pass

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
