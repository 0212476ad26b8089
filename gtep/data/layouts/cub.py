"""`cub`: CUB_200_2011.tgz as released. ROOT/images/<class>/*.jpg, listed by ROOT/images.txt (`<id> <path>`),
labelled by ROOT/image_class_labels.txt (`<id> <class id>`) with the classes in ROOT/classes.txt
(`<class id> <name>`), split by ROOT/train_test_split.txt (`<id> <1 train | 0 test>`). `?split=SEED` or
`?split=FILE` replaces the dataset's own split by PILOT's (gtep/data/layouts/splits.py).

Recognised by images.txt, image_class_labels.txt or train_test_split.txt (or classes.txt beside images/).
Refused: any of those files missing or garbled, an image listed twice or without its class or split, a class id
classes.txt lacks, a listed image images/ lacks, an image of images/ that images.txt does not list, a class with
no images in a split (named by its name in classes.txt).
"""
from __future__ import annotations

from pathlib import Path

from gtep.data.layouts.base import (
    Files,
    Layout,
    LayoutError,
    Options,
    count_by_class,
    images,
    need_classes,
    need_files,
    numbered_lines,
    subfolders,
)
from gtep.data.layouts.splits import divided

LIST, LABELS, SPLIT, CLASSES = "images.txt", "image_class_labels.txt", "train_test_split.txt", "classes.txt"
FIX = "unpack CUB_200_2011.tgz again (it holds images/, images.txt, image_class_labels.txt, classes.txt and " \
      "train_test_split.txt)"


def recognise(root: Path) -> bool:
    return any((root / n).exists() for n in (LIST, LABELS, SPLIT)) or \
        ((root / CLASSES).exists() and (root / "images").is_dir())


def _table(path: Path) -> dict[str, tuple[int, str]]:
    """id -> (line, value) of a two-column CUB file; a line that is not `<id> <value>` or an id given twice is
    refused."""
    table: dict[str, tuple[int, str]] = {}
    for number, line in numbered_lines(path, FIX):
        key, _, value = line.partition(" ")
        if not key.isdigit() or not value.strip():
            raise LayoutError(f"{path}: line {number} ({line[:60]!r}) is not '<id> <value>'; {FIX}")
        if key in table:
            raise LayoutError(f"{path}: line {number} gives id {key} a second time (line {table[key][0]}); {FIX}")
        table[key] = (number, value.strip())
    return table


def classes(root: Path) -> list[str]:
    need_files(root, (LIST, LABELS, SPLIT, CLASSES, "images"), FIX)
    table = _table(root / CLASSES)
    return [table[k][1] for k in sorted(table, key=int)]


def _class_ids(root: Path) -> dict[str, str]:
    return {k: v for k, (_, v) in _table(root / CLASSES).items()}


def files(root: Path, names: list[str], split: str, options: Options) -> Files:
    listed, labels = _table(root / LIST), _table(root / LABELS)
    class_of = _class_ids(root)
    pairs = []
    for image_id, (number, relative) in listed.items():
        path = root / "images" / relative
        if not path.is_file():
            raise LayoutError(f"{root / LIST}: line {number} lists images/{relative}, which is missing; {FIX}")
        if image_id not in labels:
            raise LayoutError(f"{root / LABELS}: has no line for image {image_id} ({LIST} line {number}; it may be "
                     f"cut short); {FIX}")
        line, class_id = labels[image_id]
        if class_id not in class_of:
            raise LayoutError(f"{root / LABELS}: line {line} gives image {image_id} the class {class_id}, which "
                     f"{root / CLASSES} does not list; {FIX}")
        pairs.append((image_id, path, class_of[class_id]))
    for image_id, (line, _) in labels.items():
        if image_id not in listed:
            raise LayoutError(f"{root / LABELS}: line {line} labels image {image_id}, which {root / LIST} does not "
                     f"list (it may be cut short); {FIX}")
    on_list = {path for _, path, _ in pairs}
    for folder in subfolders(root / "images"):
        for image in images(root / "images" / folder):
            if image not in on_list:
                raise LayoutError(f"{image}: is not listed in {root / LIST} (it may be cut short); {FIX}")
    label = {n: i for i, n in enumerate(names)}
    if "split" in options:
        found = divided(root, names, [(path, c) for _, path, c in pairs], split, options)
    else:
        is_train = _table(root / SPLIT)
        found = []
        for image_id, path, c in pairs:
            if image_id not in is_train:
                raise LayoutError(f"{root / SPLIT}: has no line for image {image_id} (it may be cut short); {FIX}")
            line, flag = is_train[image_id]
            if flag not in ("0", "1"):
                raise LayoutError(f"{root / SPLIT}: line {line} gives image {image_id} the split {flag!r}, not 1 "
                         f"(train) or 0 (test); {FIX}")
            if flag == ("1" if split == "train" else "0") and c in label:
                found.append((path, label[c]))
        found.sort()
    need_classes(count_by_class(names, found), names, lambda name: f"{root / CLASSES} ({name})", split,
                 "give the class images in both splits (or its place in ?split=FILE)")
    return found


LAYOUT = Layout("cub", "CUB-200-2011 (CUB_200_2011: images/ and images.txt)", recognise, classes, files,
                index_files=(LIST, LABELS, SPLIT, CLASSES), takes_split=True)
