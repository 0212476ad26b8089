"""The gtep command line: parse, validate everything, then call one function.

gtep run | tune | evaluate           the protocol's phases on Ray Tune, tracked in MLflow    (cli/study.py)
gtep pretrain                        backbone weights from held-out classes                  (cli/pretrain.py)
gtep check                           the pre-flight checks alone, and the plan            (cli/check.py)
gtep ui | server | sync              the MLflow side                                         (cli/tracking.py)
gtep users add | password | grant    a tracking server's users and their grants on studies   (cli/users.py)
gtep submit | jobs ...               studies as Ray Jobs on a cluster                        (cli/cluster.py)
gtep algorithms | spaces | presets   what is registered                                      (cli/info.py)
gtep report                          the paper's tables and figures from MLflow              (cli/report.py)
gtep replay                          a finished study through a cheaper rule, trains nothing (cli/replay.py)
gtep matrix | matrices               algorithms x scenarios x dataset pairings, one study per cell (cli/matrix.py)

Each command module has a Typer app of its own and imports only cli/common.py (options, consoles, the error exit);
this module merges them into `app`, the `gtep` entry point, in the order `gtep --help` lists them.
Its group, ReadableGroup, makes every command's help read as prose (readable_help).
"""
from __future__ import annotations

import re
from typing import Any

import typer
from rich.markup import escape
from typer.core import TyperGroup

from gtep.cli import check, cluster, data, info, matrix, pretrain, replay, report, study, tracking, users


def reflowed(text: str | None) -> str | None:
    """`text` with each paragraph on one line, as plain text. A docstring breaks its lines where the source file
    ends them, and typer's rich help keeps those breaks, so a description stopped mid-sentence at one width and
    ran on at another; rich wraps a paragraph at the terminal's width once it is one line. Typer reads help as
    rich markup, where a hint such as [sets search.scheduler] is a style tag and vanished: escaped, it shows."""
    if text is None:
        return None
    paragraphs = re.split(r"\n\s*\n", text.strip())
    return escape("\n\n".join(" ".join(line.strip() for line in paragraph.splitlines()) for paragraph in paragraphs))


def readable_help(command: Any) -> None:
    """Make `command`'s help, and its subcommands', read as prose: paragraphs wrapped by the terminal, every
    bracketed hint shown, and flags without a value placeholder. Typer's rich help prints a type after every
    option, a flag's too (`--calibrate <bool>`), which reads as if the flag took a value; an empty metavar leaves
    the type column blank."""
    command.help = reflowed(command.help)
    # the --help option is made on first use; made here (with the default names) so it is quieted as well
    for param in command.get_params(typer.Context(command)):
        if getattr(param, "help", None):
            param.help = reflowed(param.help)
        if getattr(param, "is_flag", False):
            param.metavar = ""
    for subcommand in getattr(command, "commands", {}).values():
        readable_help(subcommand)


class ReadableGroup(TyperGroup):
    """The `gtep` group: Typer builds it (and every command under it) afresh on each call, then this makes the
    help of all of them readable."""

    def __init__(self, **attrs: Any) -> None:
        super().__init__(**attrs)
        readable_help(self)


app = typer.Typer(cls=ReadableGroup, add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="GTEP: tune continual-learning hyperparameters on one scenario, "
                       "evaluate them on a disjoint one.")


def version_option(value: bool) -> None:
    """--version: the installed distribution's version (what pip installed), then exit."""
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            typer.echo(f"gtep {version('gtep')}")
        except PackageNotFoundError:  # imported from a source tree that was never installed
            from gtep import __version__

            typer.echo(f"gtep {__version__} (not installed)")
        raise typer.Exit()


@app.callback()
def main(_version: bool = typer.Option(False, "--version", callback=version_option, is_eager=True,
                                       help="Print gtep's version and exit.")) -> None:
    pass


for commands in (study.app, check.app, pretrain.app, tracking.app, cluster.app, info.app, report.app, replay.app,
                 matrix.app):
    app.add_typer(commands)
app.add_typer(cluster.jobs_app, name="jobs")
app.add_typer(users.app, name="users")
app.add_typer(data.app, name="data")

__all__ = ["app"]
