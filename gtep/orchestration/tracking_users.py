"""`gtep users`: the users of a tracking server with MLflow's basic-auth app, and who may do what on a study.

A study is the experiment gtep/<study>; a grant gives one user READ, EDIT or MANAGE on it (docs/cluster.md says
what each allows). The caller is whoever MLflow's credentials name (tracking_auth): an admin adds users and sets
anyone's password; a study's MANAGE holder (its creator, by MLflow's rule) grants on it. Passwords pass through
here to the server and nowhere else."""
from __future__ import annotations

import functools
import os
import re
from typing import Any, Protocol

from gtep.config import ConfigError
from gtep.config.uris import is_server
from gtep.orchestration.tracking import experiment_name
from gtep.orchestration.tracking_auth import (
    credential_source,
    file_credentials,
    refusal,
    refuse_password_in_uri,
)
from gtep.orchestration.tracking_auth import username as tracking_username

PERMISSIONS = ("READ", "EDIT", "MANAGE")


class AuthClient(Protocol):
    """The part of MLflow's AuthServiceClient (mlflow.server.get_app_client("basic-auth", uri)) used here."""

    def create_user(self, username: str, password: str) -> Any: ...

    def update_user_password(self, username: str, password: str, *args: Any, **kwargs: Any) -> Any: ...


class ExperimentFinder(Protocol):
    def get_experiment_by_name(self, name: str) -> Any: ...


def check_server(uri: str | None) -> str:
    if uri:
        refuse_password_in_uri(uri, "--tracking-uri")  # first: no message below may repeat a password
    if not uri or not is_server(uri):
        raise ConfigError("--tracking-uri", "give the tracking server's address (http://HOST:5000): users live on "
                          "a server started with gtep server --auth, not in a local store")
    return uri.rstrip("/")


def check_answers(uri: str) -> None:
    """The server answers within seconds, and takes our credentials, before anything is asked or typed (MLflow's
    client would retry a server that does not answer for two minutes, in silence); as gtep ui and replay do."""
    from gtep.orchestration.tracking_store import check_tracking

    check_tracking(uri)


def check_username(username: str) -> str:
    """A name HTTP basic authentication can carry and a terminal shows as it is: not empty, no ':' (it ends the
    name), no spaces, no control characters (an escape sequence in a name would rewrite an admin's terminal)."""
    if not username or ":" in username or any(c.isspace() or not c.isprintable() for c in username):
        shown = username.encode("unicode_escape").decode("ascii")
        raise ConfigError("USERNAME", f"'{shown}' cannot be a user name: use letters, digits, '.', '_', '-' or "
                          "'@', without ':', spaces or control characters")
    return username


MIN_PASSWORD = 12  # MLflow's own minimum
MIN_DISTINCT = 5  # 'aaaaaaaaaaaa' and 'abcabcabcabc' are 12 characters too
LEET = str.maketrans("@4310$5!7", "aaeiossit")


@functools.lru_cache(maxsize=1)
def common_passwords() -> frozenset[str]:
    """The common passwords and stems shipped in the package (gtep/data/bundled/common_passwords.txt)."""
    from importlib import resources

    text = resources.files("gtep.data").joinpath("bundled/common_passwords.txt").read_text()
    return frozenset(line.strip().lower() for line in text.splitlines() if line.strip() and not line.startswith("#"))


def is_common(password: str) -> bool:
    """One of the common passwords, or one of their stems with digits or symbols around it and letters written
    as digits or symbols, in any letter case: P@ssw0rd2024! is 'password'."""
    lowered = password.lower()
    stem = re.sub(r"^[^a-z]+|[^a-z]+$", "", lowered).translate(LEET)
    return lowered in common_passwords() or stem in common_passwords()


def check_password(password: str, username: str) -> str:
    """A password a guesser does not try first: MLflow takes any 12 characters, 'aaaaaaaaaaaa' included, and never
    slows repeated wrong logins down (docs/cluster.md: rate-limit them at the proxy). Never repeated in the error."""
    if not password:
        raise ConfigError("password", "the new password is empty; type one at the prompt or pipe it to "
                          "--password-stdin")
    fix = "; choose a longer, less guessable one (a few unrelated words)"
    if len(password) < MIN_PASSWORD:
        raise ConfigError("password", f"the new password has {len(password)} characters, fewer than "
                          f"{MIN_PASSWORD}{fix}")
    if len(set(password)) < MIN_DISTINCT:
        raise ConfigError("password", f"the new password repeats fewer than {MIN_DISTINCT} different characters{fix}")
    if username.lower() in password.lower():
        raise ConfigError("password", f"the new password contains the user name{fix}")
    if is_common(password):
        raise ConfigError("password", f"the new password is a common one (or one with digits added){fix}")
    return password


def check_permission(permission: str) -> str:
    chosen = permission.upper()
    if chosen not in PERMISSIONS:
        raise ConfigError("PERMISSION", f"{permission!r} is not one of {', '.join(PERMISSIONS)} (READ: see the "
                          "study; EDIT: also run its phases; MANAGE: also grant on it and delete it)")
    return chosen


def study_experiment_id(finder: ExperimentFinder, study: str, uri: str) -> str:
    name = experiment_name(study)
    try:
        experiment = finder.get_experiment_by_name(name)
    except Exception as err:  # noqa: BLE001 - MLflow's client raises several types for a refusal
        raise server_error(err, uri, f"read study {study!r}") from None
    if experiment is None:
        raise ConfigError("STUDY", f"{uri} has no study {study!r} (experiment {name}); its first phase makes it: "
                          "run it before granting on it")
    return str(experiment.experiment_id)


def server_error(err: BaseException, uri: str, action: str) -> ConfigError:
    """The server's refusal as one line; its own message otherwise (never the request, which holds the secret)."""
    status = refusal(err)
    if status == 401:
        return ConfigError("--tracking-uri", f"{uri} refused the credentials from {credential_source()}")
    if status == 403:
        return ConfigError("--tracking-uri", f"the user of {credential_source()} may not {action} on {uri}: it "
                           "takes an admin (or MANAGE on the study, to grant on it)")
    detail = getattr(err, "message", None) or str(err).splitlines()[0]
    return ConfigError("--tracking-uri", f"{uri} could not {action}: {detail}")


def add_user(client: AuthClient, uri: str, username: str, password: str) -> None:
    try:
        client.create_user(check_username(username), check_password(password, username))
    except ConfigError:
        raise
    except Exception as err:  # noqa: BLE001
        if getattr(err, "error_code", "") == "RESOURCE_ALREADY_EXISTS" or "already exists" in str(err):
            raise ConfigError("USERNAME", f"{username!r} is already a user of {uri}; change its password with "
                              "gtep users password") from None
        raise server_error(err, uri, f"add user {username!r}") from None


def set_password(client: AuthClient, uri: str, username: str, password: str) -> None:
    """An admin sets anyone's; a user changing their own gives their current one (MLflow 3 asks for it), which
    is the password their credentials already hold."""
    check_password(password, check_username(username))
    own = username == tracking_username()
    current = current_password()
    try:
        if own and current:
            try:
                client.update_user_password(username, password, current_password=current)
            except TypeError:  # an MLflow before self-service checks: no current_password argument
                client.update_user_password(username, password)
        else:
            client.update_user_password(username, password)
    except Exception as err:  # noqa: BLE001
        raise server_error(err, uri, f"set the password of {username!r}") from None


def current_password() -> str | None:
    """The caller's password where MLflow's client finds it: the environment, else ~/.mlflow/credentials (the
    one MLflow sends, so a user whose credentials live in the file can change their own password too)."""
    return os.environ.get("MLFLOW_TRACKING_PASSWORD") or file_credentials()[1]


def grant(client: Any, finder: ExperimentFinder, uri: str, username: str, study: str, permission: str) -> str:
    """Give `username` `permission` on the study's experiment (replacing what it had); its experiment id back."""
    chosen = check_permission(permission)
    check_username(username)
    experiment_id = study_experiment_id(finder, study, uri)
    try:
        if hasattr(client, "grant_user_permission"):  # MLflow 3.17: one call for any resource, grant or replace
            client.grant_user_permission(username, "experiment", experiment_id, chosen)
        else:  # MLflow 2.x and early 3.x: create, or update an existing grant
            try:
                client.create_experiment_permission(experiment_id, username, chosen)
            except Exception as err:  # noqa: BLE001
                if "already exists" not in str(err) and getattr(err, "error_code", "") != "RESOURCE_ALREADY_EXISTS":
                    raise
                client.update_experiment_permission(experiment_id, username, chosen)
    except Exception as err:  # noqa: BLE001
        raise server_error(err, uri, f"grant {chosen} on study {study!r} to {username!r}") from None
    return experiment_id


def clients(uri: str) -> tuple[Any, Any]:
    """MLflow's basic-auth client and a tracking client for `uri`, both with the caller's credentials."""
    import warnings

    from mlflow.tracking import MlflowClient

    with warnings.catch_warnings():  # the auth client imports MLflow's FastAPI app: a Starlette deprecation
        warnings.simplefilter("ignore")
        from mlflow.server import get_app_client

        auth = get_app_client("basic-auth", tracking_uri=uri)
    return auth, MlflowClient(tracking_uri=uri)
