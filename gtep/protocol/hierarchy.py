"""A class hierarchy as a file gives it: superclass name -> the names or ids of its classes (IIRC's superclasses,
or any family's grouping of classes). Pure: the JSON's parsed content in, a checked mapping out."""
from __future__ import annotations

from typing import Any


def parse_hierarchy(data: Any) -> dict[str, list[str | int]]:
    """A hierarchy file's parsed JSON: {"<superclass name>": ["<subclass class name or id>", ...], ...}."""
    if not isinstance(data, dict) or not all(isinstance(v, list) for v in data.values()):
        raise ValueError("a hierarchy is a JSON object {\"<superclass name>\": [\"<class name or id>\", ...]}")
    for name, subs in data.items():
        bad = [s for s in subs if not isinstance(s, (str, int)) or isinstance(s, bool)]
        if bad:
            raise ValueError(f"superclass {name!r} lists {bad[:3]}; give class names or ids")
    return {str(k): list(v) for k, v in data.items()}
