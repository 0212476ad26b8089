"""Class-incremental algorithms, one file each, found through the ALGORITHMS registry.

Every module of this package except the shared ones registers itself on import; importing the package
imports them all, so a new algorithm is one new file.

Algorithms from outside the package are plugins (gtep.plugins), found in two ways:

- entry points of an installed package, group `gtep.algorithms` (`[project.entry-points."gtep.algorithms"]`
  in its pyproject.toml): `my_lab = "my_lab.methods"` names a module that registers itself on import;
  `my_method = "my_lab.methods:MyMethod"` names a learner class, registered as `my_method` unless its module
  registered it already. ALGORITHMS reads them at its first lookup in each process (the driver and every Ray
  worker), after the built-ins;
- the modules named in the environment variable GTEP_PLUGINS (comma-separated importable module names, e.g.
  `GTEP_PLUGINS=my_lab.cl_methods`), imported here after the built-ins, which register themselves with
  `@ALGORITHMS.register(...)` as the built-ins do. The variable must be set where every process runs (the driver
  and Ray's workers inherit it from the shell that starts Ray), and the modules must be importable there
  (installed, or on PYTHONPATH).

A plugin that cannot be loaded is a gtep.plugins.PluginError (an ImportError) naming it and the fix.
"""
import importlib
import pkgutil

from gtep.algorithms.base import ALGORITHMS, CommonParams, FitRecipe, IncrementalLearner, TaskData
from gtep.plugins import PLUGINS_ENV, import_env_modules

_SHARED = {"base", "memory"}
for _module in sorted(m.name for m in pkgutil.iter_modules(__path__)):
    if _module not in _SHARED and not _module.startswith("_"):
        importlib.import_module(f"{__name__}.{_module}")


def import_plugins(names: str | None = None) -> list[str]:
    """Import the plugin modules named in `names` (default: $GTEP_PLUGINS); a module that cannot be imported
    is a PluginError (an ImportError) naming the variable and the module. Importing one twice is a no-op
    (sys.modules)."""
    return import_env_modules(names)


import_plugins()

__all__ = ["ALGORITHMS", "CommonParams", "FitRecipe", "IncrementalLearner", "PLUGINS_ENV", "TaskData", "import_plugins"]
