"""YAML and JSON as gtep reads a user's files (experiment, matrix, search space, best.yaml, shot index, hierarchy):
a key given twice in one mapping is refused, naming the key and both lines.

PyYAML and the json module keep the later value of a repeated key without a word, so a second `search:` block
silently replaces the first and a study of 1 x 1 sets becomes 30 x 5. Every reader of a user's file parses it here.
This module sits in the data layer so that the lowest readers (a shot index, a hierarchy) can use it too.
"""
from __future__ import annotations

import json
import re
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

# YAML merge keys (`<<: *base`) are the one repeated key YAML means: explicit keys override the merged ones
MERGE_TAG = "tag:yaml.org,2002:merge"


class DuplicateKeyError(ValueError):
    """A key given twice in one mapping of a file: the message names the file, the key and the lines."""


def parse_yaml(text: str, source: str) -> Any:
    """The data of a YAML text (safe constructors only); a repeated key is a DuplicateKeyError naming `source`
    (the file), the key's path and both lines. Syntax errors stay yaml.YAMLError, for the callers' messages."""
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _refuse_repeated_keys(loader, node, "", source, set())
        return loader.construct_document(node)
    finally:
        loader.dispose()


def _key_value(loader: yaml.SafeLoader, key: Node) -> Any:
    """The key as the loaded mapping holds it (so `1` and `01`, or `true` and `True`, are the same key)."""
    if isinstance(key, ScalarNode):
        try:
            return loader.construct_object(key)
        except yaml.YAMLError:
            return (key.tag, key.value)
    return (key.tag, id(key))  # a mapping or list as a key: never the same as another


def _refuse_repeated_keys(loader: yaml.SafeLoader, node: Node, path: str, source: str, visited: set[int]) -> None:
    if id(node) in visited:  # an alias repeats a node already checked (or contains itself)
        return
    visited.add(id(node))
    if isinstance(node, MappingNode):
        lines: dict[Any, int] = {}
        for key, value in node.value:
            name = f"{path}.{key.value}" if path else str(key.value)
            if key.tag != MERGE_TAG:
                seen = _key_value(loader, key)
                line = key.start_mark.line + 1
                if seen in lines:
                    raise DuplicateKeyError(f"{source}: the key {name} is given twice, at lines {lines[seen]} and "
                                            f"{line}; keep one (YAML would silently use the last)")
                lines[seen] = line
            _refuse_repeated_keys(loader, value, name, source, visited)
    elif isinstance(node, SequenceNode):
        for index, item in enumerate(node.value):
            _refuse_repeated_keys(loader, item, f"{path}[{index}]", source, visited)


class _RepeatedKey(Exception):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _unique_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _RepeatedKey(key)
        out[key] = value
    return out


def _lines_of_key(text: str, key: str) -> list[int]:
    """The lines where `"key":` is written (json's hook sees no positions, so a light scan finds them)."""
    pattern = re.compile(re.escape(json.dumps(key)) + r"\s*:")
    return [text.count("\n", 0, match.start()) + 1 for match in pattern.finditer(text)]


def parse_json(text: str, source: str) -> Any:
    """The data of a JSON text; a key given twice in one object is a DuplicateKeyError naming `source`, the key and
    the lines it is written on. Syntax errors stay json.JSONDecodeError (a ValueError)."""
    try:
        return json.loads(text, object_pairs_hook=_unique_object)
    except _RepeatedKey as repeated:
        lines = _lines_of_key(text, repeated.key)
        where = (f", at lines {lines[0]} and {lines[1]}" if len(lines) == 2
                 else f" in one object (it is written at lines {', '.join(map(str, lines))})" if lines
                 else " in one object")
        raise DuplicateKeyError(f"{source}: the key {repeated.key!r} is given twice{where}; keep one (JSON "
                                "would silently use the last)") from None
