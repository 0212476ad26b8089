"""Plugins: modules outside gtep that register algorithms, scenario families, criteria, datasets or backbones.

A plugin module registers what it defines when it is imported, exactly as gtep's own modules do
(`@ALGORITHMS.register("my_method")`, `@register_family`, `register_criterion(...)`, `@DATASETS.register("my_data")`,
`@BACKBONES.register("my_net")`). gtep imports plugin modules found in two ways.

Entry points, the way for an installed package: its pyproject.toml names the modules (or objects) in the groups
gtep.algorithms, gtep.families, gtep.criteria, gtep.datasets and gtep.backbones:

    [project.entry-points."gtep.algorithms"]
    my_lab = "my_lab.methods"              # a module: importing it registers what it defines
    my_method = "my_lab.methods:MyMethod"  # module:object: the module is imported, and the object (a learner class,
                                           # a family class, a criterion, a dataset factory, a backbone factory)
                                           # is registered under the entry point's name (my_method) unless
                                           # importing its module registered it already

A learner ships its search space as a class attribute, `search_space = "my_method.yaml"`: a file in its package,
found with importlib.resources (gtep.spaces).

A registry reads its group (importlib.metadata.entry_points) the first time it is looked up in a process (get,
names, `in`, iteration): on the driver and in every Ray worker, each from the packages installed where it runs,
so every process sees the same plugins as long as every node has the package installed. Plugins load after
gtep's own entries, once per process (later lookups are a dictionary check). A module that registers in several
registries is listed in each group it registers in (importing it twice is a no-op). gtep.config looks the
families up as it is imported, so a family plugin's section is part of the experiment schema.

GTEP_PLUGINS, the way for a module that is not installed: comma-separated importable module names
(`GTEP_PLUGINS=my_lab.cl_methods`), imported by gtep.algorithms after its built-ins. The variable must be set
where every process runs (Ray's workers inherit it from the shell that starts Ray).

A plugin that cannot be loaded is one PluginError (an ImportError) naming where it came from (the distribution and
its version, the entry point and its group; or the variable), the exception, and the fix for its cause: a module
that is not installed, one that failed to import (it raised, or imports a dependency that is missing), or an object
that cannot be registered. The first such error of
a process is kept and raised again by every later lookup of a registry with a group, so a broken plugin is never
mistaken for an unknown name. This module imports nothing of gtep: the registries call it (gtep.registry).
"""
from __future__ import annotations

import functools
import importlib
import os
import threading
from contextlib import contextmanager
from importlib import metadata
from typing import Any, Callable, Iterator

PLUGINS_ENV = "GTEP_PLUGINS"
# entry-point group -> what its entries register
GROUPS = {"gtep.algorithms": "algorithm", "gtep.families": "scenario family", "gtep.criteria": "selection criterion",
          "gtep.datasets": "dataset", "gtep.backbones": "backbone"}


class PluginError(ImportError):
    """A plugin that cannot be loaded: one line naming its distribution (or GTEP_PLUGINS), the exception and the fix."""


_lock = threading.RLock()  # a Ray worker's threads wait for one loading; a plugin may look up its own registry
_loaded: set[str] = set()  # the groups read in this process
_failure: PluginError | None = None  # the first plugin of this process that could not be loaded
_deferring = 0


def _one_line(err: BaseException) -> str:
    return " ".join(f"{err.__class__.__name__}: {err}".split())


def _fail(error: PluginError, cause: BaseException) -> None:
    """Keep the first failure (raised again by later lookups); raise `error` unless inside `deferred()`."""
    global _failure
    if _failure is None:
        _failure = error
    if not _deferring:
        raise error from cause


def _raise_kept() -> None:
    if _failure is not None and not _deferring:
        raise PluginError(str(_failure)) from _failure.__cause__


@contextmanager
def deferred() -> Iterator[None]:
    """Within, a plugin that cannot be loaded is kept, not raised; the first registry lookup after raises it.
    gtep.config reads the families this way as it is imported, so that the gtep command line starts and reports
    the error as a command's error (one line, exit 2) rather than a traceback while importing."""
    global _deferring
    _deferring += 1
    try:
        yield
    finally:
        _deferring -= 1


@functools.cache
def _scan() -> dict[str, list[metadata.EntryPoint]]:
    """gtep's groups of every installed distribution, read once per process (one scan of the metadata)."""
    found = metadata.entry_points()
    return {group: sorted(found.select(group=group), key=lambda ep: (ep.dist.name if ep.dist else "", ep.name))
            for group in GROUPS}


def entry_points(group: str) -> list[metadata.EntryPoint]:
    """The group's entry points of every installed distribution (the first on sys.path of each name), in a fixed
    order (distribution, name), as this process found them at its first look."""
    return list(_scan()[group])


def distribution(ep: metadata.EntryPoint) -> str:
    """'name version' of the distribution an entry point comes from."""
    return f"{ep.dist.name} {ep.dist.version}" if ep.dist is not None else "an unknown distribution"


def is_missing(err: BaseException, module: str) -> bool:
    """Whether `err` says `module` itself (or a package above it) is not there, as opposed to a module that exists
    and raised while importing: an `import nonexistent_dep` inside it is its missing dependency, not its absence."""
    if not isinstance(err, ModuleNotFoundError) or not err.name:
        return False
    return module == err.name or module.startswith(f"{err.name}.")


def _import_fix(err: BaseException, module: str) -> str:
    """How to fix a module that raised while importing: the dependency it lacks, or the error in its code."""
    if isinstance(err, ModuleNotFoundError) and err.name:
        return f"install the module it imports ({err.name}: pip install {err.name.split('.')[0]})"
    return f"fix the error in {module} (or ask its authors)"


def _entry_error(group: str, ep: metadata.EntryPoint, err: BaseException, imported: bool) -> PluginError:
    """Why an entry point cannot be loaded, in the words of its cause: its module is not installed, its module
    failed to import, or the object it names cannot be registered."""
    name = ep.dist.name if ep.dist is not None else "the package that provides it"
    where = (f"the gtep plugin {ep.name!r} of the distribution {distribution(ep)} (entry point {ep.name} = {ep.value} "
             f"in group {group})")
    reinstall = f"reinstall it (pip install --force-reinstall {name}) or uninstall it (pip uninstall {name})"
    if not imported and is_missing(err, ep.module):
        return PluginError(f"{where} is not installed: its module {ep.module} cannot be found ({_one_line(err)}); "
                           f"{reinstall}")
    if not imported:
        return PluginError(f"{where} failed to import: {_one_line(err)}; {_import_fix(err, ep.module)}, "
                           f"or uninstall it (pip uninstall {name})")
    return PluginError(f"{where} cannot be loaded ({_one_line(err)}); {reinstall}")


def load_entry_point(group: str, ep: metadata.EntryPoint, add: Callable[[str, Any], None]) -> None:
    """Import an entry point's module and, for `module:object`, `add(name, object)`; a PluginError if either fails.
    The import comes first and alone so that a module that raises is told apart from an object that is missing
    or cannot be registered."""
    try:
        importlib.import_module(ep.module)
    except Exception as err:  # noqa: BLE001 - a missing module, or one that raises while importing
        raise _entry_error(group, ep, err, imported=False) from err
    try:
        obj = ep.load()
        if ep.attr:
            add(ep.name, obj)
    except Exception as err:  # noqa: BLE001 - a missing object, a name registered twice
        raise _entry_error(group, ep, err, imported=True) from err


def load_group(group: str, add: Callable[[str, Any], None]) -> None:
    """Load the group's entry points once per process: import each module; for a `module:object` entry point,
    `add(name, object)` registers the object (the registry skips it when importing the module registered it).
    Raises the process's kept PluginError, if any, on every call (outside `deferred()`)."""
    with _lock:
        _raise_kept()
        if group in _loaded:
            return
        _loaded.add(group)  # before importing: a plugin that looks its registry up while loading does not recurse
        for ep in entry_points(group):
            try:
                load_entry_point(group, ep, add)
            except PluginError as err:
                _fail(err, err.__cause__ or err)


def env_modules(names: str | None = None) -> list[str]:
    """The module names of `names` (default: $GTEP_PLUGINS)."""
    spec = os.environ.get(PLUGINS_ENV, "") if names is None else names
    return [name.strip() for name in spec.split(",") if name.strip()]


def import_env_modules(names: str | None = None) -> list[str]:
    """Import the modules named in `names` (default: $GTEP_PLUGINS); one that cannot be imported is a PluginError
    naming the variable and the module. Importing one twice is a no-op (sys.modules)."""
    modules = env_modules(names)
    for name in modules:
        try:
            import_env_module(name)
        except PluginError as err:
            _fail(err, err.__cause__ or err)
    return modules


def import_env_module(name: str) -> None:
    """Import one module of $GTEP_PLUGINS; a PluginError that tells a module that is not there (install it, or
    PYTHONPATH) from one that raised while importing (fix it, or the dependency it lacks)."""
    try:
        importlib.import_module(name)
    except Exception as err:  # noqa: BLE001 - a missing module or one that fails while importing
        if is_missing(err, name):
            raise PluginError(f"{PLUGINS_ENV} names the module {name!r}, which is not installed ({_one_line(err)}); "
                              f"install it or put its folder on PYTHONPATH, or remove it from {PLUGINS_ENV}") from err
        raise PluginError(f"{PLUGINS_ENV} names the module {name!r}, which failed to import: {_one_line(err)}; "
                          f"{_import_fix(err, name)}, or remove it from {PLUGINS_ENV}") from err


def plugin_packages() -> list[str]:
    """The packages of every plugin (no import): the top-level package of each entry point's module in gtep's
    groups (my_lab for my_lab.methods), and the modules of $GTEP_PLUGINS. The checkpoint loader trusts the
    classes defined under them (gtep.engine.checkpoint)."""
    packages = {ep.module.split(".")[0] for group in GROUPS for ep in entry_points(group)}
    return sorted(packages | set(env_modules()))


def source_of(module: str) -> str | None:
    """Where a plugin module comes from: 'distribution version' for a module of an entry point's package,
    GTEP_PLUGINS for a module it names, None otherwise (gtep's own, or not a plugin)."""
    for group in GROUPS:
        for ep in entry_points(group):
            top = ep.module.split(".")[0]
            if module == top or module.startswith(f"{top}."):
                return distribution(ep)
    if any(module == name or module.startswith(f"{name}.") for name in env_modules()):
        return PLUGINS_ENV
    return None
