"""What a study's terminal shows of its libraries' logs (issue 37): gtep's own lines (the progress bars, the tables,
its warnings and errors) and every library line a user can act on. The lines dropped here say nothing a user
could act on, each for a reason of its own:

- Ray, starting the local cluster gtep starts itself with RAY_AUTH_MODE unset: "Token authentication is enabled
  for this Ray cluster. Set RAY_AUTH_MODE=disabled to opt out." Token authentication is Ray's default and the safe
  one for a cluster that lives as long as the command; gtep keeps it. (Setting RAY_AUTH_MODE=token from gtep would
  also quiet it, but Ray reads its config when imported: on a machine with no ~/.ray/auth_token yet it then makes
  no token and its GCS never starts.) A RAY_AUTH_MODE the user sets is Ray's to honour, and Ray prints nothing.
- Ray Tune, after an interrupted phase: "Failed to fetch metrics for N trial(s): ... FileNotFoundError" for the
  trials that never started (no result.json yet). gtep reads results from its manifest and MLflow, never from
  Tune's ResultGrid, and its own line says how many units finished and how to resume.
- MLflow, creating a study's sqlite store: "Creating initial MLflow database tables..." and "Updating database
  tables" (INFO lines; gtep prints the store's address at the end).
- Optuna, under the Optuna searchers: "A new study created in memory with name: optuna" (Ray's OptunaSearch keeps
  its own in-memory study; gtep's study is the folder and the MLflow experiment).

Tune's "`max_concurrent_trials` will be ignored" is not dropped but avoided: the search algorithm carries
compute.max_concurrent itself (gtep.orchestration.ray_search.concurrency_limited).
"""
from __future__ import annotations

import logging
from contextlib import ExitStack, contextmanager
from typing import Iterator

# logger name -> the start of each message dropped from it (only those: its other lines pass)
NOISE: dict[str, tuple[str, ...]] = {
    "ray._private.authentication.authentication_token_setup": (
        "Token authentication is enabled for this Ray cluster",),
    "ray.tune.analysis.experiment_analysis": ("Failed to fetch metrics for",),
    "mlflow.store.db.utils": ("Creating initial MLflow database tables", "Updating database tables"),
    "optuna.storages._in_memory": ("A new study created in memory",),
}


class DropLines(logging.Filter):
    """Drops the records whose message starts with one of `prefixes`."""

    def __init__(self, prefixes: tuple[str, ...]) -> None:
        super().__init__()
        self.prefixes = prefixes

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a malformed record is logging's to report, not ours
            return True
        return not message.startswith(self.prefixes)


@contextmanager
def dropping(logger_name: str, *prefixes: str) -> Iterator[None]:
    """Drop `logger_name`'s lines that start with one of `prefixes` while the block runs (nests: each level adds and
    removes its own filter)."""
    logger = logging.getLogger(logger_name)
    drop = DropLines(tuple(prefixes))
    logger.addFilter(drop)
    try:
        yield
    finally:
        logger.removeFilter(drop)


@contextmanager
def quiet_libraries() -> Iterator[None]:
    """Drop the NOISE lines while the block runs: the life of a study's Ray session."""
    with ExitStack() as stack:
        for name, prefixes in NOISE.items():
            stack.enter_context(dropping(name, *prefixes))
        yield
