"""The fields that name things on this machine: the device, the output folder, the tracking store."""
from __future__ import annotations

import re
from pathlib import Path

from gtep.config.base import ConfigError

_DEVICE = re.compile(r"^(auto|cpu|mps|cuda(:[0-9]+)?)$")
TRACKING_SCHEMES = ("sqlite", "file", "http", "https", "postgresql", "mysql", "mssql", "databricks")


def check_device(device: str, field: str) -> None:
    if not _DEVICE.match(device):
        raise ConfigError(field, f"{device!r} is not a device; use auto, cpu, cuda or cuda:N")


def _blocking_file(path: Path) -> Path | None:
    """The file (not folder) that `path` or one of its parents is, so that the folder cannot be made there."""
    for candidate in (path, *path.parents):
        try:
            if candidate.exists():
                return None if candidate.is_dir() else candidate
        except OSError:  # a name longer than the filesystem takes: it does not exist (gtep.preflight refuses it)
            continue
    return None


def check_output(output: Path, field: str) -> None:
    blocking = _blocking_file(Path(output).expanduser())
    if blocking is not None:
        raise ConfigError(field, f"{blocking} is a file, so the folder {output} cannot be made there; "
                          "give a folder for the studies")


def check_tracking_uri(uri: str, field: str) -> None:
    """A store MLflow can open: a known scheme, and for sqlite a file whose folder can be made (nothing is written)."""
    match = re.match(r"^([A-Za-z][A-Za-z0-9+.-]*):", uri)
    if match is None or re.match(r"^[A-Za-z]:[\\/]", uri):
        return  # a plain folder: MLflow's file store
    scheme = match.group(1).split("+", 1)[0].lower()
    if scheme not in TRACKING_SCHEMES:
        raise ConfigError(field, f"{uri!r} has the unknown scheme {scheme!r}; use sqlite:///PATH/mlflow.db, "
                          "http://HOST:PORT (gtep server) or postgresql://... (MLflow knows "
                          f"{', '.join(TRACKING_SCHEMES)})")
    if scheme == "sqlite":
        path = uri[len("sqlite:///"):] if uri.startswith("sqlite:///") else ""
        if not path:
            raise ConfigError(field, f"{uri!r} names no file; write sqlite:///PATH/mlflow.db "
                              "(four slashes for an absolute path)")
        blocking = _blocking_file(Path(path).parent)
        if blocking is not None:
            raise ConfigError(field, f"{blocking} is a file, so {path} cannot be made there; give another path")
