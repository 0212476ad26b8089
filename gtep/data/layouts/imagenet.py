"""`imagenet`: ILSVRC-2012 as distributed, train/<wnid>/*.JPEG and a flat val/*.JPEG, with the validation labels
in one of the files the dataset ships them in:

- LOC_val_solution.csv (Kaggle's copy: `ImageId,PredictionString`, the wnid first in the prediction string);
- val_labels.txt (`<image> <wnid>` lines);
- the devkit's ILSVRC2012_validation_ground_truth.txt (one ILSVRC2012_ID a line, line k for
  ILSVRC2012_val_0000000k.JPEG), at the root or in ILSVRC2012_devkit_t12/data/, with ILSVRC2012_synsets.txt beside
  it: 1000 lines in ILSVRC2012_ID order, each a wnid (optionally followed by its words, as LOC_synset_mapping.txt's
  lines are). The devkit's own meta.mat holds that order; Kaggle's LOC_synset_mapping.txt is in sorted wnid order,
  which is another order, and is not taken for it.

Recognised by train/ beside a flat val/ (or one of those labels files). Refused: no labels file, a labels line
that is not one, a listed image val/ lacks, a val/ image no line labels, a label naming no train/ class, a class
with no images (named by its wnid).
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
    labelled_images,
    need_classes,
    numbered_lines,
    subfolders,
)

SOLUTION, PAIRS = "LOC_val_solution.csv", "val_labels.txt"
GROUND_TRUTH, SYNSETS = "ILSVRC2012_validation_ground_truth.txt", "ILSVRC2012_synsets.txt"
DEVKIT_DATA = Path("ILSVRC2012_devkit_t12") / "data"
LABEL_FILES = (SOLUTION, PAIRS, GROUND_TRUTH, str(DEVKIT_DATA / GROUND_TRUTH))


def recognise(root: Path) -> bool:
    return (root / "train").is_dir() and (has_images(root / "val") or any((root / n).exists() for n in LABEL_FILES))


def classes(root: Path) -> list[str]:
    return subfolders(root / "train")


def _solution(path: Path) -> list[tuple[int, str, str]]:
    """(line, image stem, wnid) of Kaggle's LOC_val_solution.csv."""
    fix = f"unpack {path.name} again from the Kaggle ImageNet download (ImageId,PredictionString lines)"
    lines = numbered_lines(path, fix)
    if lines[0][1].replace(" ", "") != "ImageId,PredictionString":
        raise LayoutError(f"{path}: line 1 is not the header ImageId,PredictionString; {fix}")
    rows = []
    for number, line in lines[1:]:
        stem, comma, prediction = line.partition(",")
        if not comma or not stem or not prediction.split():
            raise LayoutError(f"{path}: line {number} ({line[:60]!r}) is not ImageId,PredictionString; {fix}")
        rows.append((number, Path(stem).stem, prediction.split()[0]))
    return rows


def _pairs(path: Path) -> list[tuple[int, str, str]]:
    fix = "write one '<image> <wnid>' line per validation image"
    rows = []
    for number, line in numbered_lines(path, fix):
        fields = line.split()
        if len(fields) < 2:
            raise LayoutError(f"{path}: line {number} ({line[:60]!r}) is not '<image> <wnid>'; {fix}")
        rows.append((number, Path(fields[0]).stem, fields[1]))
    return rows


def _ground_truth(path: Path) -> list[tuple[int, str, str]]:
    """The devkit's ground truth: line k is the ILSVRC2012_ID of ILSVRC2012_val_{k:08d}, named by the synsets
    file beside it (line i: the wnid of ILSVRC2012_ID i)."""
    synsets_path = path.parent / SYNSETS
    fix = (f"write {SYNSETS} beside {path.name}: the 1000 wnids in ILSVRC2012_ID order (the devkit's meta.mat "
           "synsets 1..1000), one a line")
    synsets = [line.split()[0] for _, line in numbered_lines(synsets_path, fix)]
    if len(set(synsets)) != len(synsets):
        raise LayoutError(f"{synsets_path}: lists a wnid twice; {fix}")
    fix = "unpack it again from ILSVRC2012_devkit_t12.tar.gz (one ILSVRC2012_ID a line, in validation-image order)"
    rows = []
    for number, line in numbered_lines(path, fix):
        if not line.isdigit() or not 1 <= int(line) <= len(synsets):
            raise LayoutError(f"{path}: line {number} ({line[:30]!r}) is not an ILSVRC2012_ID 1..{len(synsets)} "
                     f"of {synsets_path.name}; {fix}")
        rows.append((number, f"ILSVRC2012_val_{number:08d}", synsets[int(line) - 1]))
    return rows


def labels_file(root: Path) -> Path:
    for name in LABEL_FILES:
        if (root / name).exists():
            return root / name
    raise LayoutError(f"{root}/{SOLUTION}: is missing (val/ holds the images flat and no labels file is beside it); "
                      f"put {SOLUTION} (Kaggle), {PAIRS} ('<image> <wnid>' lines) or the devkit's {GROUND_TRUTH} "
                      f"with {SYNSETS} in {root}")


def validation_files(val: Path, labels: Path, train_classes: list[str], names: list[str]) -> Files:
    """The flat val/ folder's images labelled by `labels`: every image labelled once, every label a class."""
    read = _solution if labels.name == SOLUTION else _ground_truth if labels.name == GROUND_TRUTH else _pairs
    return labelled_images(labels, read(labels), val, {f.stem: f for f in images(val)}, set(train_classes),
                           "a class train/ has no folder of", names, "test",
                           "give the labels file of this copy of ImageNet, or unpack its images again")


def training_files(train: Path, names: list[str]) -> Files:
    found = [(f, label) for label, name in enumerate(names) for f in images(train / name)]
    need_classes(count_by_class(names, found), names, lambda name: str(train / name), "train",
                 "unpack the class's training tar into that folder, or leave the class out (?classes=FILE)")
    return found


def files(root: Path, names: list[str], split: str, options: Options) -> Files:
    if split == "train":
        return training_files(root / "train", names)
    return validation_files(root / "val", labels_file(root), classes(root), names)


LAYOUT = Layout("imagenet", "ILSVRC-2012's train/ with a flat val/ and its labels file", recognise,
                classes, files, index_files=LABEL_FILES)
