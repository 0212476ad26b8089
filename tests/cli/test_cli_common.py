"""The shared part of the command line: how a command's errors reach the terminal (gtep/cli/common.py)."""
import pytest
import typer

from gtep.cli.common import fail, run_guarded
from gtep.config import ConfigError
from gtep.errors import StudyStopped


def raising(error: Exception):
    def body():
        raise error
    return body


def test_bad_input_is_one_line_with_its_brackets_and_status_2(capsys):
    with pytest.raises(typer.Exit) as exited:
        run_guarded(raising(ConfigError("search.space", "lr: choose from [0.1, 0.01] or [bold]")))
    assert exited.value.exit_code == 2
    assert capsys.readouterr().err.strip() == "error: search.space: lr: choose from [0.1, 0.01] or [bold]"


def test_a_stopped_study_exits_with_its_own_code_and_message(capsys):
    with pytest.raises(typer.Exit) as exited:
        run_guarded(raising(StudyStopped("2 orderings missing: rerun with --resume out/[study]", exit_code=3)))
    assert exited.value.exit_code == 3
    assert capsys.readouterr().err.strip() == "stopped: 2 orderings missing: rerun with --resume out/[study]"


def test_a_stopped_study_is_never_a_success_by_default():
    with pytest.raises(typer.Exit) as exited:
        run_guarded(raising(StudyStopped("interrupted")))
    assert exited.value.exit_code == 1


def test_other_errors_are_not_swallowed():
    with pytest.raises(ZeroDivisionError):
        run_guarded(lambda: 1 / 0)


def test_fail_escapes_markup(capsys):
    with pytest.raises(typer.Exit):
        fail("pip install 'gtep[server]'")
    assert capsys.readouterr().err.strip() == "error: pip install 'gtep[server]'"
