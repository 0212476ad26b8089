"""tests/conftest.py's scheduler tables name tests by path and node id in strings that nothing else reads: a test
renamed or moved would silently fall back to its module's scope (a shared study built twice, a PostgreSQL database
written by two workers at once, a long scope handed out last). Each name must match a collected test, over every
group: the tables name cluster tests too."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.conftest import LONGEST_FIRST, PER_TEST, SHARED_SCOPES

ROOT = Path(__file__).resolve().parents[2]


def collected(paths: list[str]) -> set[str]:
    """The node ids pytest collects from `paths`, whatever their markers (-m '' undoes addopts' selection)."""
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "", "-n", "0", *paths],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return {line.strip() for line in done.stdout.splitlines() if "::" in line}


def test_every_name_in_the_scheduler_tables_matches_a_collected_test():
    scopes = set(SHARED_SCOPES.values())
    names = [*SHARED_SCOPES, *PER_TEST, *(entry for entry in LONGEST_FIRST if entry not in scopes)]
    files = sorted({name.split("::")[0] for name in names})
    missing_files = [path for path in files if not (ROOT / path).is_file()]
    assert not missing_files, f"scheduler tables name files that do not exist: {missing_files}"
    ids = collected(files)
    unmatched = [name for name in names if not any(i == name or i.startswith((name + "::", name + "[")) for i in ids)]
    assert not unmatched, f"scheduler tables name tests that pytest does not collect: {unmatched}"


def test_every_scope_handed_out_first_is_a_unit_of_work():
    """A LONGEST_FIRST entry is a module, one of SHARED_SCOPES' scopes, or a test of a PER_TEST module (each its own
    unit): anything else is no unit's name and would never be handed out first."""
    scopes = set(SHARED_SCOPES.values())
    strays = [entry for entry in LONGEST_FIRST if entry not in scopes and not entry.endswith(".py")
              and entry.split("::")[0] not in PER_TEST]
    assert not strays, f"LONGEST_FIRST names no module, shared scope or PER_TEST test: {strays}"
