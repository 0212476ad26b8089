"""`tinyimagenet`: tiny-imagenet-200.zip as released. ROOT/wnids.txt (the 200 classes), ROOT/train/<wnid>/images/*
(and <wnid>_boxes.txt, not read), ROOT/val/images/* labelled by ROOT/val/val_annotations.txt (`<image>\\t<wnid>\\t
<box>` lines). val/ is the test split: Tiny ImageNet's test/ has no labels and is not read.

Recognised by wnids.txt, val/val_annotations.txt, or train/<wnid>/images/ beside val/images/. Refused: any of those
files missing or garbled, a train/ folder or an annotation naming a wnid wnids.txt lacks, an annotated image val/
lacks, a val/ image no line annotates, a class with no images (named by its wnid).
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
    labelled_images,
    need_classes,
    need_files,
    numbered_lines,
    subfolders,
)

WNIDS, ANNOTATIONS = "wnids.txt", "val/val_annotations.txt"
FIX = "unzip tiny-imagenet-200.zip again (it holds wnids.txt, train/<wnid>/images/, val/images/ and " \
      "val/val_annotations.txt)"


def recognise(root: Path) -> bool:
    if (root / WNIDS).exists() or (root / ANNOTATIONS).exists():
        return True
    return (root / "val" / "images").is_dir() and any((root / "train" / c / "images").is_dir()
                                             for c in subfolders(root / "train")[:5])


def classes(root: Path) -> list[str]:
    """wnids.txt's classes in sorted order; a train/ folder it does not list is refused."""
    need_files(root, (WNIDS, "train", "val/images", ANNOTATIONS), FIX)
    path = root / WNIDS
    wnids = [line.split()[0] for _, line in numbered_lines(path, FIX)]
    if len(set(wnids)) != len(wnids):
        raise LayoutError(f"{path}: lists a wnid twice; {FIX}")
    listed = set(wnids)
    for name in subfolders(root / "train"):
        if name not in listed:
            raise LayoutError(f"{root / 'train' / name}: is a class folder {path} does not list; give the whole "
                     f"{WNIDS} (it may be cut short), or remove the folder")
    return sorted(wnids)


def files(root: Path, names: list[str], split: str, options: Options) -> Files:
    if split == "train":
        found = [(f, label) for label, name in enumerate(names) for f in images(root / "train" / name / "images")]
        need_classes(count_by_class(names, found), names, lambda name: str(root / "train" / name / "images"),
                     split, FIX)
        return found
    path, folder = root / ANNOTATIONS, root / "val" / "images"
    rows = []
    for number, line in numbered_lines(path, FIX):
        fields = line.split("\t") if "\t" in line else line.split()
        if len(fields) < 2:
            raise LayoutError(f"{path}: line {number} ({line[:60]!r}) is not '<image>\\t<wnid>\\t<box>'; {FIX}")
        rows.append((number, fields[0].strip(), fields[1].strip()))
    return labelled_images(path, rows, folder, {f.name: f for f in images(folder)}, set(classes(root)),
                           f"which {root / WNIDS} does not list", names, split, FIX)


LAYOUT = Layout("tinyimagenet", "Tiny ImageNet (tiny-imagenet-200: wnids.txt, train/, val/)", recognise,
                classes, files, index_files=(WNIDS, ANNOTATIONS))
