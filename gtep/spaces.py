"""Search-space files: `search_spaces/<algorithm>.yaml` (package data, gtep/search_spaces/) holds the paper's
predefined sets (Tables 4-5) and named presets such as `original` (the values the algorithm's authors reported,
appendix A).

    algorithm: replay
    space:                 # sampled: each value drawn uniformly from its list
      epochs: [30, 70, 120, 160, 200]
      ...
    presets:
      original: {epochs: 70, lr: 0.1, ...}

Every name must be a hyperparameter of the algorithm's Params, every value of the field's type.

A config's `search.space` path wins; else gtep's shipped file; else the file the learner declares as its class
attribute `search_space` (a YAML file in its package: how a plugin ships its space, docs/extending.md).
"""
from __future__ import annotations

import dataclasses
import inspect
import os
import sys
import typing
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from gtep.algorithms import ALGORITHMS, CommonParams
from gtep.data.file_parsing import DuplicateKeyError, parse_yaml
from gtep.protocol.sampling import SearchSpace


class SearchSpaceError(ValueError):
    """A search-space file that cannot be used, naming the file, the field and the fix."""


def spaces_dir() -> Path:
    """gtep's own search spaces: `gtep/search_spaces/`, package data, so a wheel or `pip install .` has them (the
    repository's top-level `search_spaces/` is a link to it), or the folder GTEP_SEARCH_SPACES names instead."""
    env = os.environ.get("GTEP_SEARCH_SPACES")
    return Path(env) if env else Path(__file__).resolve().parent / "search_spaces"


def yaml_error(path: Path | str, err: yaml.YAMLError) -> str:
    """A YAML syntax error as a person fixes it: the file, the line and column (1-based), what the parser wanted."""
    mark = getattr(err, "problem_mark", None) or getattr(err, "context_mark", None)
    problem = getattr(err, "problem", None) or getattr(err, "context", None) or err.__class__.__name__
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    return f"{path} is not valid YAML{where} ({problem}); fix its syntax"


class NoSearchSpace(SearchSpaceError):
    """An algorithm with no search space at all: gtep ships none and its learner declares none."""


# The class attribute by which a learner (a plugin's, usually) declares its search-space file.
SPACE_ATTRIBUTE = "search_space"


def default_space_file(algorithm: str) -> Path:
    """The search space used when a config names none: gtep's shipped file, else the one the algorithm's learner
    declares (a plugin's); when neither exists, the shipped path (that load_space reports as missing)."""
    shipped = spaces_dir() / f"{algorithm}.yaml"
    if shipped.exists():
        return shipped
    return declared_space_file(algorithm) or shipped


def declared_space_file(algorithm: str) -> Path | None:
    """The file a registered learner declares as `search_space = "<name>.yaml"`: a path relative to the package
    that holds the learner's module (read with importlib.resources, so it is found wherever the plugin is
    installed), or an absolute path. None when the learner declares none or the algorithm is not registered."""
    if algorithm not in ALGORITHMS:
        return None
    cls = ALGORITHMS.get(algorithm)
    declared = getattr(cls, SPACE_ATTRIBUTE, None)
    if declared is None:
        return None
    if not isinstance(declared, (str, os.PathLike)) or not str(declared):
        raise SearchSpaceError(f"{cls.__module__}.{cls.__qualname__}.{SPACE_ATTRIBUTE} = {declared!r} is not a "
                               f"file name; set it to a YAML file in the learner's package, e.g. "
                               f"{SPACE_ATTRIBUTE} = \"{algorithm}.yaml\"")
    path = Path(declared)
    return path if path.is_absolute() else _package_folder(cls) / path


def _package_folder(cls: type) -> Path:
    """The folder of the package that holds a class's module (the module's own folder for a top-level module)."""
    spec = sys.modules[cls.__module__].__spec__
    if spec is not None and spec.parent:
        found = resources.files(spec.parent)
        if isinstance(found, Path):  # a zipped or namespace package has no single folder: use the module's
            return found
    return Path(inspect.getfile(cls)).parent


def _no_space(algorithm: str, shipped: Path) -> SearchSpaceError:
    """What to do when the default search space of `algorithm` does not exist, for gtep's learners and plugins'."""
    declared = declared_space_file(algorithm)
    if declared is not None:
        cls = ALGORITHMS.get(algorithm)
        return SearchSpaceError(
            f"{cls.__module__}.{cls.__qualname__} declares {SPACE_ATTRIBUTE} = {getattr(cls, SPACE_ATTRIBUTE)!r}, "
            f"but {declared} does not exist; ship the file in the plugin's package (package data, e.g. "
            "[tool.setuptools.package-data] in its pyproject.toml) or set search.space to a search-space file")
    return NoSearchSpace(
        f"{algorithm} has no search space: gtep ships no {shipped.name} in {shipped.parent} and its learner declares "
        f"none; set search.space to a search-space YAML file, or, for a plugin, set {SPACE_ATTRIBUTE} = "
        f"\"{algorithm}.yaml\" on its learner class and ship that file in its package (docs/extending.md)")


@dataclass(frozen=True)
class AlgorithmSpace:
    algorithm: str
    path: Path
    space: SearchSpace
    presets: dict[str, dict[str, Any]]


def _field_types(params_cls: type[CommonParams]) -> dict[str, Any]:
    hints = typing.get_type_hints(params_cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(params_cls)}


def _check_value(path: Path, name: str, value: Any, hint: Any) -> None:
    origin = typing.get_origin(hint)
    if origin is typing.Literal:
        if value not in typing.get_args(hint):
            raise SearchSpaceError(f"{path}: {name}={value!r} is not one of {list(typing.get_args(hint))}")
        return
    if hint is bool:
        ok = isinstance(value, bool)
    elif hint is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif hint is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    elif hint is str:
        ok = isinstance(value, str)
    else:  # tuples (explicit milestones) and unions: accept lists of ints or null
        ok = value is None or isinstance(value, (list, tuple))
    if not ok:
        raise SearchSpaceError(f"{path}: {name}={value!r} should be of type {getattr(hint, '__name__', hint)}")


def validate_values(path: Path, algorithm: str, values: dict[str, Any]) -> None:
    """Every name is a hyperparameter of the algorithm and every value fits its type."""
    params_cls = ALGORITHMS.get(algorithm).Params
    types = _field_types(params_cls)
    for name, value in values.items():
        if name not in types:
            raise SearchSpaceError(
                f"{path}: {name!r} is not a hyperparameter of {algorithm}; it has {sorted(types)}"
            )
        _check_value(path, name, value, types[name])


def load_space(algorithm: str, path: Path | None = None) -> AlgorithmSpace:
    if not path:  # gtep's file, else the learner's declared one; neither: say how to give one
        path = default_space_file(algorithm)
        if not path.exists():
            raise _no_space(algorithm, spaces_dir() / f"{algorithm}.yaml")
    path = Path(path)
    if not path.exists():
        raise SearchSpaceError(f"search space file {path} does not exist; set search.space or add {path.name}")
    if path.is_dir():
        raise SearchSpaceError(f"{path} is a folder; give the path of a search-space YAML file")
    try:
        doc = parse_yaml(path.read_text(), str(path))
    except DuplicateKeyError as err:
        raise SearchSpaceError(str(err)) from None
    except yaml.YAMLError as err:
        raise SearchSpaceError(yaml_error(path, err)) from None
    except (OSError, UnicodeDecodeError) as err:
        raise SearchSpaceError(f"cannot read {path} as a YAML text file ({err.__class__.__name__}); "
                               "give a search-space YAML file") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("space"), dict) or not doc["space"]:
        raise SearchSpaceError(f"{path}: the search space is empty; "
                               "give a non-empty mapping 'space: {name: [values]}'")
    if doc.get("algorithm", algorithm) != algorithm:
        raise SearchSpaceError(f"{path}: written for algorithm {doc['algorithm']!r}, not {algorithm!r}")
    sets: dict[str, tuple] = {}
    for name, values in doc["space"].items():
        if not isinstance(values, list) or not values:
            raise SearchSpaceError(f"{path}: space.{name} must be a non-empty list of values, got {values!r}")
        for value in values:
            validate_values(path, algorithm, {name: value})
        sets[name] = tuple(values)
    presets = doc.get("presets") or {}
    if not isinstance(presets, dict):
        raise SearchSpaceError(f"{path}: presets must be a mapping 'presets: {{name: {{hyperparameter: value}}}}'")
    for preset, values in presets.items():
        if not isinstance(values, dict):
            raise SearchSpaceError(f"{path}: presets.{preset} must be a mapping of hyperparameter values")
        validate_values(path, algorithm, values)
    return AlgorithmSpace(algorithm, path, SearchSpace(sets), presets)
