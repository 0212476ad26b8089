"""The registry of layouts and the one rule that finds a root's layout.

A root is recognised by what only its layout has, the layouts tried in registration order and the `fallback`
(one folder of class folders) last. The folder-above rule holds for every layout: a root that is none of them
but holds exactly one child folder that is (cifar100:~/data for ~/data/cifar-100-python, imagefolder:~/data/cub
for ~/data/cub/CUB_200_2011) is read as that child; its other children (the archive it came from, a README,
hidden files and __MACOSX/) are not datasets and do not count. Two datasets below one root are refused, naming
both: which one is meant is never guessed.
"""
from __future__ import annotations

import os
from pathlib import Path

from gtep.data.layouts.base import Layout, LayoutError, hidden

LAYOUTS: dict[str, Layout] = {}


def register(layout: Layout) -> Layout:
    """Add a layout (one module's LAYOUT); recognition tries layouts in the order they were registered."""
    if layout.name in LAYOUTS:
        raise ValueError(f"layout {layout.name!r} is registered twice")
    LAYOUTS[layout.name] = layout
    return layout


def lookup(name: str) -> Layout:
    if name not in LAYOUTS:
        raise LayoutError(f"{name}: is not a dataset layout; choose {', '.join(LAYOUTS)}")
    return LAYOUTS[name]


def _recognised(root: Path, scheme: str | None) -> Layout | None:
    """The layout `root` itself has, or None; the fallback only when no other layout matched."""
    candidates = [layout for layout in LAYOUTS.values() if scheme is None or layout.scheme == scheme]
    for layout in sorted(candidates, key=lambda entry: entry.fallback):
        if layout.recognise(root):
            return layout
    return None


def locate(root: Path, scheme: str | None = None) -> tuple[Layout, Path]:
    """The layout of `root` (of those read by `scheme`, or any) and the folder to read: the root itself, or its
    one meaningful child folder when that child is a layout and the root is not. A LayoutError says what was
    looked for."""
    if not root.is_dir():
        raise LayoutError(f"{root}: is not a folder; give the folder the dataset was unpacked into")
    layout = _recognised(root, scheme)
    if layout is not None:
        return layout, root
    children = sorted(p for p in root.iterdir() if p.is_dir() and not hidden(p))
    found = [(child, _recognised(child, scheme)) for child in children]
    recognised = [(child, entry) for child, entry in found if entry is not None]
    if len(recognised) == 1:
        child, entry = recognised[0]
        return entry, child
    if len(recognised) > 1:
        names = ", ".join(f"{child.name}/ ({entry.name})" for child, entry in recognised[:4])
        raise LayoutError(f"{root}: holds several datasets ({names}); name the one to read, e.g. {recognised[0][0]}")
    if scheme is None or scheme == "imagefolder":
        other = _recognised(root, None) if scheme else None
        if other is not None:
            raise LayoutError(f"{root}: is {other.title}, which the scheme {other.scheme}: reads; name it "
                              f"{other.scheme}:{root}")
    held = ", ".join(sorted(os.listdir(root))[:8]) or "nothing"
    wanted = [entry for entry in LAYOUTS.values() if scheme is None or entry.scheme == scheme]
    raise LayoutError(f"{root}: is none of the layouts gtep reads (it holds {held}); give the folder of "
                      f"{'; or '.join(entry.title for entry in wanted)} (docs/datasets.md shows each tree)")


def layout_of(root: Path) -> Layout:
    """The layout a root (or its one meaningful child) has; a LayoutError says what was looked for."""
    return locate(root)[0]
