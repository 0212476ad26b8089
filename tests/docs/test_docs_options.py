"""The docs' lists of options and settings hold against the code.

- Every option docs/cli.md attributes to a command is one of that command's options (its --help): in the table of
  `tune`/`evaluate`/`run` options both ways (yes: it has it, no: it has not), and in a table row that names a
  command, each option after it.
- Every `gtep ...` command written inline in a page (README and docs/) parses against the real CLI, as
  tests/docs/test_docs.py parses the command blocks.
- Every setting of the experiment file (a field of gtep.config's models, outside the families' own sections,
  which tests/docs/test_docs.py checks on their pages) and every environment variable gtep's code or presets read is in
  docs/configuration.md.
"""
from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest
import typer
from pydantic import BaseModel

from gtep.cli import app
from tests.docs.test_docs import PAGES

ROOT = Path(__file__).resolve().parents[2]
CLI = ROOT / "docs" / "cli.md"
CONFIGURATION = ROOT / "docs" / "configuration.md"
OPTION = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*|-[a-zA-Z])\b")
COMMAND = re.compile(r"`gtep ([a-z]+)(?: ([a-z]+))?")


@functools.cache
def options_of(*path: str) -> set[str]:
    group = typer.main.get_command(app)
    command, context = group, group.context_class(group, info_name="gtep")
    for name in path:
        command = command.get_command(context, name)
        assert command is not None, f"no command gtep {' '.join(path)}"
    return {opt for param in command.params for opt in [*param.opts, *param.secondary_opts]} | {"--help"}


@functools.cache
def subcommands(name: str) -> set[str]:
    group = typer.main.get_command(app)
    command = group.get_command(group.context_class(group, info_name="gtep"), name)
    return set(command.list_commands(None)) if hasattr(command, "list_commands") else set()


def table_rows(text: str) -> list[list[str]]:
    return [[cell.strip() for cell in line.strip().strip("|").split("|")] for line in text.splitlines()
            if line.startswith("|") and not set(line) <= set("|-: ")]


def test_the_study_options_table_is_each_commands_help():
    rows = table_rows(CLI.read_text())
    header = next(i for i, row in enumerate(rows) if row[:4] == ["option", "`tune`", "`evaluate`", "`run`"])
    commands = [cell.strip("`") for cell in rows[header][1:4]]
    wrong = []
    body = rows[header + 1:]
    for row in body[:next((i for i, r in enumerate(body) if r[1] not in ("yes", "no")), len(body))]:
        for command, cell in zip(commands, row[1:4]):
            for option in OPTION.findall(row[0]):
                if (option in options_of(command)) != (cell == "yes"):
                    wrong.append(f"{option} on gtep {command}: the table says {cell}")
    assert len(body) > 8 and not wrong, wrong
    listed = {o for row in body for o in OPTION.findall(row[0])}
    missing = {c: sorted(options_of(c) - listed - {"--help"}) for c in commands}
    assert not any(missing.values()), f"options of these commands the table does not list: {missing}"


def test_options_in_a_command_row_are_that_commands():
    """`| \\`gtep matrix\\` | ... (\\`--check\\`, ...)`: each option belongs to the command named last before it."""
    wrong = []
    for row in table_rows(CLI.read_text()):
        text = " ".join(row)
        command: tuple[str, ...] | None = None
        for match in re.finditer(rf"{COMMAND.pattern}|{OPTION.pattern}", text):
            if match.group(1):
                command = (match.group(1),) + ((match.group(2),) if match.group(2) in subcommands(match.group(1))
                                               else ())
            elif command is not None and match.group(3) not in options_of(*command):
                wrong.append(f"{match.group(3)} is not an option of gtep {' '.join(command)}: {text[:80]}")
    assert not wrong, wrong


INLINE = re.compile(r"(?<!`)`((?:\.venv/bin/)?gtep [^`]+)`(?!`)")


def inline_commands() -> list[tuple[str, str]]:
    found = []
    for page in PAGES:
        for number, line in enumerate(page.read_text().splitlines(), start=1):
            found += [(f"{page.relative_to(ROOT)}:{number}", m.group(1)) for m in INLINE.finditer(line)
                      if not line.lstrip().startswith(("```", "#"))]
    return found


@pytest.mark.parametrize("where, command", inline_commands())
def test_inline_commands_name_real_options(where, command):
    """Prose names a command and some of its options (`gtep evaluate --sets all`, `gtep report --matrix`), not always
    a whole command line: the command must exist and each option named must be one of its own."""
    words = command.split()[1:]
    if not words or not re.fullmatch(r"[a-z]+", words[0]):
        return  # `gtep --help`, `gtep COMMAND --help`
    path = (words[0],) + ((words[1],) if len(words) > 1 and words[1] in subcommands(words[0]) else ())
    options = options_of(*path)
    wrong = [w.split("=")[0] for w in words if w.startswith("-") and w.split("=")[0] not in options]
    assert not wrong, f"{where}: `{command}`: gtep {' '.join(path)} has no option {wrong}"


# ---------------------------------------------------------------- settings and environment variables

def field_paths(model: type[BaseModel], prefix: str = "") -> list[str]:
    from gtep.config.scenario import SECTIONS

    paths = []
    for name, info in model.model_fields.items():
        path = f"{prefix}{name}"
        paths.append(path)
        nested = [t for t in (info.annotation, *getattr(info.annotation, "__args__", ())) if isinstance(t, type)
                  and issubclass(t, BaseModel)]
        if nested and not (prefix == "scenario." and name in SECTIONS):  # a family's section: its own page
            for sub in nested:
                paths += field_paths(sub, f"{path}.")
    return paths


def test_every_setting_is_in_configuration_md():
    from gtep.config import ExperimentConfig

    text = CONFIGURATION.read_text()
    paths = field_paths(ExperimentConfig)
    assert "compute.simulate_gpus" in paths and len(paths) > 60
    # a field is written as its path's last parts, as the tables do (`split.dataset` in the datasets table)
    missing = [p for p in paths if not any(f"`{'.'.join(p.split('.')[i:])}`" in text for i in range(p.count(".") + 1))]
    assert not missing, f"settings docs/configuration.md does not describe: {missing}"


ENV_CALLS = {("os", "getenv"), ("environ", "get"), ("environ", "pop"), ("environ", "setdefault")}


def environment_variables_read() -> set[str]:
    """Names read through os.environ.get / os.getenv / os.environ[...] / `in os.environ` in gtep/, constants
    included (PLUGINS_ENV = "GTEP_PLUGINS"), and the ${VAR}s of the shipped presets."""
    names: set[str] = set()
    for path in (ROOT / "gtep").rglob("*.py"):
        tree = ast.parse(path.read_text())
        constants = {t.id: n.value.value for n in ast.walk(tree) if isinstance(n, ast.Assign)
                     and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str)
                     for t in n.targets if isinstance(t, ast.Name)}
        tuples = {t.id: [e.value for e in n.value.elts if isinstance(e, ast.Constant)] for n in ast.walk(tree)
                  if isinstance(n, ast.Assign) and isinstance(n.value, ast.Tuple) for t in n.targets
                  if isinstance(t, ast.Name)}

        def value(node: ast.AST) -> list[str]:
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                return [node.value]
            if isinstance(node, ast.Name):
                return [constants[node.id]] if node.id in constants else []
            return []

        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args:
                owner = node.func.value
                owner_name = owner.attr if isinstance(owner, ast.Attribute) else getattr(owner, "id", "")
                if (owner_name, node.func.attr) in ENV_CALLS and node.func.attr != "setdefault":
                    names.update(value(node.args[0]))
            elif isinstance(node, ast.Subscript) and getattr(node.value, "attr", getattr(node.value, "id", "")) \
                    == "environ":
                names.update(value(node.slice))
            elif isinstance(node, ast.Compare) and any(isinstance(op, ast.In) for op in node.ops) and \
                    getattr(node.comparators[0], "attr", getattr(node.comparators[0], "id", "")) == "environ":
                names.update(value(node.left))
            elif isinstance(node, ast.For) and isinstance(node.iter, ast.Name) and node.iter.id in tuples:
                if "environ" in ast.unparse(node):
                    names.update(tuples[node.iter.id])
            elif isinstance(node, ast.comprehension) and isinstance(node.iter, ast.Name) and node.iter.id in tuples:
                names.update(tuples[node.iter.id])
    for preset in (ROOT / "gtep" / "presets").rglob("*.yaml"):
        names.update(re.findall(r"\$\{([A-Z][A-Z0-9_]*)\}", preset.read_text()))
    return {n for n in names if re.fullmatch(r"[A-Z][A-Z0-9_]+", n)}


def test_every_environment_variable_is_in_configuration_md():
    names = environment_variables_read()
    assert {"GTEP_CACHE", "GTEP_PLUGINS", "MINIIMAGENET_ROOT", "CIFAR100_ROOT", "MLFLOW_TRACKING_PASSWORD"} <= names
    text = CONFIGURATION.read_text()
    missing = sorted(n for n in names if f"`{n}`" not in text)
    assert not missing, f"environment variables docs/configuration.md does not list: {missing}"


# ---------------------------------------------------------------- what a reader can follow

UNREACHABLE = {
    "../shared": re.compile(r"\.\./shared"),  # the development machine's shared folder, not in the repository
    "an issue number": re.compile(r"\bissues? #?\d+", re.I),  # the project's tracker is not public
    "a notes or papers file": re.compile(r"\b(?:notes \d{3}|papers/[\w-]+\.txt)"),
    "a call of the device tool": re.compile(r"^\s*(?:carry|timeout_s):\s*\[?", re.M),
}


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_pages_point_at_nothing_a_reader_cannot_open(page):
    text = page.read_text()
    found = [f"{what}: {m.group(0)!r} (line {text[:m.start()].count(chr(10)) + 1})"
             for what, pattern in UNREACHABLE.items() for m in pattern.finditer(text)]
    assert not found, f"{page.relative_to(ROOT)} points at what a reader cannot open: {found}"
