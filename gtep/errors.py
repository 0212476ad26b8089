"""Errors that end a command with a result that must not be read as complete (not bad input: ConfigError)."""
from __future__ import annotations


class StudyStopped(RuntimeError):
    """A phase ended without a complete result: interrupted, or with missing orderings or sets.

    The command prints the message (which says what to do next) and exits with `exit_code`."""

    exit_code: int = 1

    def __init__(self, message: str, exit_code: int | None = None) -> None:
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code

    def describe(self, command: str) -> str:
        """The message as the command `gtep <command>` prints it (a resume hint names the command)."""
        return str(self)
