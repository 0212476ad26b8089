"""FSCIL shot index files: a benchmark's own K shots per class (gtep/protocol/families/ draws them otherwise)."""
from __future__ import annotations

from pathlib import Path

from gtep.data.file_parsing import DuplicateKeyError, parse_json


def read_shot_index(path: str | Path) -> dict[int, list[int]]:
    """A shot index file: JSON {"<class id>": [training image indices of that class], ...}."""
    data = parse_json(Path(path).read_text(), str(path))  # a class listed twice: DuplicateKeyError
    if not isinstance(data, dict):
        raise ValueError("a shot index is a JSON object {\"<class id>\": [training image indices]}")
    index: dict[int, list[int]] = {}
    for key, images in data.items():
        if int(key) in index:  # "1" and "01": two keys to JSON, one class to gtep, which would keep the last
            raise DuplicateKeyError(f"{path}: class {int(key)} is given twice (as {key!r} and once before); "
                                    "keep one")
        index[int(key)] = [int(i) for i in images]
    return index
