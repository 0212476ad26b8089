"""What every layout module uses: the Layout entry, LayoutError, and readers of the tree's files whose errors name
the file, what is wrong with it and the fix, on one line."""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Callable

IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp", ".webp"}
CLASS_LISTS = Path(__file__).parent.parent / "class_lists"

Files = list[tuple[Path, int]]  # (image file, class id) of one split
Options = dict  # the `?key=value` options of the dataset's name (split=SEED|FILE, ...)


class LayoutError(ValueError):
    """A tree that is not (or not wholly) one of the layouts: '<file>: <what is wrong>; <the fix>', one line."""


@dataclass(frozen=True)
class Layout:
    """One dataset layout as its authors ship it.

    recognise: True when the root has what only this layout has (tried in registration order; a `fallback`
    layout only when no other matched). classes: the class names, in label order. files: each image file of a
    split ("train" or "test") with its label, read in place; None where the files hold the pixels themselves
    (CIFAR-100's pickles), which its own `scheme` reads. index_files: the files (beside the images) that say which
    image is which class, so the decoded arrays are keyed by them too."""

    name: str
    title: str  # what the authors ship, for messages: "Tiny ImageNet (tiny-imagenet-200.zip)"
    recognise: Callable[[Path], bool]
    classes: Callable[[Path], list[str]]
    files: Callable[[Path, list[str], str, Options], Files] | None = None
    scheme: str = "imagefolder"
    index_files: tuple[str, ...] = ()
    takes_split: bool = False  # ?split=SEED|FILE: the layout ships no split of its own that must be used
    fallback: bool = False


def images(folder: Path) -> list[Path]:
    return sorted(f for f in folder.iterdir() if f.suffix.lower() in IMAGE_SUFFIXES) if folder.is_dir() else []


def subfolders(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.is_dir() and not hidden(p)) if folder.is_dir() else []


def hidden(path: Path) -> bool:
    """Files no dataset ships but unpacking leaves (macOS's .DS_Store, ._* and __MACOSX/)."""
    return path.name.startswith(".") or path.name == "__MACOSX"


def has_images(folder: Path) -> bool:
    return folder.is_dir() and any(f.suffix.lower() in IMAGE_SUFFIXES for f in folder.iterdir())


def need_files(root: Path, names: tuple[str, ...], fix: str) -> None:
    """All of a layout's files are there, checked when its classes are read (before any image is): the message names
    each one that is missing, and only those."""
    missing = [name for name in names if not (root / name).exists()]
    if missing:
        raise LayoutError(f"{root}: lacks {', '.join(missing)}; {fix}")


def numbered_lines(path: Path, fix: str) -> list[tuple[int, str]]:
    """(line number, text) of a text file's non-blank lines; a missing or non-text (garbled) file is a LayoutError
    naming it with `fix`."""
    if not path.is_file():
        raise LayoutError(f"{path}: is missing; {fix}")
    stat = path.stat()
    return list(_lines(path, stat.st_size, stat.st_mtime_ns, fix))


@lru_cache(maxsize=64)
def _lines(path: Path, size: int, modified: int, fix: str) -> tuple[tuple[int, str], ...]:
    """numbered_lines, read once per version of the file: a layout reads its index files for the classes, each
    split and the cache key (ImageNet's 50,000 labels, CUB's 11,788 lines), and a changed file is read again."""
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        raise LayoutError(f"{path}: is not a text file (garbled or binary); {fix}") from None
    if "\x00" in text:
        raise LayoutError(f"{path}: holds binary bytes, not text (garbled); {fix}")
    lines = tuple((n, line.strip()) for n, line in enumerate(text.splitlines(), start=1) if line.strip())
    if not lines:
        raise LayoutError(f"{path}: is empty; {fix}")
    return lines


def need_classes(found: dict[str, int], names: list[str], where: Callable[[str], str], split: str,
                 fix: str) -> None:
    """Every class of `names` has images in this split: a class without any is refused, named by its folder (or
    its name in the index file), never dropped or numbered."""
    for name in names:
        if not found.get(name):
            raise LayoutError(f"{where(name)}: class {name} has no {'training' if split == 'train' else 'test'} "
                              f"images; {fix}")


def labelled_images(labels: Path, rows: list[tuple[int, str, str]], folder: Path, on_disk: dict[str, Path],
                    known: set[str], unknown: str, names: list[str], split: str, fix: str) -> Files:
    """A flat folder's images labelled by an index file's rows (line number, image, class), as ImageNet's and Tiny
    ImageNet's validation folders are: each row names an image on disk and a class of `known` (else `unknown` says
    where it is missing from), each image has one row, none is left without, and each class of `names` keeps
    images. Anything else is one LayoutError naming `labels` and its line, never an image dropped."""
    label = {n: i for i, n in enumerate(names)}
    seen: set[str] = set()
    found: Files = []
    for number, image, wnid in rows:
        if wnid not in known:
            raise LayoutError(f"{labels}: line {number} labels {image} as {wnid}, {unknown}; {fix}")
        if image not in on_disk:
            raise LayoutError(f"{labels}: line {number} labels {image}, which {folder} lacks; {fix}")
        if image in seen:
            raise LayoutError(f"{labels}: line {number} labels {image} a second time; keep one line per image")
        seen.add(image)
        if wnid in label:
            found.append((on_disk[image], label[wnid]))
    unlabelled = sorted(set(on_disk) - seen)
    if unlabelled:
        raise LayoutError(f"{on_disk[unlabelled[0]]}: has no line in {labels} ({len(unlabelled)} images of "
                          f"{folder.name}/ have none; it may be cut short); {fix}")
    need_classes(count_by_class(names, found), names, lambda name: f"{labels} ({name})", split, fix)
    return sorted(found)


def count_by_class(names: list[str], files: Files) -> dict[str, int]:
    counts = {name: 0 for name in names}
    for _, label in files:
        counts[names[label]] += 1
    return counts


def packaged_class_list(name: str) -> Path | None:
    """A class list shipped with gtep (gtep/data/class_lists/NAME.txt), e.g. imagenet100-1."""
    path = CLASS_LISTS / f"{name}.txt"
    return path if "/" not in name and path.exists() else None


def packaged_class_lists() -> list[str]:
    return sorted(p.stem for p in CLASS_LISTS.glob("*.txt"))
