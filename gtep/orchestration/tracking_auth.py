"""Who a tracking server takes us for: the user's credentials checked once before any compute, and kept out of
everything gtep prints or writes.

MLflow's client finds the credentials itself (MLFLOW_TRACKING_USERNAME + MLFLOW_TRACKING_PASSWORD, or
MLFLOW_TRACKING_TOKEN, or the [mlflow] section of ~/.mlflow/credentials) on every request; gtep never copies
them anywhere: not into params or tags, the study folder, a Ray runtime_env or a message. Trials need none: the
driver is the one writer to MLflow (DESIGN.md), trials report to Ray Tune. A server with MLflow's basic-auth app
answers 401 to a wrong or missing credential and 403 to a user without the permission; both become one
ConfigError here instead of a minute of retries and a "does not answer".
"""
from __future__ import annotations

import configparser
import os
from pathlib import Path

from gtep.config import ConfigError
from gtep.config.uris import REDACTED, check_no_userinfo, redact_uri, redact_uris

SECRET_VARIABLES = ("MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_TOKEN", "MLFLOW_AUTH_ADMIN_PASSWORD")
CREDENTIALS_FILE = Path("~/.mlflow/credentials")
CHECK_TIMEOUT_S = 10
WRITER_TAG = "gtep.writer"  # who last started a phase of the study: the write that proves EDIT


def credentials_file() -> Path:
    return CREDENTIALS_FILE.expanduser()


def file_credentials() -> tuple[str | None, str | None]:
    """(username, password) from ~/.mlflow/credentials as MLflow reads it, or (None, None)."""
    path = credentials_file()
    parser = configparser.ConfigParser()
    try:
        parser.read(path)
    except (OSError, configparser.Error):
        return None, None
    if "mlflow" not in parser:
        return None, None
    section = parser["mlflow"]
    return section.get("mlflow_tracking_username"), section.get("mlflow_tracking_password")


def username() -> str | None:
    return os.environ.get("MLFLOW_TRACKING_USERNAME") or file_credentials()[0]


def credential_source() -> str:
    """Where MLflow's client takes the credentials from, in words for an error message (never their values)."""
    user = os.environ.get("MLFLOW_TRACKING_USERNAME")
    if user and os.environ.get("MLFLOW_TRACKING_PASSWORD"):
        return f"MLFLOW_TRACKING_USERNAME/MLFLOW_TRACKING_PASSWORD (user {user!r})"
    if os.environ.get("MLFLOW_TRACKING_TOKEN"):
        return "MLFLOW_TRACKING_TOKEN"
    file_user, file_password = file_credentials()
    if file_user and file_password:
        return f"{credentials_file()} (user {file_user!r})"
    return ("no credentials (MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD are not set and there is no "
            f"{credentials_file()})")


def secrets() -> list[str]:
    """Every secret this process could hold: what redact() takes out of a message."""
    found = [os.environ.get(name, "") for name in SECRET_VARIABLES]
    found.append(file_credentials()[1] or "")
    return [secret for secret in found if secret]


def redact(text: str, uri: str | None = None) -> str:
    """`text` with the known secrets and any password in an address replaced by ***."""
    for secret in sorted(secrets(), key=len, reverse=True):
        text = text.replace(secret, REDACTED)
    if uri is not None:
        text = text.replace(uri, redact_uri(uri))
    return redact_uris(text)


def refuse_password_in_uri(uri: str, option: str) -> None:
    """A password in the tracking address would be written wherever the address is: the study folder, MLflow's
    tags, the terminal. It belongs in MLflow's variables or credentials file (gtep.config.uris: the one rule)."""
    check_no_userinfo(uri, option)


def _request(uri: str, endpoint: str, method: str, **body):
    """One request with the credentials MLflow's client would send, no retry (a refusal is final)."""
    from mlflow.utils.credentials import get_default_host_creds
    from mlflow.utils.rest_utils import http_request

    kwargs = {"params": body} if method == "GET" else {"json": body}
    return http_request(get_default_host_creds(uri), endpoint, method, max_retries=0, timeout=CHECK_TIMEOUT_S,
                        raise_on_status=False, **kwargs)


def check_credentials(uri: str, option: str = "--tracking-uri") -> None:
    """A server that refuses who we are (401) is one error now, naming where the credentials came from. A
    server without authentication answers 200; one that does not answer is check_tracking's business.
    `uri` is a tracking server's address its caller has checked (gtep.config.uris) and classified (is_server):
    the address is not passed back there from here."""
    try:
        response = _request(uri, "/api/2.0/mlflow/experiments/search", "GET", max_results=1)
    except Exception:  # noqa: BLE001 - a server that is away: reported by the caller's own check
        return
    if response.status_code == 401:
        raise ConfigError(option, f"the MLflow server at {uri} refused the credentials from {credential_source()}; "
                          "set MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD (or ~/.mlflow/credentials) "
                          "to your user and password on that server")


def check_can_write(uri: str, study: str, experiment_id: str) -> None:
    """The user may write the study's experiment (EDIT or MANAGE) on the tracking server at `uri` (checked and
    classified by the caller, as for check_credentials): found by writing one experiment tag, the smallest write,
    at the phase's start (before Ray trains anything)."""
    response = _request(uri, "/api/2.0/mlflow/experiments/set-experiment-tag", "POST",
                        experiment_id=experiment_id, key=WRITER_TAG, value=username() or "")
    if response.status_code == 401:
        check_credentials(uri)  # the same one-line error as a phase's first check
    if response.status_code == 403:
        raise ConfigError("--tracking-uri", f"the user of {credential_source()} may not write study {study!r} "
                          f"(experiment gtep/{study}) on {uri}: it needs EDIT; its owner or an admin grants it with "
                          f"gtep users grant <user> {study} EDIT --tracking-uri {uri}")


def refusal(err: BaseException) -> int | None:
    """401 or 403 when `err` is MLflow's client reporting the server's refusal, else None."""
    code = getattr(err, "error_code", "")
    if code in ("UNAUTHENTICATED", "PERMISSION_DENIED"):
        return 401 if code == "UNAUTHENTICATED" else 403
    text = str(err)
    return next((status for status in (401, 403) if f"error code {status}" in text), None)


def refusal_error(err: BaseException, uri: str, study: str) -> ConfigError | None:
    """The one-line error for a refusal met while finding or creating the study's experiment (None otherwise)."""
    status = refusal(err)
    if status == 401:
        return ConfigError("--tracking-uri", f"the MLflow server at {uri} refused the credentials from "
                           f"{credential_source()}; set MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD")
    if status == 403:
        return ConfigError("--tracking-uri", f"the user of {credential_source()} may not read or create study "
                           f"{study!r} (experiment gtep/{study}) on {uri}; its owner or an admin grants READ or "
                           "EDIT with gtep users grant")
    return None
