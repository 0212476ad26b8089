"""A dataset as distributed, written as one .npz file of uint8 arrays: what `npz:` reads, for the presets and
benchmarks that name such a file (TINYIMAGENET_NPZ). `gtep data prepare` calls it; nothing is downloaded."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gtep.data.datasets import DatasetError, resolve_dataset
from gtep.data.layouts import TINYIMAGENET, LayoutError, layout_of


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


def prepare_tinyimagenet(src: Path, dest: Path, size: int = 32, train_per_class: int | None = None,
                         test_per_class: int | None = None, seed: int = 0) -> Prepared:
    """tiny-imagenet-200/ (wnids.txt, train/<wnid>/images, val/ with val_annotations.txt) as an .npz at `size` px:
    x_train, y_train, x_test (its val/ images), y_test, class_names (words.txt's first name), class_descriptions,
    wnids, train_files and test_files; classes in sorted wnid order, optionally a seeded share of each class."""
    try:
        layout = layout_of(src)
    except LayoutError as err:
        raise DatasetError(str(err)) from None
    if layout is not TINYIMAGENET:
        raise DatasetError(f"{src} is not Tiny ImageNet as released (wnids.txt, train/<wnid>/images, "
                           "val/val_annotations.txt)")
    source = resolve_dataset(f"imagefolder:{src}?size={size}")
    images = source.load()
    words = {}
    if (src / "words.txt").exists():
        words = dict(line.split("\t", 1) for line in (src / "words.txt").read_text().splitlines() if "\t" in line)
    wnids = images.class_names
    descriptions = [words.get(w, w).strip() for w in wnids]
    files = {split: [f.name for f, _ in TINYIMAGENET.files(src, wnids, split, {})] for split in ("train", "test")}
    rng = np.random.default_rng(seed)
    train, test = _draw(images.y_train, train_per_class, rng), _draw(images.y_test, test_per_class, rng)
    dest.parent.mkdir(parents=True, exist_ok=True)
    with open(dest, "wb") as fh:  # np.savez adds .npz to a bare name; an open file keeps the name given
        np.savez(fh, x_train=np.asarray(images.x_train[train]), y_train=images.y_train[train],
                 x_test=np.asarray(images.x_test[test]), y_test=images.y_test[test],
                 class_names=np.array([d.split(",")[0] for d in descriptions], dtype=str),
                 class_descriptions=np.array(descriptions, dtype=str), wnids=np.array(wnids, dtype=str),
                 train_files=np.array(files["train"], dtype=str)[train],
                 test_files=np.array(files["test"], dtype=str)[test])
    return Prepared(dest, len(wnids), len(train), len(test))


PREPARERS = {"tinyimagenet": prepare_tinyimagenet}
