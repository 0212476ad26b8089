"""House rules that keep the protocol pure and every algorithm complete (../shared/DESIGN.md)."""
import ast
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import gtep
from gtep.algorithms import ALGORITHMS
from gtep.spaces import load_space, spaces_dir

PACKAGE = Path(gtep.__file__).parent
ROOT = PACKAGE.parent
BASELINES = {"finetune", "simplecil"}  # reference learners without a search space of their own


def imports_of(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_the_import_contracts_hold():
    """The layers, Ray and MLflow only in orchestration, CLI command modules apart, no cycles: the contracts in
    pyproject.toml's [tool.importlinter], checked by import-linter on this checkout (imports inside functions too)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH"))))}
    lint = [sys.executable, "-c", "import sys; from importlinter.cli import lint_imports_command; "
            "sys.exit(lint_imports_command())", "--no-cache"]
    done = subprocess.run(lint, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_cli_contract_names_every_command_module():
    """A new module in gtep/cli is either `common` or a command module placed in the independence layer."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    cli = next(c for c in config["contracts"] if c.get("containers") == ["gtep.cli"])
    named = {name.strip() for layer in cli["layers"] for name in layer.split("|")}
    modules = {p.stem for p in (PACKAGE / "cli").glob("*.py") if not p.stem.startswith("__")}
    assert modules == named


def test_protocol_is_pure():
    for path in (PACKAGE / "protocol").rglob("*.py"):
        assert imports_of(path) <= {"__future__", "abc", "dataclasses", "typing", "re", "math", "numpy", "gtep"}, path


def test_no_unsafe_loading_or_eval():
    for path in PACKAGE.rglob("*.py"):
        text = path.read_text()
        assert "eval(" not in text.replace(".eval(", "").replace("_eval(", ""), path
        if "torch.load(" in text:
            assert "weights_only=True" in text, path


@pytest.mark.parametrize("name", [n for n in ALGORITHMS.names() if n not in BASELINES])
def test_every_algorithm_has_a_search_space_with_original(name):
    space = load_space(name)
    assert space.space.names, name
    assert "original" in space.presets, name
    params = ALGORITHMS.get(name).Params
    params.from_mapping(space.presets["original"])
    assert set(space.space.names) <= set(params.tunable()), name


@pytest.mark.parametrize("path", sorted(spaces_dir().glob("*.yaml")), ids=lambda p: p.stem)
def test_every_space_file_names_a_registered_algorithm(path):
    assert path.stem in ALGORITHMS
    load_space(path.stem, path)
