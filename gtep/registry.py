"""One small registry for algorithms, backbones, datasets and scenario generators (the timm pattern)."""
from __future__ import annotations

from typing import Any, Callable, Generic, Iterator, TypeVar

from gtep import plugins

T = TypeVar("T")


class Registry(Generic[T]):
    """Name -> entry, failing loudly with the list of what exists.

    A registry with an entry-point `group` (gtep.algorithms, gtep.families...) loads the plugins of that group the
    first time it is looked up in a process (get, names, `in`, iteration; gtep.plugins); registering never does.
    `entry_of(name, object)` turns the object of a `module:object` entry point into an entry (default: itself)."""

    def __init__(self, kind: str, group: str | None = None,
                 entry_of: Callable[[str, Any], T] | None = None) -> None:
        self.kind = kind
        self.group = group
        self._entry_of = entry_of
        self._entries: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        def add(entry: T) -> T:
            if name in self._entries:
                raise ValueError(f"{self.kind} {name!r} is registered twice")
            self._entries[name] = entry
            return entry

        return add

    def _discover(self) -> None:
        if self.group is not None:
            plugins.load_group(self.group, self._add_plugin)

    def _add_plugin(self, name: str, obj: Any) -> None:
        """A `module:object` entry point's object, registered under the entry point's name unless importing its
        module registered it already (the object itself, or an instance of it: a family class)."""
        if any(entry is obj or type(entry) is obj for entry in self._entries.values()):
            return
        self.register(name)(self._entry_of(name, obj) if self._entry_of is not None else obj)

    def get(self, name: str) -> T:
        self._discover()
        if name not in self._entries:
            raise KeyError(f"unknown {self.kind} {name!r}; choose from {sorted(self._entries)}")
        return self._entries[name]

    def names(self) -> list[str]:
        self._discover()
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        self._discover()
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())
