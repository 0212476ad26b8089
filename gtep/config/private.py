"""Stores gtep creates are their owner's only: run and users databases hold every study's results and the users'
password hashes, and the usual umask (022) would let every local user of the machine read them, whatever the
server's grants say. Folders gtep makes are 0700, files 0600; what already exists is left as its owner set it.

A study is its owner's too (docs/tracking.md): while its phases run (gtep.api's Ray session), the process runs
under `owner_only()`, umask 077, so whatever it and the Ray it starts write (the output folder, the study folder,
units, checkpoints, first tasks, Ray's storage, results CSVs, events, manifest, logs) is created 0700/0600 by
whichever library writes it, with no chmod after the fact."""
from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

FOLDER_MODE = 0o700
FILE_MODE = 0o600


def private_folder(path: Path) -> Path:
    """`path` and the parents it lacks, made 0700 (a folder that exists keeps its mode)."""
    missing = [p for p in (path, *path.parents) if not p.exists()]
    for folder in reversed(missing):
        folder.mkdir(mode=FOLDER_MODE, exist_ok=True)
        os.chmod(folder, FOLDER_MODE)  # mkdir's mode is masked by the umask
    return path


def private_file(path: Path) -> Path:
    """An empty file made 0600 if there is none (sqlite then keeps the mode, and gives it to its -wal/-shm)."""
    private_folder(path.parent)
    try:
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, FILE_MODE))
        os.chmod(path, FILE_MODE)
    except FileExistsError:
        pass
    return path


OWNER_ONLY_UMASK = 0o077


@contextmanager
def owner_only() -> Iterator[None]:
    """This process's umask with every group and other bit set while the block runs (a stricter one stays as it
    is), then the one it had. Processes started meanwhile (Ray's, when a study starts its own) keep it."""
    previous = os.umask(OWNER_ONLY_UMASK)
    os.umask(previous | OWNER_ONLY_UMASK)
    try:
        yield
    finally:
        os.umask(previous)
