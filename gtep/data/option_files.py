"""Files a scenario family's options name (a benchmark's shot index, a class hierarchy), found by the name the
option's metadata gives ({"file": <name>}, gtep/protocol/families/base.py): the config checks the path with
`check` when it validates the section and reads the content with `read` into the option marked
{"filled_from": <the path's option>}, so workers and the pre-flight checks need no file."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from gtep.data.file_parsing import DuplicateKeyError, parse_json
from gtep.data.shot_index import read_shot_index
from gtep.protocol.hierarchy import parse_hierarchy
from gtep.registry import Registry


@dataclass(frozen=True)
class OptionFile:
    """check: the path as given -> the path as recorded (ValueError: what is wrong, with the fix);
    read: the recorded path -> the content as the family takes it (plain JSON values)."""

    check: Callable[[str], str]
    read: Callable[[str], Any]


OPTION_FILES: Registry[OptionFile] = Registry("option file")


def _check_shot_index(value: str) -> str:
    path = Path(os.path.expanduser(value))
    if not path.is_file():
        raise ValueError(f"{value} does not exist; give a JSON file {{\"<class id>\": [training image indices]}}")
    try:
        read_shot_index(path)
    except DuplicateKeyError:
        raise  # its message names the file, the class and both lines
    except (ValueError, TypeError, AttributeError) as err:
        raise ValueError(f"{value} is not a shot index ({err}); write {{\"<class id>\": [indices], ...}}") from None
    return str(path)


def _read_shot_index(value: str) -> dict[str, list[int]]:
    return {str(c): v for c, v in read_shot_index(value).items()}


def read_hierarchy(path: Path) -> dict[str, list[str | int]]:
    """A class hierarchy file: JSON {"<superclass name>": ["<subclass class name or id>", ...]}."""
    try:
        return parse_hierarchy(parse_json(Path(path).read_text(), str(path)))
    except DuplicateKeyError:
        raise  # its message names the file, the superclass and both lines
    except (ValueError, TypeError, AttributeError, OSError) as err:
        raise ValueError(f"{path} is not a hierarchy file ({err})") from None


def _check_hierarchy(value: str) -> str:
    path = Path(os.path.expanduser(value))
    if not path.is_file():
        raise ValueError(f"{value} is neither 'groups' nor an existing file; give 'groups' or a JSON file "
                         "{\"<superclass name>\": [\"<subclass class name or id>\", ...]}")
    read_hierarchy(path)
    return str(path.resolve())


OPTION_FILES.register("shot_index")(OptionFile(_check_shot_index, _read_shot_index))
OPTION_FILES.register("class_hierarchy")(OptionFile(_check_hierarchy, lambda value: read_hierarchy(Path(value))))
