"""Class-incremental algorithms, one file each, found through the ALGORITHMS registry.

Every module of this package except the shared ones registers itself on import; importing the package
imports them all, so a new algorithm is one new file.

Algorithms from outside the package are plugins: after the built-ins, the modules named in the environment
variable GTEP_PLUGINS (comma-separated importable module names, e.g. `GTEP_PLUGINS=my_lab.cl_methods`) are
imported, and they register themselves with `@ALGORITHMS.register(...)` as the built-ins do. The variable
must be set where every process runs (the driver and Ray's workers inherit it from the shell that starts
Ray), and the modules must be importable there (installed, or on PYTHONPATH).
"""
import importlib
import os
import pkgutil

from gtep.algorithms.base import ALGORITHMS, CommonParams, FitRecipe, IncrementalLearner, TaskData

PLUGINS_ENV = "GTEP_PLUGINS"

_SHARED = {"base", "memory"}
for _module in sorted(m.name for m in pkgutil.iter_modules(__path__)):
    if _module not in _SHARED and not _module.startswith("_"):
        importlib.import_module(f"{__name__}.{_module}")


def import_plugins(names: str | None = None) -> list[str]:
    """Import the plugin modules named in `names` (default: $GTEP_PLUGINS); a module that cannot be imported
    is an ImportError naming the variable and the module. Importing one twice is a no-op (sys.modules)."""
    spec = os.environ.get(PLUGINS_ENV, "") if names is None else names
    modules = [name.strip() for name in spec.split(",") if name.strip()]
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as err:  # noqa: BLE001 - a missing module or one that fails while importing
            raise ImportError(f"{PLUGINS_ENV} names the module {name!r}, which cannot be imported "
                              f"({err.__class__.__name__}: {err}); install it or put its folder on PYTHONPATH, "
                              f"or remove it from {PLUGINS_ENV}") from err
    return modules


import_plugins()

__all__ = ["ALGORITHMS", "CommonParams", "FitRecipe", "IncrementalLearner", "PLUGINS_ENV", "TaskData", "import_plugins"]
