"""gtep users add | password | grant: the users of a tracking server started with `gtep server --auth`, and
their permissions on a study (its experiment gtep/<study>).

The caller authenticates as any MLflow client does (MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD or
~/.mlflow/credentials). A new password is typed at a hidden prompt or piped to --password-stdin, never given as
an argument: an argument stays in the shell's history and in every process listing."""
from __future__ import annotations

import sys
from typing import Optional

import typer

from gtep.cli.common import console, run_guarded

app = typer.Typer(help="Users of a tracking server (gtep server --auth) and their permissions on studies.",
                  no_args_is_help=True)

ServerUriOpt = typer.Option(None, "--tracking-uri", help="the tracking server, http://HOST:PORT")
PasswordStdinOpt = typer.Option(False, "--password-stdin",
                                help="read the new password from the first line of standard input (scripts)")


def new_password(username: str, from_stdin: bool) -> str:
    """The new password, from stdin's first line or a hidden prompt typed twice; never echoed."""
    if from_stdin:
        return sys.stdin.readline().rstrip("\r\n")
    return str(typer.prompt(f"new password for {username}", hide_input=True, confirmation_prompt=True,
                            err=True))


@app.command()
def add(username: str = typer.Argument(..., help="the new user's name"),
        tracking_uri: Optional[str] = ServerUriOpt, password_stdin: bool = PasswordStdinOpt) -> None:
    """Add a user (an admin's credentials). New users can read every study (the server's default permission)
    and write only the studies they start or are granted EDIT on."""
    run_guarded(lambda: with_new_password(username, tracking_uri, password_stdin, "add_user",
                                          "user {username} added to {uri}"))


@app.command()
def password(username: str = typer.Argument(..., help="whose password (an admin sets anyone's, a user their own)"),
             tracking_uri: Optional[str] = ServerUriOpt, password_stdin: bool = PasswordStdinOpt) -> None:
    """Set a user's password. Afterwards put the new one where that user's credentials live
    (MLFLOW_TRACKING_PASSWORD or ~/.mlflow/credentials)."""
    run_guarded(lambda: with_new_password(username, tracking_uri, password_stdin, "set_password",
                                          "password of {username} set on {uri}"))


def with_new_password(username: str, tracking_uri: Optional[str], password_stdin: bool, action: str,
                      done: str) -> None:
    """`add` and `password`: the server, the name and the new password checked before the server is asked, then
    tracking_users.<action>(auth client, uri, username, password) and the line saying it was done."""
    from gtep.orchestration import tracking_users as users

    uri = users.check_server(tracking_uri)
    users.check_username(username)
    users.check_answers(uri)
    secret = users.check_password(new_password(username, password_stdin), username)
    auth, _ = users.clients(uri)
    getattr(users, action)(auth, uri, username, secret)
    console.print(done.format(username=username, uri=uri), highlight=False)


@app.command()
def grant(username: str = typer.Argument(..., help="the user"),
          study: str = typer.Argument(..., help="the study's name (experiment gtep/<study>)"),
          permission: str = typer.Argument(..., help="READ, EDIT or MANAGE"),
          tracking_uri: Optional[str] = ServerUriOpt) -> None:
    """Give a user READ (see the study), EDIT (also run its phases) or MANAGE (also grant on it, rename and
    delete it) on one study; it replaces what the user had there. Takes MANAGE on the study or an admin."""
    def go() -> None:
        from gtep.orchestration import tracking_users as users

        uri = users.check_server(tracking_uri)
        chosen = users.check_permission(permission)
        users.check_username(username)
        users.check_answers(uri)
        auth, tracking = users.clients(uri)
        users.grant(auth, tracking, uri, username, study, chosen)
        console.print(f"{username} has {chosen} on study {study} (experiment gtep/{study}) of {uri}", highlight=False)
    run_guarded(go)


__all__ = ["app"]
