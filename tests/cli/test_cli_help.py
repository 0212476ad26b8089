"""`gtep --help` and every command's help read as a person reads them (issue 45, item 5): a flag shows no value
placeholder (`--calibrate <bool>` read as if it took a value), every command's summary in `gtep --help` is one
complete sentence on one line, and the help's paragraphs break only where the terminal's width makes them (a
docstring's own line breaks stopped descriptions mid-sentence)."""
from __future__ import annotations

import re
from typing import Any

import pytest
import typer
import typer.main
from typer.testing import CliRunner

from gtep.cli import app

WIDTH = 100  # columns the help is rendered at: rich reads COLUMNS when its output is not a terminal
BORDER = "│"


def command_paths(command: Any, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every command under `command` (the group itself included), as the words typed before --help."""
    paths = [path]
    for name, sub in getattr(command, "commands", {}).items():
        paths += command_paths(sub, (*path, name))
    return paths


def command_at(path: tuple[str, ...]) -> Any:
    command = typer.main.get_command(app)
    for name in path:
        command = command.commands[name]
    return command


def rendered_help(path: tuple[str, ...]) -> str:
    result = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": str(WIDTH), "TERMINAL_WIDTH": None})
    assert result.exit_code == 0, result.output
    return result.output


PATHS = command_paths(typer.main.get_command(app))


def test_every_command_is_covered() -> None:
    assert {"check", "tune", "report", "jobs"} <= {path[0] for path in PATHS if path}
    assert ("jobs", "status") in PATHS


@pytest.mark.parametrize("path", PATHS, ids=lambda path: " ".join(("gtep", *path)))
def test_a_flag_shows_no_value_placeholder(path: tuple[str, ...]) -> None:
    text = rendered_help(path)
    command = command_at(path)
    # typer's parameters are its own (a fork of click's): a flag is an option with is_flag
    params = command.get_params(typer.Context(command))
    flags = [opt for p in params if getattr(p, "is_flag", False) for opt in p.opts if opt.startswith("--")]
    assert "--help" in flags
    for flag in flags:
        row = next(line for line in text.splitlines() if re.search(rf"{re.escape(flag)}(?![\w-])", line))
        after = row.split(flag, 1)[1]
        assert not re.match(r"[\s,\-\w]*<", after), f"gtep {' '.join(path)}: {flag} reads as taking a value: {row}"
    assert "<bool>" not in text and "BOOLEAN" not in text, text


def test_an_option_that_takes_a_value_still_says_which() -> None:
    text = rendered_help(("check",))
    assert re.search(r"--trials\s+<int>", text) and re.search(r"--calibrate\s+time a few", text), text


def summaries(text: str) -> dict[str, list[str]]:
    """The Commands panel of a group's help: each command's summary, as the lines it takes."""
    panel = text[text.index("─ Commands ─"):]
    rows: dict[str, list[str]] = {}
    for line in panel.splitlines()[1:]:
        if not line.startswith(BORDER):
            break
        cells = line.strip(f" {BORDER}")
        name = line[2:].split(" ", 1)[0]
        if name:  # a command's first line; a continuation starts with blanks under the names
            rows[name] = [cells[len(name):].strip()]
        else:
            list(rows.values())[-1].append(cells)
    return rows


@pytest.mark.parametrize("group", [(), ("jobs",)], ids=["gtep", "gtep jobs"])
def test_every_summary_is_one_complete_sentence_on_one_line(group: tuple[str, ...]) -> None:
    rows = summaries(rendered_help(group))
    assert set(rows) == set(command_at(group).commands)
    for name, lines in rows.items():
        summary = " ".join(lines)
        assert len(lines) == 1, f"{name}: the summary takes {len(lines)} lines: {summary!r}"
        assert summary[:1].isupper() and summary.endswith(".") and not summary.endswith(".."), (name, summary)


def description(text: str) -> list[list[str]]:
    """The help's prose between the usage line and the first panel, as paragraphs of rendered lines."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip().startswith("Usage:")) + 1
    end = next(i for i, line in enumerate(lines) if line.lstrip().startswith("╭"))
    paragraphs: list[list[str]] = [[]]
    for line in lines[start:end]:
        if line.strip():
            paragraphs[-1].append(line.strip())
        elif paragraphs[-1]:
            paragraphs.append([])
    return [p for p in paragraphs if p]


@pytest.mark.parametrize("path", PATHS, ids=lambda path: " ".join(("gtep", *path)))
def test_the_help_breaks_a_line_only_where_the_next_word_would_not_fit(path: tuple[str, ...]) -> None:
    """A line ends early only when the next word would not have fitted on it: a break the docstring made (in the
    middle of a sentence, wherever the source file's line ended) leaves room the next word would have taken."""
    text = rendered_help(path)
    room = WIDTH - 2  # rich pads the help text by one column on each side
    for paragraph in description(text):
        for line, following in zip(paragraph, paragraph[1:]):
            next_word = following.split(" ", 1)[0]
            assert len(line) + 1 + len(next_word) > room, (
                f"gtep {' '.join(path)} --help breaks after {line!r} though {next_word!r} fits:\n{text}")


@pytest.mark.parametrize("path", PATHS, ids=lambda path: " ".join(("gtep", *path)))
def test_every_bracketed_hint_of_an_option_shows(path: tuple[str, ...]) -> None:
    """Typer reads help as rich markup, where `[sets search.scheduler]` or `[sqlite:///<output>/mlflow.db]` is a
    style tag: the default or the config field an option sets vanished from the help."""
    text = " ".join(rendered_help(path).replace(BORDER, " ").split())
    source = typer.main.get_command(app)
    for name in path:
        source = source.commands[name]
    for param in source.params:
        declared = (getattr(param, "help", None) or "").replace("\\[", "[")  # as written, without rich's escapes
        for hint in re.findall(r"\[[^\]]*\]", declared):
            assert " ".join(hint.split()) in text, f"gtep {' '.join(path)} {param.opts[0]}: {hint} is not shown"
