"""A test that takes its xdist worker down (a Ray that dies with it, os._exit) fails alone: the session goes on
with a replacement worker and ends, instead of hanging (tests/scheduling.py; stop 62's slow group hung so)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

CONFTEST = '''
import pytest

@pytest.hookimpl(tryfirst=True)
def pytest_xdist_make_scheduler(config, log):
    from tests.scheduling import ScopeScheduling

    class PerTest(ScopeScheduling):  # every test a unit of its own, as tests/conftest.py's PER_TEST modules
        scope_of = staticmethod(lambda nodeid: nodeid)
        longest_first = ("test_crash.py::test_crash[2]",)

    return PerTest(config, log)
'''
CRASHING = '''
import os, time, pytest

@pytest.mark.parametrize("case", range(6))
def test_crash(case):
    time.sleep(0.3)
    if case == 2:
        os._exit(3)
'''
STEADY = '''
import time, pytest

@pytest.mark.parametrize("case", range(4))
def test_steady(case):
    time.sleep(0.5)
'''


def test_a_crashed_worker_costs_its_test_and_the_session_ends(tmp_path):
    for name, text in (("conftest.py", CONFTEST), ("test_crash.py", CRASHING), ("test_steady.py", STEADY)):
        (tmp_path / name).write_text(text)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("PYTEST_XDIST_WORKER", None)
    done = subprocess.run([sys.executable, "-m", "pytest", "-n", "2", "-p", "no:cacheprovider",
                           "-q", "-o", "addopts=", "--rootdir", str(tmp_path), str(tmp_path)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    out = done.stdout + done.stderr
    assert done.returncode == 1, out[-3000:]
    assert "1 failed, 9 passed" in out, out[-3000:]  # the crashed test once, every other test run
    assert "crashed while running 'test_crash.py::test_crash[2]'" in out, out[-3000:]
