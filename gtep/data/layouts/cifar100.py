"""`cifar100`: cifar-100-python.tar.gz as released (the "python version"): ROOT/meta, ROOT/train and ROOT/test,
Python pickles. meta's fine_label_names (and coarse_label_names) name the classes; train and test hold 'data', rows
of 3072 bytes (1024 red, 1024 green, 1024 blue, each row-major), and 'fine_labels' (and 'coarse_labels').

The files hold the pixels, so the scheme `cifar100:` reads it, not `imagefolder:`. Recognised by a file (not a
folder) named meta, train or test. Refused, naming the file: missing, truncated (the pickle ends early), garbled
(not a pickle, or not CIFAR-100's dictionary), rows that are not 3072 bytes, a label naming no class.
"""
from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np

from gtep.data.layouts.base import Layout, LayoutError

FILES = ("meta", "train", "test")
FIX = "unpack cifar-100-python.tar.gz again (it holds cifar-100-python/meta, train and test)"


def recognise(root: Path) -> bool:
    return any((root / name).is_file() for name in FILES)


def unpickle(root: Path, name: str) -> dict:
    """One of the three pickles as its dictionary; all three must be there (the message names only those missing)."""
    missing = [n for n in FILES if not (root / n).is_file()]
    if missing:
        raise LayoutError(f"{root}: lacks {', '.join(missing)}; {FIX}")
    path = root / name
    try:
        with open(path, "rb") as fh:  # the dataset's own format (Python pickles); a trusted local file
            data = pickle.load(fh, encoding="latin1")
    except Exception as err:  # noqa: BLE001 - a garbled pickle raises whatever its bytes make it raise
        if isinstance(err, EOFError) or "truncated" in str(err):
            raise LayoutError(f"{path}: is truncated (the pickle ends early); {FIX}") from None
        raise LayoutError(f"{path}: is not a readable pickle (garbled: {err.__class__.__name__}); {FIX}") from None
    if not isinstance(data, dict):
        raise LayoutError(f"{path}: holds a {type(data).__name__}, not CIFAR-100's dictionary; {FIX}")
    return data


def classes(root: Path) -> list[str]:
    meta = unpickle(root, "meta")
    names = meta.get("fine_label_names")
    if not isinstance(names, list) or not names:
        raise LayoutError(f"{root / 'meta'}: has no fine_label_names; {FIX}")
    return [str(n) for n in names]


def coarse_groups(root: Path) -> list[str] | None:
    """Each fine class's coarse class (its superclass: `split: {by: group}`, IIRC's `hierarchy: groups`), read from
    the training file's label pairs; None when the files carry no coarse labels for every class."""
    coarse_names = unpickle(root, "meta").get("coarse_label_names")
    if not coarse_names:
        return None
    labels = unpickle(root, "train")
    if "coarse_labels" not in labels or "fine_labels" not in labels:
        return None
    coarse_of = dict(zip(labels["fine_labels"], labels["coarse_labels"]))
    fine = len(classes(root))
    if len(coarse_of) < fine:
        return None
    return [str(coarse_names[coarse_of[c]]) for c in range(fine)]


def arrays(root: Path, split: str) -> tuple[np.ndarray, np.ndarray]:
    """uint8 images N x 32 x 32 x 3 and int64 labels of one split ("train" or "test")."""
    path, batch = root / split, unpickle(root, split)
    if "data" not in batch or "fine_labels" not in batch:
        raise LayoutError(f"{path}: has no 'data' and 'fine_labels' (is it CIFAR-100's python version?); {FIX}")
    data = np.asarray(batch["data"], dtype=np.uint8)
    labels = np.asarray(batch["fine_labels"], dtype=np.int64)
    if data.ndim != 2 or data.shape[1] != 3072 or len(labels) != len(data):
        raise LayoutError(f"{path}: holds data {data.shape} with {len(labels)} labels, not rows of 3072 bytes with "
                 f"one label each; {FIX}")
    names = len(classes(root))
    if len(labels) and (labels.min() < 0 or labels.max() >= names):
        raise LayoutError(f"{path}: has the label {int(labels.max() if labels.max() >= names else labels.min())}, "
                 f"which names no class of meta's {names}; {FIX}")
    x = data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
    return np.ascontiguousarray(x), labels


LAYOUT = Layout("cifar100", "CIFAR-100's python version (cifar-100-python: meta, train, test)", recognise,
                classes, None, scheme="cifar100", index_files=FILES)
