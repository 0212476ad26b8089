"""`classes`: one folder of class folders with no split (ImageNet-R and ImageNet-A as released:
imagenet-r/<wnid>/*.jpg). The split is the user's choice, in the dataset's name: `?split=SEED` holds out a seeded
20% of each class (PILOT's proportions), `?split=FILE` takes PILOT's own lists (gtep/data/layouts/splits.py).

Recognised (last, after every other layout) by class folders holding images. Refused: no ?split=, a class folder
with no images or too few to hold one out (named by its folder), what splits.py refuses of a list.
"""
from __future__ import annotations

from pathlib import Path

from gtep.data.layouts.base import (
    Files,
    Layout,
    LayoutError,
    Options,
    count_by_class,
    has_images,
    images,
    need_classes,
    subfolders,
)
from gtep.data.layouts.splits import divided


def recognise(root: Path) -> bool:
    return any(has_images(root / name) for name in subfolders(root)[:20])


def files(root: Path, names: list[str], split: str, options: Options) -> Files:
    if "split" not in options:
        raise LayoutError(f"{root}: is one folder of class folders with no train/test split (ImageNet-R and "
                 "ImageNet-A as released); add ?split=0 to hold out a seeded 20% of each class, or "
                 "?split=FILE for PILOT's lists")
    for name in names:
        if not images(root / name):
            raise LayoutError(f"{root / name}: class {name} has no images; put its images there, or remove the "
                     "folder")
    found = divided(root, names, [(f, name) for name in names for f in images(root / name)], split, options)
    need_classes(count_by_class(names, found), names, lambda name: str(root / name), split,
                 "a class needs two images or more to hold one out for testing (or its place in ?split=FILE)")
    return found


LAYOUT = Layout("classes", "one folder of class folders (ImageNet-R, ImageNet-A; with ?split=)",
                recognise, subfolders, files, takes_split=True, fallback=True)
