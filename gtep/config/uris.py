"""The one rule for a tracking or store address: a scheme compared as URL parsers compare it (case-insensitive),
and no secret in its user-info part, ever.

A tracking address is written wherever gtep writes anything about a study (its folder, MLflow's tags, the
terminal, Ray's logs), so a `user:PASSWORD@` in it would land in all of those while MLflow still sent it to the
server. Every command, the Python API and every address read back from a study folder go through
`check_no_userinfo` (tracking addresses: gtep.config.checks.check_tracking_uri calls it); every message that
repeats an address goes through `redact_uri`. Credentials belong in MLFLOW_TRACKING_USERNAME /
MLFLOW_TRACKING_PASSWORD or ~/.mlflow/credentials (a database's in PGPASSWORD or ~/.pgpass)."""
from __future__ import annotations

import re

from gtep.config.base import ConfigError

REDACTED = "***"
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
SERVER_SCHEMES = ("http", "https")


def scheme(uri: str) -> str:
    """The address's scheme in lower case ('' for a plain path): `HTTP://h` is http, as for urllib and requests."""
    match = _SCHEME.match(uri)
    return match.group(1).lower() if match else ""


def is_server(uri: str) -> bool:
    """An MLflow tracking server (http or https, in any letter case)."""
    return scheme(uri) in SERVER_SCHEMES


def _netloc(uri: str) -> str:
    if not _SCHEME.match(uri):
        return ""
    rest = uri.split("://", 1)[1]
    return re.split(r"[/?#]", rest, maxsplit=1)[0]


def has_userinfo(uri: str) -> bool:
    return "@" in _netloc(uri)


def has_password(uri: str) -> bool:
    netloc = _netloc(uri)
    return "@" in netloc and ":" in netloc.rsplit("@", 1)[0]


def redact_uri(uri: str) -> str:
    """The address with any password in it (scheme://user:PASSWORD@host) replaced by ***; the rest as given."""
    netloc = _netloc(uri)
    if "@" not in netloc:
        return uri
    userinfo, host = netloc.rsplit("@", 1)
    user = userinfo.split(":", 1)[0]
    masked = f"{user}:{REDACTED}@{host}" if ":" in userinfo else netloc
    head = uri.split("://", 1)[0]
    return f"{head}://{masked}{uri.split('://', 1)[1][len(netloc):]}"


def redact_uris(text: str) -> str:
    """`text` with the password of every address in it masked (a library's message that repeats one)."""
    return re.sub(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"]+", lambda m: redact_uri(m.group(0)), text)


def check_no_userinfo(uri: str, field: str) -> str:
    """Refuse an address with a password in it (any scheme), or with any user-info for a tracking server (its user
    comes from MLflow's variables or credentials file); the message shows the address with the password masked."""
    if has_password(uri) or (is_server(uri) and has_userinfo(uri)):
        database = scheme(uri).split("+")[0] in ("postgresql", "mysql", "mssql")
        where = ("PGPASSWORD or ~/.pgpass (PostgreSQL), or the server's environment" if database
                 else "MLFLOW_TRACKING_USERNAME/MLFLOW_TRACKING_PASSWORD or ~/.mlflow/credentials")
        raise ConfigError(field, f"{redact_uri(uri)} carries a password or user in the address: give the address "
                          f"without 'user:password@' and put the credentials in {where}")
    return uri

