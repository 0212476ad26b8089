"""`imagenet-kaggle`: ImageNet as Kaggle's "ImageNet Object Localization Challenge" ships it, read in place:
ROOT/ILSVRC/Data/CLS-LOC/train/<wnid>/*.JPEG, ROOT/ILSVRC/Data/CLS-LOC/val/*.JPEG (flat), with
LOC_synset_mapping.txt (the classes, `<wnid> <words>` lines) and LOC_val_solution.csv (the validation labels) at
ROOT. Its test/ is unlabelled and not read.

Recognised by ILSVRC/Data/CLS-LOC/. Refused: either file missing or garbled, a train/ folder the mapping does not
list, and what the `imagenet` layout refuses of the validation labels.
"""
from __future__ import annotations

from pathlib import Path

from gtep.data.layouts import imagenet
from gtep.data.layouts.base import Files, Layout, LayoutError, Options, numbered_lines, subfolders

DATA = Path("ILSVRC") / "Data" / "CLS-LOC"
MAPPING = "LOC_synset_mapping.txt"


def recognise(root: Path) -> bool:
    return (root / DATA).is_dir()


def classes(root: Path) -> list[str]:
    """The mapping's wnids in its order (sorted, as Kaggle ships it); a train/ folder it lacks is refused."""
    path = root / MAPPING
    fix = f"unpack {MAPPING} again from the Kaggle download ('<wnid> <words>' lines) into {root}"
    wnids = [line.split()[0] for _, line in numbered_lines(path, fix)]
    if len(set(wnids)) != len(wnids):
        raise LayoutError(f"{path}: lists a wnid twice; {fix}")
    listed = set(wnids)
    for name in subfolders(root / DATA / "train"):
        if name not in listed:
            raise LayoutError(f"{root / DATA / 'train' / name}: is a class folder {path} does not list; give the "
                     f"whole {MAPPING} (it may be cut short), or remove the folder")
    return wnids


def files(root: Path, names: list[str], split: str, options: Options) -> Files:
    if split == "train":
        return imagenet.training_files(root / DATA / "train", names)
    return imagenet.validation_files(root / DATA / "val", root / imagenet.SOLUTION, classes(root), names)


LAYOUT = Layout("imagenet-kaggle", "Kaggle's ImageNet (ILSVRC/Data/CLS-LOC/ with LOC_val_solution.csv)",
                recognise, classes, files, index_files=(imagenet.SOLUTION, MAPPING))
