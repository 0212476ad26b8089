"""`split`: train/ and val/ (or test/) folders of class folders (PyCIL's ImageNet-100, PILOT's own downloads of
CUB, ImageNet-R and ImageNet-A).

Recognised by a train/ folder of class folders (after the layouts whose own files say more). Read: the classes are
train/'s folders, each split's images are those folders' files. Refused: no val/ or test/, a class folder with no
images (named by its folder), a test class folder train/ lacks.
"""
from __future__ import annotations

from pathlib import Path

from gtep.data.layouts.base import Files, Layout, LayoutError, Options, count_by_class, images, need_classes, subfolders


def recognise(root: Path) -> bool:
    return bool(subfolders(root / "train"))


def classes(root: Path) -> list[str]:
    return subfolders(root / "train")


def test_folder(root: Path) -> Path:
    for name in ("val", "test"):
        if (root / name).is_dir():
            return root / name
    raise LayoutError(f"{root}/val: is missing (train/ has no val/ or test/ folder of class folders beside it); "
                      "unpack the test split there, one folder per class")


def files(root: Path, names: list[str], split: str, options: Options) -> Files:
    folder = root / "train" if split == "train" else test_folder(root)
    if split == "test":
        known = set(classes(root))
        for name in subfolders(folder):
            if name not in known:
                raise LayoutError(f"{folder / name}: is a class folder train/ does not have; add "
                         f"{root / 'train' / name} or remove it")
    found = [(f, label) for label, name in enumerate(names) for f in images(folder / name)]
    need_classes(count_by_class(names, found), names, lambda name: str(folder / name), split,
                 "put its images in that folder, or leave the class out (?classes=FILE)")
    return found


LAYOUT = Layout("split", "train/ and val/ (or test/) of class folders", recognise, classes, files)
