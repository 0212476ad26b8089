"""How a tree that ships no split gtep must use is divided into train and test: a seeded share of each class
(`?split=SEED`: PILOT's 80/20 proportions), or PILOT's own lists (`?split=FILE`).

PILOT reads ImageNet-R, ImageNet-A and CUB as two ImageFolder trees, data/<name>/train/<class>/<file> and
data/<name>/test/<class>/<file> (LAMDA-PILOT's utils/data.py), shipped as its own download. That download is
read as it is by the `split` layout. For the trees as their authors release them, `?split=FILE` takes the list of
that download's files, one `train/<class>/<file>` or `test/<class>/<file>` per line (`find train test -type f`
run in it), and gives each released image the split PILOT gave it: the same images, not the same proportions.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from gtep.data.layouts.base import Files, LayoutError, Options, numbered_lines

HOLDOUT = 0.2  # the share of each class a seeded split holds out for testing (PILOT's ImageNet-R/A: 80/20)
SPLITS = ("train", "test")


def held_out(count: int, seed: int, label: int) -> np.ndarray:
    """Which of a class's `count` files (in sorted order) are test images: a seeded HOLDOUT share, at least one
    when the class has two or more, drawn per class so adding a class leaves the others' splits as they were."""
    test = min(count - 1, max(1, round(count * HOLDOUT))) if count > 1 else 0
    chosen = np.zeros(count, dtype=bool)
    chosen[np.random.default_rng([seed, label]).permutation(count)[:test]] = True
    return chosen


def divided(root: Path, names: list[str], pairs: list[tuple[Path, str]], split: str, options: Options) -> Files:
    """One split of the tree's (file, class) pairs, by `?split=SEED` or `?split=FILE`."""
    how = options["split"]
    if isinstance(how, int):
        return _seeded(names, pairs, split, how)
    return _listed(root, names, pairs, split, Path(how))


def _seeded(names: list[str], pairs: list[tuple[Path, str]], split: str, seed: int) -> Files:
    files: Files = []
    for label, name in enumerate(names):
        chosen = sorted(f for f, c in pairs if c == name)
        test = held_out(len(chosen), seed, label)
        files += [(f, label) for f, t in zip(chosen, test) if t == (split == "test")]
    return files


def _listed(root: Path, names: list[str], pairs: list[tuple[Path, str]], split: str, listing: Path) -> Files:
    """The split PILOT's list gives each image; an image the list does not place, or a listed file the tree lacks,
    is refused (a study would otherwise compare against PILOT on other images without a word)."""
    fix = ("list PILOT's download, one train/<class>/<file> or test/<class>/<file> a line (cd imagenet-r && find "
           "train test -type f > split.txt), or give ?split=SEED")
    placed: dict[tuple[str, str], str] = {}
    for number, line in numbered_lines(listing, fix):
        parts = Path(line).parts
        if len(parts) < 3 or parts[-3] not in SPLITS:
            raise LayoutError(f"{listing}: line {number} ({line[:60]!r}) is not train/<class>/<file> or "
                              f"test/<class>/<file>; {fix}")
        key = (parts[-2], parts[-1])
        if key in placed:
            raise LayoutError(f"{listing}: line {number} lists {parts[-2]}/{parts[-1]} a second time; list each "
                              "image once, in train/ or in test/")
        placed[key] = parts[-3]
    tree = {(c, f.name): (f, c) for f, c in pairs}
    for (c, name), where in placed.items():
        if (c, name) not in tree:
            raise LayoutError(f"{listing}: lists {where}/{c}/{name}, which {root} does not have; give the list "
                              "made from the same release of the dataset (or remove the line)")
    for (c, name), (f, _) in sorted(tree.items()):
        if (c, name) not in placed and c in names:
            raise LayoutError(f"{f}: is in neither split of {listing}; add it to the list, or remove the image")
    label = {n: i for i, n in enumerate(names)}
    return sorted((f, label[c]) for (c, name), (f, _) in tree.items() if c in label and placed.get((c, name)) == split)
