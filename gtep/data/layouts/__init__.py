"""The folder layouts of the datasets as their authors ship them, read in place: a registry, one module a layout.

Each module says how its layout is recognised (what only it has), how it is read (its classes, and each split's
image files with their labels) and what each missing or broken file is called: a LayoutError of one line naming
the file, what is wrong and the fix. Adding a layout is one module and its line in REGISTERED below, whose order is
the order in which a root is recognised (the fallback, one folder of class folders, is tried last whatever its
place). A root that is none of them but holds one that is is read as that child (registry.locate).
"""
from gtep.data.layouts import cifar100, classes, cub, imagenet, imagenet_kaggle, split, tinyimagenet
from gtep.data.layouts.base import (
    IMAGE_SUFFIXES,
    Files,
    Layout,
    LayoutError,
    packaged_class_list,
    packaged_class_lists,
)
from gtep.data.layouts.registry import LAYOUTS, layout_of, locate, lookup, register
from gtep.data.layouts.splits import HOLDOUT, held_out

# the most specific first: Tiny ImageNet and ImageNet also have a train/ folder, which is all `split` looks for
REGISTERED = (cifar100.LAYOUT, cub.LAYOUT, tinyimagenet.LAYOUT, imagenet_kaggle.LAYOUT, imagenet.LAYOUT,
              split.LAYOUT, classes.LAYOUT)
for _layout in REGISTERED:
    register(_layout)

CIFAR100, CUB, TINYIMAGENET = cifar100.LAYOUT, cub.LAYOUT, tinyimagenet.LAYOUT
IMAGENET_KAGGLE, IMAGENET, SPLIT, CLASSES = imagenet_kaggle.LAYOUT, imagenet.LAYOUT, split.LAYOUT, classes.LAYOUT

__all__ = ["CIFAR100", "CLASSES", "CUB", "HOLDOUT", "IMAGENET", "IMAGENET_KAGGLE", "IMAGE_SUFFIXES", "LAYOUTS",
           "REGISTERED", "SPLIT", "TINYIMAGENET", "Files", "Layout", "LayoutError", "held_out", "layout_of", "locate",
           "lookup", "packaged_class_list", "packaged_class_lists", "register"]
