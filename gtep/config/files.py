"""Configs from files and data: experiment YAML files, the shipped presets (${VAR} expanded), a recorded config
(a manifest's) with the fields added since at their defaults."""
from __future__ import annotations

import os
import re
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from gtep.config.base import ConfigError
from gtep.config.scenario import SECTIONS
from gtep.config.schema import ExperimentConfig, SearchSpec, _validate
from gtep.data.file_parsing import DuplicateKeyError, parse_yaml

ADDED_SEARCH_FIELDS = ("scheduler", "scheduler_options", "protocol", "protocol_tasks",  # issue 24
                       "pruner", "pruner_options", "fidelity")


def with_added_defaults(stored: dict[str, Any]) -> dict[str, Any]:
    """A recorded config (a manifest's) with the search fields (and every field with a default of its family's
    section, scenario.iirc's memory_per_class say) added since, at their defaults: a study recorded before them
    compares equal to the same config today (resume, matrix cells)."""
    scenario = stored.get("scenario")
    if isinstance(scenario, dict):
        for key, model in SECTIONS.items():
            if isinstance(scenario.get(key), dict):
                defaults = {name: field.default for name, field in model.model_fields.items()
                            if not field.is_required() and field.default_factory is None}
                scenario = {**scenario, key: {**defaults, **scenario[key]}}
        stored = {**stored, "scenario": scenario}
    if not isinstance(stored.get("search"), dict):
        return stored
    defaults = SearchSpec().model_dump(mode="json")
    return {**stored, "search": {**{k: defaults[k] for k in ADDED_SEARCH_FIELDS}, **stored["search"]}}


_ENV = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def _expand_env(value: Any, where: str) -> Any:
    """${VAR} in strings becomes the variable's value (presets name data roots this way); never evaluated."""
    if isinstance(value, dict):
        return {k: _expand_env(v, f"{where}.{k}" if where else k) for k, v in value.items()}
    if isinstance(value, list):
        return [_expand_env(v, where) for v in value]
    if isinstance(value, str):
        def sub(match: re.Match) -> str:
            name = match.group(1)
            if name not in os.environ:
                raise ConfigError(where, f"uses ${{{name}}} but the environment variable {name} is not set; export it")
            return os.environ[name]
        return _ENV.sub(sub, value)
    return value


def validate_config(data: Any, source: str) -> ExperimentConfig:
    """A config from data (a study's manifest, say): a bad field is one ConfigError naming it and `source`."""
    if not isinstance(data, dict):
        raise ConfigError("config", f"{source} holds no experiment config (a mapping of fields)")
    return _validate(data, source)


def read_yaml(path: Path, field: str, what: str) -> Any:
    """A YAML file's data. A missing file, a folder, a binary file or bad syntax is one ConfigError naming `field`
    (the option or config field that gave the path), the file and, for bad syntax, the line and column."""
    from gtep.spaces import yaml_error

    path = Path(path)
    if not path.exists():
        raise ConfigError(field, f"{path} does not exist; give the path of {what}")
    if path.is_dir():
        raise ConfigError(field, f"{path} is a folder; give the path of {what}")
    try:
        return parse_yaml(path.read_text(), str(path))
    except DuplicateKeyError as err:
        raise ConfigError(field, str(err)) from None
    except yaml.YAMLError as err:
        raise ConfigError(field, yaml_error(path, err)) from None
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(field, f"cannot read {path} as YAML text ({err.__class__.__name__}); "
                          f"give the path of {what}") from None


def load_config(path: Path) -> ExperimentConfig:
    path = Path(path)
    data = read_yaml(path, "--config", "an experiment YAML file")
    if not isinstance(data, dict):
        raise ConfigError("--config", f"{path} must be a YAML mapping of fields (study, algorithm, scenario, ...)")
    return _validate(_expand_env(data, ""), str(path))


def preset_names() -> list[str]:
    return sorted(p.name[:-5] for p in resources.files("gtep.presets").iterdir() if p.name.endswith(".yaml"))


def preset_text(name: str) -> str:
    if name not in preset_names():
        raise ConfigError("--preset", f"unknown preset {name!r}; choose from {preset_names()} (gtep presets)")
    return resources.files("gtep.presets").joinpath(f"{name}.yaml").read_text()


def load_preset(name: str) -> ExperimentConfig:
    data = parse_yaml(preset_text(name), f"preset {name}")
    return _validate(_expand_env(data, ""), f"preset {name}")
