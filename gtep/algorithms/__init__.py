"""Class-incremental algorithms, one file each, found through the ALGORITHMS registry.

Every module of this package except the shared ones registers itself on import; importing the package
imports them all, so a new algorithm is one new file.
"""
import importlib
import pkgutil

from gtep.algorithms.base import ALGORITHMS, CommonParams, FitRecipe, IncrementalLearner, TaskData

_SHARED = {"base", "memory"}
for _module in sorted(m.name for m in pkgutil.iter_modules(__path__)):
    if _module not in _SHARED and not _module.startswith("_"):
        importlib.import_module(f"{__name__}.{_module}")

__all__ = ["ALGORITHMS", "CommonParams", "FitRecipe", "IncrementalLearner", "TaskData"]
