"""The fields that name things on this machine: the device, the output folder, the tracking store."""
from __future__ import annotations

import re
from pathlib import Path

from gtep.config.base import ConfigError
from gtep.config.uris import check_no_userinfo, redact_uri

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
    """A store MLflow can open: no password in it (gtep.config.uris, the one rule), a known scheme, and for sqlite a
    file whose folder can be made (nothing is written)."""
    check_no_userinfo(uri, field)
    match = re.match(r"^([A-Za-z][A-Za-z0-9+.-]*):", uri)
    if match is None or re.match(r"^[A-Za-z]:[\\/]", uri):
        return  # a plain folder: MLflow's file store
    scheme = match.group(1).split("+", 1)[0].lower()
    if scheme not in TRACKING_SCHEMES:
        raise ConfigError(field, f"{redact_uri(uri)!r} has the unknown scheme {scheme!r}; use "
                          "sqlite:///PATH/mlflow.db, "
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


SQLITE_HEADER = b"SQLite format 3\x00"  # the first 16 bytes of every SQLite database file (sqlite.org/fileformat)
PORTS = range(1, 65536)  # 0 would make the OS pick a port, so the printed links would point nowhere


def check_store_file(path: Path, field: str) -> None:
    """An existing sqlite store is a database file: a folder, or any other file, would make MLflow fail with a
    traceback (an empty file is an empty database, which MLflow fills)."""
    if path.is_dir():
        raise ConfigError(field, f"{path} is a folder, not an MLflow store; give the --output folder that holds "
                          "mlflow.db (or --tracking-uri sqlite:///PATH/mlflow.db)")
    with path.open("rb") as handle:
        head = handle.read(len(SQLITE_HEADER))
    if head and head != SQLITE_HEADER:
        raise ConfigError(field, f"{path} is not an SQLite database, so not an MLflow store; give the --output "
                          "folder gtep run wrote (its mlflow.db), or the store's --tracking-uri")


def check_port(port: int, field: str = "--port") -> None:
    if port not in PORTS:
        raise ConfigError(field, f"{port} is not a port; give one in {PORTS.start}..{PORTS.stop - 1} "
                          "(e.g. 5000)")
