"""A new local store is a copy of the empty store template (gtep/orchestration/tracking_store.py): the same
store MLflow would have made, owner-only, in WAL mode, with the template made once per MLflow version."""
from __future__ import annotations

import sqlite3
import stat
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from gtep.orchestration.tracking_store import sqlite_write_ahead_log, store_template

TIMES = ("creation_time", "last_update_time")


def contents(path: Path) -> dict:
    """Every table's and index's definition, and every row (the Default experiment's times left out)."""
    connection = sqlite3.connect(path)
    try:
        # a definition's lines as a set: MLflow's own migrations write a table's CHECK constraints in an order that
        # changes from one process to the next (two stores it makes itself differ so)
        schema = sorted((kind, name, tuple(sorted(line.strip().rstrip(",") for line in (sql or "").splitlines())))
                        for kind, name, sql in connection.execute(
                            "SELECT type, name, sql FROM sqlite_master WHERE name NOT LIKE 'sqlite_%'"))
        rows = {}
        for (table,) in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'"):
            cursor = connection.execute(f'SELECT * FROM "{table}"')
            names = [d[0] for d in cursor.description]
            rows[table] = sorted(tuple(v for n, v in zip(names, row) if n not in TIMES) for row in cursor)
        return {"schema": schema, "rows": rows}
    finally:
        connection.close()


@pytest.fixture
def cache(tmp_path, monkeypatch):
    folder = tmp_path / "cache"
    monkeypatch.setenv("GTEP_CACHE", str(folder))
    monkeypatch.chdir(tmp_path)  # MLflow puts the Default experiment's artifacts under the working directory
    return folder


def test_a_new_store_is_the_one_mlflow_makes_and_is_owner_only(cache, tmp_path):
    ours, theirs = tmp_path / "ours" / "mlflow.db", tmp_path / "theirs" / "mlflow.db"
    sqlite_write_ahead_log(ours)
    assert store_template().exists() and ours.stat().st_size > 0, "the store was seeded from the template"
    MlflowClient(tracking_uri=f"sqlite:///{ours}").search_experiments()
    theirs.parent.mkdir()
    MlflowClient(tracking_uri=f"sqlite:///{theirs}").search_experiments()  # MLflow's own migrations
    assert contents(ours) == contents(theirs)
    default, = contents(ours)["rows"]["experiments"]
    assert "Default" in default and str(tmp_path / "mlruns" / "0") in default
    assert stat.S_IMODE(ours.stat().st_mode) == 0o600 and stat.S_IMODE(cache.stat().st_mode) == 0o700
    assert stat.S_IMODE(store_template().stat().st_mode) == 0o600
    with sqlite3.connect(ours) as connection:
        assert connection.execute("PRAGMA journal_mode").fetchone() == ("wal",)


def test_the_template_is_made_once_and_an_existing_store_is_never_replaced(cache, tmp_path):
    first = tmp_path / "a" / "mlflow.db"
    sqlite_write_ahead_log(first)
    template = store_template()
    made = template.stat().st_mtime_ns
    client = MlflowClient(tracking_uri=f"sqlite:///{first}")
    client.create_experiment("gtep/kept")
    sqlite_write_ahead_log(first)  # a store with runs is opened again: nothing is copied over it
    assert client.get_experiment_by_name("gtep/kept") is not None
    sqlite_write_ahead_log(tmp_path / "b" / "mlflow.db")
    assert template.stat().st_mtime_ns == made
    assert [p.name for p in cache.iterdir()] == [template.name], "no half-made template is left behind"
    # an empty main file beside a write-ahead log that holds the pages is a store, not a new one
    pages = tmp_path / "c" / "mlflow.db"
    pages.parent.mkdir()
    pages.touch()
    Path(f"{pages}-wal").write_bytes(b"pages")
    sqlite_write_ahead_log(pages)
    assert pages.read_bytes() != template.read_bytes()[:pages.stat().st_size], "the template was copied over it"
