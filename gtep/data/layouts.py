"""The folder layouts an `imagefolder:` root may have: the datasets as they are distributed, read in place.

Each layout lists a root's classes and, per split, its image files with their class. The layout is recognised
from the files that only it has; a folder that is almost one of them is refused naming what it lacks.

- `split` (PyCIL's ImageNet-100, PILOT's CUB/ImageNet-R downloads): ROOT/train/<class>/*, ROOT/val|test/<class>/*
- `imagenet` (ILSVRC-2012 as distributed): ROOT/train/<wnid>/*.JPEG and a flat ROOT/val/*.JPEG, labelled by
  ROOT/LOC_val_solution.csv (Kaggle's ImageId,PredictionString) or ROOT/val_labels.txt ("<file> <wnid>" lines)
- `tinyimagenet` (tiny-imagenet-200.zip): ROOT/wnids.txt, ROOT/train/<wnid>/images/*, ROOT/val/images/* labelled by
  ROOT/val/val_annotations.txt; val/ is the test split (Tiny ImageNet's test/ has no labels)
- `cub` (CUB_200_2011.tgz): ROOT/images/<class>/*.jpg with images.txt, image_class_labels.txt, classes.txt and the
  dataset's own train_test_split.txt (or, with `split=SEED`, PILOT's 80/20 proportions, seeded)
- `classes` (ImageNet-R, ImageNet-A as released): ROOT/<class>/*, no split; `split=SEED` holds out a seeded 20% of
  each class for testing (the 80/20 proportions of the split PILOT trains on)
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp", ".webp"}
CLASS_LISTS = Path(__file__).parent / "class_lists"
HOLDOUT = 0.2  # the share of each class a `classes` tree holds out for testing (PILOT's ImageNet-R/A: 80/20)
IMAGENET_VAL_LABELS = ("LOC_val_solution.csv", "val_labels.txt")

Files = list[tuple[Path, int]]


class LayoutError(ValueError):
    """A root that is not one of the layouts, naming what it lacks."""


def _images(folder: Path) -> list[Path]:
    return sorted(f for f in folder.iterdir() if f.suffix.lower() in IMAGE_SUFFIXES) if folder.is_dir() else []


def _subfolders(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.is_dir()) if folder.is_dir() else []


def _has_images(folder: Path) -> bool:
    return folder.is_dir() and any(f.suffix.lower() in IMAGE_SUFFIXES for f in folder.iterdir())


def _need(root: Path, layout: str, *names: str) -> None:
    missing = [n for n in names if not (root / n).exists()]
    if missing:
        raise LayoutError(f"{root} looks like {layout} but lacks {', '.join(missing)}")


@dataclass(frozen=True)
class Layout:
    name: str
    classes: Callable[[Path], list[str]]
    files: Callable[[Path, list[str], str, dict], Files]  # split: "train" or "test"
    # the index files whose size and modification time the decoded arrays also depend on
    index_files: tuple[str, ...] = ()


def _by_class(names: list[str], pairs: list[tuple[Path, str]]) -> Files:
    label = {n: i for i, n in enumerate(names)}
    return sorted((path, label[c]) for path, c in pairs if c in label)


# ---------------------------------------------------------------- split: train/ and val/ (or test/) class folders

def _test_dir(root: Path) -> Path:
    for name in ("val", "test"):
        if (root / name).is_dir():
            return root / name
    raise LayoutError(f"{root} has train/ but no val/ or test/ folder of class folders beside it")


def _split_files(root: Path, names: list[str], split: str, _: dict) -> Files:
    folder = root / "train" if split == "train" else _test_dir(root)
    return [(f, label) for label, name in enumerate(names) for f in _images(folder / name)]


SPLIT = Layout("split", lambda root: _subfolders(root / "train"), _split_files)


# ---------------------------------------------------------------- imagenet: train/ class folders, flat val/

def _imagenet_val_labels(root: Path) -> list[tuple[str, str]]:
    """(file stem, wnid) for every validation image, from the labels file beside train/ and val/."""
    for name in IMAGENET_VAL_LABELS:
        path = root / name
        if path.exists():
            break
    else:
        raise LayoutError(f"{root}/val holds the images directly (ImageNet's flat validation folder) but no labels "
                          f"file is beside it: put {' or '.join(IMAGENET_VAL_LABELS)} in {root}")
    pairs = []
    for line in path.read_text().splitlines()[1 if path.suffix == ".csv" else 0:]:
        fields = line.replace(",", " ").split()
        if len(fields) >= 2:
            pairs.append((Path(fields[0]).stem, fields[1]))
    if not pairs:
        raise LayoutError(f"{path} lists no '<image> <wnid>' pairs")
    return pairs


def _imagenet_files(root: Path, names: list[str], split: str, options: dict) -> Files:
    if split == "train":
        return _split_files(root, names, split, options)
    stems = {f.stem: f for f in _images(root / "val")}
    labels = _imagenet_val_labels(root)
    unknown = [s for s, _ in labels if s not in stems]
    if unknown:
        raise LayoutError(f"{root}/val lacks {len(unknown)} images its labels file names (e.g. {unknown[0]})")
    return _by_class(names, [(stems[s], wnid) for s, wnid in labels])


IMAGENET = Layout("imagenet", lambda root: _subfolders(root / "train"), _imagenet_files, IMAGENET_VAL_LABELS)


# ---------------------------------------------------------------- tinyimagenet: tiny-imagenet-200 as released

def _tiny_classes(root: Path) -> list[str]:
    _need(root, "Tiny ImageNet (val/val_annotations.txt)", "wnids.txt", "train", "val/images")
    return sorted(line.strip() for line in (root / "wnids.txt").read_text().splitlines() if line.strip())


def _tiny_files(root: Path, names: list[str], split: str, _: dict) -> Files:
    if split == "train":
        return [(f, label) for label, name in enumerate(names) for f in _images(root / "train" / name / "images")]
    pairs = [line.split("\t")[:2] for line in (root / "val" / "val_annotations.txt").read_text().splitlines()
             if line.strip()]
    return _by_class(names, [(root / "val" / "images" / file, wnid) for file, wnid in pairs])


TINYIMAGENET = Layout("tinyimagenet", _tiny_classes, _tiny_files, ("wnids.txt", "val/val_annotations.txt"))


# ---------------------------------------------------------------- cub: CUB_200_2011 with its own split files

CUB_FILES = ("images.txt", "image_class_labels.txt", "train_test_split.txt", "classes.txt", "images")


def _table(path: Path) -> dict[str, str]:
    return dict(line.split(maxsplit=1) for line in path.read_text().splitlines() if line.strip())


def _cub_classes(root: Path) -> list[str]:
    _need(root, "CUB-200-2011 (images.txt)", *CUB_FILES)
    table = _table(root / "classes.txt")
    return [table[k].strip() for k in sorted(table, key=int)]


def _cub_files(root: Path, names: list[str], split: str, options: dict) -> Files:
    """The dataset's own split (train_test_split.txt), or with split=SEED a seeded 20% of each class held out, the
    proportions of PILOT's CUB download (9,430 / 2,358 images)."""
    images, is_train = _table(root / "images.txt"), _table(root / "train_test_split.txt")
    labels = _table(root / "image_class_labels.txt")
    classes = _cub_classes(root)
    if "split" in options:
        return _held_out_files(names, [(root / "images" / images[i].strip(), classes[int(labels[i]) - 1])
                                       for i in images], split, int(options["split"]))
    want = "1" if split == "train" else "0"
    pairs = [(root / "images" / images[i].strip(), classes[int(labels[i]) - 1]) for i in images
             if is_train[i].strip() == want]
    return _by_class(names, pairs)


CUB = Layout("cub", _cub_classes, _cub_files, ("images.txt", "train_test_split.txt", "image_class_labels.txt"))


# ---------------------------------------------------------------- classes: one folder of class folders, no split

def held_out(count: int, seed: int, label: int) -> np.ndarray:
    """Which of a class's `count` files (in sorted order) are test images: a seeded HOLDOUT share, at least one
    when the class has two or more, drawn per class so adding a class leaves the others' splits as they were."""
    test = min(count - 1, max(1, round(count * HOLDOUT))) if count > 1 else 0
    chosen = np.zeros(count, dtype=bool)
    chosen[np.random.default_rng([seed, label]).permutation(count)[:test]] = True
    return chosen


def _held_out_files(names: list[str], pairs: list[tuple[Path, str]], split: str, seed: int) -> Files:
    """One split of (file, class) pairs, each class's files (in sorted order) divided by held_out."""
    files: Files = []
    for label, name in enumerate(names):
        images = sorted(f for f, c in pairs if c == name)
        test = held_out(len(images), seed, label)
        files += [(f, label) for f, t in zip(images, test) if t == (split == "test")]
    return files


def _classes_files(root: Path, names: list[str], split: str, options: dict) -> Files:
    if "split" not in options:
        raise LayoutError(f"{root} is one folder of class folders with no train/val split (ImageNet-R and "
                          "ImageNet-A as released): add ?split=0 to hold out a seeded 20% of each class for testing")
    return _held_out_files(names, [(f, name) for name in names for f in _images(root / name)], split,
                           int(options["split"]))


CLASSES = Layout("classes", _subfolders, _classes_files)


def layout_of(root: Path) -> Layout:
    """The layout a root has, recognised by what only it has; a LayoutError says what was looked for."""
    if not root.is_dir():
        raise LayoutError(f"{root} is not a folder")
    if (root / "images.txt").exists() or (root / "train_test_split.txt").exists():
        return CUB
    if (root / "wnids.txt").exists() or (root / "val" / "val_annotations.txt").exists():
        return TINYIMAGENET
    if (root / "train").is_dir():
        return IMAGENET if _has_images(root / "val") else SPLIT
    folders = _subfolders(root)
    if folders and any(_has_images(root / f) for f in folders[:20]):
        return CLASSES
    found = ", ".join(sorted(os.listdir(root))[:8]) or "nothing"
    raise LayoutError(f"{root} has none of the layouts gtep reads (it holds {found}): train/ and val/ (or test/) of "
                      "class folders; ImageNet's train/ with a flat val/ and LOC_val_solution.csv; Tiny ImageNet's "
                      "wnids.txt, train/ and val/val_annotations.txt; CUB-200-2011's images/ and images.txt; or one "
                      "folder of class folders (with ?split=SEED)")


def packaged_class_list(name: str) -> Path | None:
    """A class list shipped with gtep (gtep/data/class_lists/NAME.txt), e.g. imagenet100-1."""
    path = CLASS_LISTS / f"{name}.txt"
    return path if "/" not in name and path.exists() else None


def packaged_class_lists() -> list[str]:
    return sorted(p.stem for p in CLASS_LISTS.glob("*.txt"))
