"""Issue 45, item 8: a key given twice in any file gtep reads is refused, naming the file, the key and both lines.

YAML and JSON parsers keep the last value of a repeated key without a word: a second `search:` block turned a
study of 1 x 1 sets into 30 x 5 and `gtep check` said ok. Every reader of a user's file parses it with
gtep/data/file_parsing.py: the experiment file, a matrix file, a search space, a best.yaml, the presets, an FSCIL
shot index and an IIRC hierarchy file."""
from __future__ import annotations

import json
from importlib import resources

import pytest
import yaml

from gtep.data.file_parsing import DuplicateKeyError, parse_json, parse_yaml
from gtep.data.option_files import OPTION_FILES, read_hierarchy
from gtep.data.shot_index import read_shot_index
from gtep.spaces import spaces_dir
from tests.cli.test_cli_errors import BASE, MATRIX, Inputs, invoke, sandbox  # noqa: F401 - the fixture

# BASE (1 x 1 sets) and then a second search block below it, as the user wrote it
TWICE = yaml.safe_dump({**BASE, "search": {"trials": 1, "orderings": 1}}, sort_keys=False) + \
    "search:\n  trials: 30\n  orderings: 5\n"


def one_error_line(result) -> str:
    message = result.stderr.strip()
    assert message.startswith("error:") and len(message.splitlines()) == 1, message
    return message


def line_of(text: str, start: str, nth: int = 1) -> int:
    """The 1-based line number of the nth line of `text` that starts with `start`."""
    return [i for i, line in enumerate(text.splitlines(), 1) if line.startswith(start)][nth - 1]


def test_check_refuses_a_second_search_block(sandbox):  # noqa: F811
    inputs: Inputs = sandbox[0]
    config = inputs.text("exp.yaml", TWICE)
    message = one_error_line(invoke(sandbox, ["check", "-c", config, "--output", str(sandbox[2])]))
    first, second = line_of(TWICE, "search:"), line_of(TWICE, "search:", 2)
    assert "--config" in message and "exp.yaml" in message and "the key search is given twice" in message
    assert f"lines {first} and {second}" in message, message


def test_a_repeated_key_deep_inside_the_experiment_file_is_refused(sandbox):  # noqa: F811
    inputs: Inputs = sandbox[0]
    text = ("study: deep\nalgorithm: replay\nbackbone: resnet8\nscenario:\n  increments: 3x2\n"
            "datasets:\n  split:\n    dataset: synthetic:classes=12\n    classes_per_phase: 6\n"
            "    classes_per_phase: 4\nsearch: {trials: 1, orderings: 1}\n")
    message = one_error_line(invoke(sandbox, ["tune", "-c", inputs.text("exp.yaml", text)]))
    assert "datasets.split.classes_per_phase is given twice, at lines 9 and 10" in message, message


def test_matrix_file(sandbox):  # noqa: F811
    inputs: Inputs = sandbox[0]
    text = yaml.safe_dump(MATRIX, sort_keys=False) + "algorithms: [replay, icarl]\n"
    message = one_error_line(invoke(sandbox, ["matrix", "-c", inputs.text("matrix.yaml", text)]))
    assert "the key algorithms is given twice" in message, message
    assert f"lines {line_of(text, 'algorithms:')} and {line_of(text, 'algorithms:', 2)}" in message, message


def test_search_space_file(sandbox):  # noqa: F811
    inputs: Inputs = sandbox[0]
    space = "algorithm: replay\nspace:\n  lr: [0.1]\n  epochs: [1]\n  lr: [0.5, 1.0, 2.0]\n"
    message = one_error_line(invoke(sandbox, ["check", "-c", inputs.space(space), "--output", str(sandbox[2])]))
    assert "search.space" in message and "space.yaml" in message, message
    assert "the key space.lr is given twice, at lines 3 and 5" in message, message


def test_best_file(sandbox):  # noqa: F811
    inputs: Inputs = sandbox[0]
    best = inputs.text("best.yaml", "algorithm: replay\nset_index: 0\nhparams: {lr: 0.1, lr: 0.2}\n")
    message = one_error_line(invoke(sandbox, ["evaluate", "-c", inputs.cfg(), "--best", best]))
    assert "--best" in message and "hparams.lr is given twice, at lines 3 and 3" in message, message


SHOTS_TWICE = '{\n  "0": [1, 2],\n  "1": [3, 4],\n  "0": [5, 6]\n}\n'
TREE_TWICE = json.dumps({"animals": ["cat", "dog"], "plants": ["oak"]}, indent=1).replace(
    '"plants"', '"animals": ["cow"],\n "plants"')


@pytest.mark.parametrize("name, text, read, option, where, check", [
    ("shots.json", SHOTS_TWICE, read_shot_index, "shot_index",
     r"shots.json: the key '0' is given twice, at lines 2 and 4",
     # what the config's check of scenario.fscil.shot_index says: the same, not "is not a shot index"
     "given twice, at lines 2 and 4; keep one"),
    ("tree.json", TREE_TWICE, read_hierarchy, "class_hierarchy",
     r"tree.json: the key 'animals' is given twice, at lines 2 and 6", "'animals' is given twice"),
], ids=["shot_index", "hierarchy"])
def test_a_json_option_file_with_a_key_given_twice(tmp_path, name, text, read, option, where, check):
    """Read by its reader and by the config's check of the option that names it: the key and both lines."""
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(DuplicateKeyError, match=where):
        read(path)
    with pytest.raises(ValueError, match=check):
        OPTION_FILES.get(option).check(str(path))


def test_a_shot_index_with_one_class_under_two_keys(tmp_path):
    path = tmp_path / "shots.json"
    path.write_text('{"1": [3, 4], "01": [5, 6]}')  # two keys to JSON, one class to gtep
    with pytest.raises(DuplicateKeyError, match="class 1 is given twice"):
        read_shot_index(path)


def test_what_yaml_means_by_a_repeated_key_still_loads():
    """Merge keys are YAML's own way to repeat keys (explicit ones override); the same key in two mappings, or a
    list of mappings, is no repetition; an alias to a mapping is checked once."""
    text = "base: &b {lr: 0.1, epochs: 3}\nfast:\n  <<: *b\n  lr: 0.5\nruns: [{lr: 1}, {lr: 2}]\nagain: *b\n"
    assert parse_yaml(text, "x") == {"base": {"lr": 0.1, "epochs": 3}, "fast": {"lr": 0.5, "epochs": 3},
                                     "runs": [{"lr": 1}, {"lr": 2}], "again": {"lr": 0.1, "epochs": 3}}
    assert parse_yaml("", "x") is None
    assert parse_json('{"a": {"b": 1}, "c": {"b": 2}}', "x") == {"a": {"b": 1}, "c": {"b": 2}}
    with pytest.raises(DuplicateKeyError, match="runs\\[1\\].lr is given twice, at lines 3 and 4"):
        parse_yaml("runs:\n  - {lr: 1}\n  - lr: 2\n    lr: 3\n", "x")
    with pytest.raises(DuplicateKeyError, match="the key True is given twice, at lines 1 and 2"):  # one key: True
        parse_yaml("true: 1\nTrue: 2\n", "x")


def test_every_shipped_yaml_file_has_unique_keys():
    presets = resources.files("gtep.presets")
    texts = {p.name: p.read_text() for p in presets.iterdir() if p.name.endswith(".yaml")}
    texts |= {f"matrix/{p.name}": p.read_text() for p in presets.joinpath("matrix").iterdir()
              if p.name.endswith(".yaml")}
    texts |= {p.name: p.read_text() for p in spaces_dir().glob("*.yaml")}
    assert len(texts) > 40
    for name, text in texts.items():
        parse_yaml(text, name)
