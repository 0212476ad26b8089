"""A dataset as distributed, written as one .npz file of uint8 arrays: what `npz:` reads, for the presets and
benchmarks that name such a file (TINYIMAGENET_NPZ). `gtep data prepare` calls it; nothing is downloaded.

Any registered layout can be written (gtep/data/layouts/): the tree is read whole and checked first, so a broken
file is one error and no .npz; the file is written beside DEST and moved into place only when complete.
"""
from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gtep.data.datasets import DatasetError, DatasetSource, resolve_dataset
from gtep.data.layouts import LAYOUTS, LayoutError, locate


@dataclass(frozen=True)
class Prepared:
    path: Path
    classes: int
    train: int
    test: int


def _draw(labels: np.ndarray, per_class: int | None, rng: np.random.Generator) -> np.ndarray:
    """Positions of at most `per_class` images of each class, drawn at random (all, in order, when None)."""
    if per_class is None:
        return np.arange(len(labels))
    keep = [rng.permutation(np.flatnonzero(labels == c))[:per_class] for c in np.unique(labels)]
    return np.sort(np.concatenate(keep))


def _destination(dest: Path, name: str) -> None:
    """DEST must be a file to write: a folder there is refused with the file name to give instead."""
    if dest.is_dir():
        raise DatasetError(f"{dest}: is a folder; give the .npz file to write, e.g. {dest / f'{name}.npz'}")
    if not dest.parent.exists():
        raise DatasetError(f"{dest.parent}: does not exist; create it, or give an .npz path in an existing folder")


def _source(name: str, src: str, size: int) -> tuple[DatasetSource, Path]:
    """The dataset source reading SRC (a root, optionally with ?split=... for a layout that takes one) as the layout
    NAME, and the folder it reads; another layout there is refused naming it."""
    root, _, query = src.partition("?")
    try:
        layout, folder = locate(Path(root).expanduser(), LAYOUTS[name].scheme)
    except LayoutError as err:
        raise DatasetError(str(err)) from None
    if layout.name != name:
        raise DatasetError(f"{folder}: is {layout.title}, not {LAYOUTS[name].title}; run gtep data prepare "
                           f"{layout.name} {src} ...")
    if layout.scheme == "cifar100":
        return resolve_dataset(f"cifar100:{root}"), folder
    options = "&".join(filter(None, [query, f"size={size}"]))
    return resolve_dataset(f"imagefolder:{root}?{options}"), folder


def prepare(name: str, src: str, dest: Path, size: int = 32, train_per_class: int | None = None,
            test_per_class: int | None = None, seed: int = 0) -> Prepared:
    """The layout NAME's tree in `src` as an .npz at `size` px (CIFAR-100 at its own 32): x_train, y_train, x_test,
    y_test, class_names and, for image trees, train_files and test_files; optionally a seeded share of each class.
    Tiny ImageNet adds class_descriptions and wnids (words.txt's first name is its class name)."""
    if name not in LAYOUTS:
        raise DatasetError(f"{name}: is not a dataset layout; choose {', '.join(LAYOUTS)}")
    _destination(dest, name)
    source, folder = _source(name, src, size)
    source.facts  # noqa: B018 - every file listed and every image's header read before any decoding
    images = source.load()
    rng = np.random.default_rng(seed)
    train, test = _draw(images.y_train, train_per_class, rng), _draw(images.y_test, test_per_class, rng)
    arrays = {"x_train": np.asarray(images.x_train[train]), "y_train": images.y_train[train],
              "x_test": np.asarray(images.x_test[test]), "y_test": images.y_test[test],
              "class_names": np.array(images.class_names, dtype=str)}
    layout = LAYOUTS[name]
    if layout.files is not None:
        for split, keep in (("train", train), ("test", test)):
            listed = layout.files(folder, images.class_names, split, source.options)
            arrays[f"{split}_files"] = np.array([str(f.relative_to(folder)) for f, _ in listed], dtype=str)[keep]
    if name == "tinyimagenet":
        words = {}
        if (folder / "words.txt").exists():
            words = dict(line.split("\t", 1) for line in (folder / "words.txt").read_text().splitlines()
                         if "\t" in line)
        descriptions = [words.get(w, w).strip() for w in images.class_names]
        arrays.update(class_names=np.array([d.split(",")[0] for d in descriptions], dtype=str),
                      class_descriptions=np.array(descriptions, dtype=str),
                      wnids=np.array(images.class_names, dtype=str),
                      train_files=np.array([Path(f).name for f in arrays["train_files"]], dtype=str),
                      test_files=np.array([Path(f).name for f in arrays["test_files"]], dtype=str))
    handle, partial = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".partial")
    try:
        with os.fdopen(handle, "wb") as fh:  # np.savez adds .npz to a bare name; an open file keeps the name given
            np.savez(fh, **arrays)
        os.replace(partial, dest)
    finally:
        if os.path.exists(partial):
            os.unlink(partial)
    return Prepared(dest, len(images.class_names), len(train), len(test))


def prepare_tinyimagenet(src: Path, dest: Path, size: int = 32, train_per_class: int | None = None,
                         test_per_class: int | None = None, seed: int = 0) -> Prepared:
    """tiny-imagenet-200/ as the .npz the tinyimagenet presets and benchmarks read (TINYIMAGENET_NPZ)."""
    return prepare("tinyimagenet", str(src), dest, size, train_per_class, test_per_class, seed)
