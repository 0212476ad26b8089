"""A study is its owner's (issue 68): gtep.config.private's owner_only() is the one mechanism, entered around a
study's Ray session, so the driver and the Ray it starts (whose workers inherit the umask) create 0700 folders and
0600 files whatever the user's umask. tests/orchestration/test_study_end_to_end.py reads the modes of a whole study
made under umask 022."""
from __future__ import annotations

import os
import stat
from contextlib import contextmanager

from gtep.config.private import owner_only
from gtep.orchestration.study import write_atomic


def current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_owner_only_masks_group_and_others_then_gives_the_umask_back():
    before = os.umask(0o022)
    try:
        with owner_only():
            assert current_umask() == 0o077
        assert current_umask() == 0o022
        os.umask(0o227)  # what a stricter one masks more stays masked
        with owner_only():
            assert current_umask() == 0o277
        assert current_umask() == 0o227
    finally:
        os.umask(before)


def test_a_study_session_and_the_ray_it_starts_run_owner_only(monkeypatch):
    """api._ray enters the Ray session (which starts Ray when none runs) under umask 077."""
    from gtep import api
    from gtep.orchestration import ray_search

    seen = []

    @contextmanager
    def session(resolved, console):
        seen.append(current_umask())
        yield

    monkeypatch.setattr(ray_search, "study_session", session)
    before = os.umask(0o022)
    try:
        with api._ray(None, None):  # type: ignore[arg-type]
            pass
        assert seen == [0o077] and current_umask() == 0o022
    finally:
        os.umask(before)


def test_write_atomic_makes_owner_only_folders_and_files(tmp_path):
    before = os.umask(0o022)
    try:
        target = tmp_path / "out" / "study" / "units" / "tune-1" / "set000-o0.json"
        write_atomic(target, "{}")
    finally:
        os.umask(before)
    assert mode(target) == 0o600
    assert [mode(p) for p in (tmp_path / "out", target.parents[2], target.parent)] == [0o700, 0o700, 0o700]
