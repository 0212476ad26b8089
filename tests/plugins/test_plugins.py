"""Algorithms from outside the package: modules named in GTEP_PLUGINS are imported after the built-ins.

Each case runs in a fresh interpreter, as Ray's workers do: the registry is filled at import time, so the
variable must be set before gtep.algorithms is first imported.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.plugin_code import COUNTING_NET, LEARNER_IMPORTS

PLUGIN = '''
"""A plugin algorithm with a network class of its own (checkpoints must be able to rebuild it)."""
''' + LEARNER_IMPORTS + COUNTING_NET + '''

@ALGORITHMS.register("my_method")
class MyMethod(CountingLearner):
    def fit_task(self, task, fit):
        pass
'''


def run_python(code: str, plugins: str, path: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "GTEP_PLUGINS": plugins,
           "PYTHONPATH": os.pathsep.join(filter(None, [str(path), os.environ.get("PYTHONPATH", "")]))}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True,
                          cwd=path)


def test_a_plugin_module_registers_its_algorithm_and_its_checkpoints_load(tmp_path):
    (tmp_path / "my_plugin.py").write_text(PLUGIN)
    code = """
        from pathlib import Path

        import torch

        from gtep.algorithms import ALGORITHMS
        from gtep.data import resolve_dataset
        from gtep.engine import OrderingJob, run_ordering
        from gtep.engine.checkpoint import fingerprint, load_checkpoint

        assert "my_method" in ALGORITHMS and "replay" in ALGORITHMS, ALGORITHMS.names()
        data = resolve_dataset("synthetic:classes=4,train=4,test=2,size=8").load()
        job = OrderingJob("my_method", {"epochs": 1}, "resnet8", (2, 2), (0, 1, 2, 3), seed=0, ordering=0)
        checkpoint = Path("ordering.pt")
        outcome = run_ordering(job, data, checkpoint=checkpoint)
        assert outcome.status == "finished" and len(outcome.acc_matrix) == 2, outcome
        saved = load_checkpoint(checkpoint, fingerprint(job), torch.device("cpu"))
        assert saved is not None and saved.tasks_done == 1
        assert type(saved.learner.net).__name__ == "CountingNet"
        print("ok")
    """
    result = run_python(code, " my_plugin , ", tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().endswith("ok")


def test_without_the_variable_no_plugin_is_registered(tmp_path):
    (tmp_path / "my_plugin.py").write_text(PLUGIN)
    result = run_python("from gtep.algorithms import ALGORITHMS; print('my_method' in ALGORITHMS)", "", tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"


def test_a_module_that_cannot_be_imported_is_a_clear_error(tmp_path):
    result = run_python("import gtep.algorithms", "no_such_gtep_plugin", tmp_path)
    assert result.returncode != 0
    last = result.stderr.strip().splitlines()[-1]
    assert "GTEP_PLUGINS" in last and "'no_such_gtep_plugin'" in last and "PYTHONPATH" in last, result.stderr
    assert "which is not installed" in last and "failed to import" not in last, result.stderr


def test_a_plugin_that_fails_while_importing_names_the_variable(tmp_path):
    (tmp_path / "broken_plugin.py").write_text("raise RuntimeError('boom')\n")
    result = run_python("import gtep.algorithms", "broken_plugin", tmp_path)
    assert result.returncode != 0
    last = result.stderr.strip().splitlines()[-1]
    assert "GTEP_PLUGINS" in last and "'broken_plugin'" in last, result.stderr
    # it is there and raised: fix it, not install it
    assert "which failed to import: RuntimeError: boom; fix the error in broken_plugin" in last, result.stderr
    assert "not installed" not in last and "PYTHONPATH" not in last, result.stderr


def test_a_plugin_whose_dependency_is_missing_names_the_dependency_not_the_plugin(tmp_path, monkeypatch):
    from gtep.plugins import PluginError, import_env_module

    (tmp_path / "needs_dep_plugin.py").write_text("import nonexistent_dep_of_the_plugin\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(PluginError) as raised:
        import_env_module("needs_dep_plugin")
    message = str(raised.value)
    assert message.startswith("GTEP_PLUGINS names the module 'needs_dep_plugin', which failed to import: "
                              "ModuleNotFoundError: No module named 'nonexistent_dep_of_the_plugin'"), message
    assert "pip install nonexistent_dep_of_the_plugin" in message and "not installed" not in message, message


def test_a_broken_plugin_module_is_one_line_from_the_command_line(tmp_path):
    """gtep.config defers the error while it is imported (gtep.plugins.deferred): the command reports it."""
    (tmp_path / "broken_plugin.py").write_text("raise RuntimeError('boom')\n")
    env = {**os.environ, "GTEP_PLUGINS": "broken_plugin", "RAY_AUTH_MODE": "disabled",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH", "")]))}
    result = subprocess.run([sys.executable, "-m", "gtep.cli", "check", "--preset", "default"], env=env,
                            capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.startswith("error: GTEP_PLUGINS names the module 'broken_plugin'"), result.stderr
    assert "boom" in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
