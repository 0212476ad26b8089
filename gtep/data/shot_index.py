"""FSCIL shot index files: a benchmark's own K shots per class (gtep/protocol/families/ draws them otherwise)."""
from __future__ import annotations

import json
from pathlib import Path


def read_shot_index(path: str | Path) -> dict[int, list[int]]:
    """A shot index file: JSON {"<class id>": [training image indices of that class], ...}."""
    data = json.loads(Path(path).read_text())
    if not isinstance(data, dict):
        raise ValueError("a shot index is a JSON object {\"<class id>\": [training image indices]}")
    return {int(k): [int(i) for i in v] for k, v in data.items()}
