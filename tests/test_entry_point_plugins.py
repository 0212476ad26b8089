"""Plugins found through package metadata: a tiny plugin package with `[project.entry-points."gtep.*"]` is
installed (pip, setuptools) into a folder put on PYTHONPATH, never into the test venv, and gtep finds it in
fresh processes as a user's would: `gtep algorithms` lists it, a study runs with it on Ray (whose workers find it
by its entry points, with GTEP_PLUGINS unset), a `module:object` entry point registers under its name, and a
plugin that raises on import is one line naming its distribution, exit 2, no traceback.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

PYPROJECT = '''
[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = "{name}"
version = "{version}"

[tool.setuptools]
packages = ["{package}"]
{entry_points}
'''

METHODS = '''
"""Two learners: one registered by its module (the entry point names the module), one registered by gtep under
the entry point's name (module:object). Their network is a class of the plugin's own (checkpoints rebuild it)."""
import os
from pathlib import Path

import torch
from torch import nn

from gtep.algorithms import ALGORITHMS, CommonParams, IncrementalLearner


class CountingNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(1))
        self.classes = 0

    def expand(self, total):
        self.classes = max(self.classes, total)

    def forward(self, x):
        logits = self.scale * torch.zeros(len(x), max(self.classes, 1), device=x.device)
        return {"logits": logits, "features": logits}


@ALGORITHMS.register("ep_method")
class EpMethod(IncrementalLearner[CommonParams]):
    """EpMethod (an entry-point plugin)."""

    uses_memory = False

    def build_network(self):
        return CountingNet()

    def fit_task(self, task, fit):
        markers = os.environ.get("EP_LAB_MARKERS")
        if markers:  # which process trained: a Ray worker, not the driver
            Path(markers, str(os.getpid())).touch()


class EpObjectMethod(EpMethod):
    """EpObjectMethod (a module:object entry point)."""
'''

PAIRS = '''
"""A scenario family of two tasks of two classes, registered by gtep from its module:object entry point."""
from dataclasses import dataclass
from typing import Any, Mapping

from gtep.protocol import metrics
from gtep.protocol.families import ACC, ACC_T, AVG_ACC, TaskFamily
from gtep.protocol.scenarios import build_scenario


@dataclass(frozen=True)
class PairsOptions:
    @classmethod
    def of(cls, options: Mapping[str, Any]) -> "PairsOptions":
        return cls()


class EpPairs(TaskFamily):
    name = "ep_pairs"
    description = "two tasks of two classes"
    Options = PairsOptions
    metrics = (ACC, AVG_ACC, ACC_T)
    default_criterion = "hmean_acc_avgacc"

    def increments(self, options):
        return [2, 2]

    def tasks(self, classes, options, seed, ordering):
        return build_scenario(classes, [2, 2], seed, ordering)

    def summarize(self, matrix, test_counts, tasks):
        return metrics.summarize(matrix, test_counts)

    def example_options(self):
        return {}
'''

DATA = '''
"""A dataset scheme: `tiny:<synthetic options>`, registered by gtep from its module:object entry point."""
from gtep.data import DATASETS


def tiny(spec):
    return DATASETS.get("synthetic")(spec)
'''

LAB_ENTRY_POINTS = '''
[project.entry-points."gtep.algorithms"]
ep_lab = "ep_lab.methods"
ep_object_method = "ep_lab.methods:EpObjectMethod"

[project.entry-points."gtep.families"]
ep_pairs = "ep_lab.pairs:EpPairs"

[project.entry-points."gtep.datasets"]
tiny = "ep_lab.data:tiny"
'''


def write_package(root: Path, name: str, version: str, package: str, modules: dict[str, str],
                  entry_points: str) -> Path:
    (root / package).mkdir(parents=True)
    for module, text in modules.items():
        (root / package / f"{module}.py").write_text(textwrap.dedent(text))
    (root / "pyproject.toml").write_text(PYPROJECT.format(name=name, version=version, package=package,
                                                          entry_points=entry_points))
    return root


def pip_install(project: Path, target: Path) -> subprocess.Popen:
    """The package into `target` (a folder for PYTHONPATH): the test venv is left as it is."""
    return subprocess.Popen([sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index",
                             "--disable-pip-version-check", "--quiet", "--target", str(target), str(project)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=project)


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> dict[str, Path]:
    """Three install folders: `lab` (learners, a family and a dataset), `broken` (a gtep.algorithms plugin that
    raises on import) and `broken_family` (the same in gtep.families)."""
    root = tmp_path_factory.mktemp("entry-point-plugins")
    projects = {
        "lab": write_package(root / "src-lab", "gtep-ep-lab", "0.1", "ep_lab",
                             {"__init__": "", "methods": METHODS, "pairs": PAIRS, "data": DATA}, LAB_ENTRY_POINTS),
        "broken": write_package(root / "src-broken", "gtep-ep-broken", "0.3", "ep_broken",
                                {"__init__": "raise RuntimeError('boom from ep_broken')"},
                                '[project.entry-points."gtep.algorithms"]\nep_broken = "ep_broken"\n'),
        "broken_family": write_package(root / "src-broken-family", "gtep-ep-broken-family", "0.2",
                                       "ep_broken_family", {"__init__": "raise RuntimeError('boom from the family')"},
                                       '[project.entry-points."gtep.families"]\n'
                                       'ep_broken_family = "ep_broken_family"\n'),
    }
    targets = {key: root / f"site-{key}" for key in projects}
    running = {key: pip_install(project, targets[key]) for key, project in projects.items()}
    for key, process in running.items():
        output, _ = process.communicate(timeout=300)
        assert process.returncode == 0, output
    assert (targets["lab"] / "gtep_ep_lab-0.1.dist-info" / "entry_points.txt").exists()
    return targets


def plugin_env(target: Path, **extra: str) -> dict[str, str]:
    """The environment of a fresh gtep process that sees `target` (and so Ray's workers, which inherit it)."""
    env = {key: value for key, value in os.environ.items() if key != "GTEP_PLUGINS"}
    env.update(PYTHONPATH=os.pathsep.join(filter(None, [str(target), os.environ.get("PYTHONPATH", "")])),
               RAY_AUTH_MODE="disabled", HF_HUB_OFFLINE="1", COLUMNS="250", **extra)
    return env


def gtep(env: dict[str, str], *args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gtep.cli", *args], env=env, capture_output=True, text=True,
                          cwd=cwd, timeout=600)


def python(env: dict[str, str], code: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True,
                          cwd=cwd, timeout=300)


def study_config(tmp_path: Path) -> Path:
    """A study with the plugin's learner, family and dataset: two sets, one ordering, two tasks."""
    space = tmp_path / "ep_method.yaml"
    space.write_text(yaml.safe_dump({"algorithm": "ep_method", "space": {"lr": [0.1, 0.01], "epochs": [1]}}))
    doc = {"study": "entry-points", "algorithm": "ep_method", "backbone": "resnet8", "scenario": {"family": "ep_pairs"},
           "datasets": {"split": {"dataset": "tiny:classes=8,train=8,test=4", "classes_per_phase": 4}},
           "search": {"trials": 2, "orderings": 1, "space": str(space)},
           "first_task": {"epochs": 1, "milestones": [1], "batch_size": 16},
           "training": {"memory_size": 8, "epoch_scale": 0.01}, "compute": {"max_concurrent": 2}, "seed": 0}
    config = tmp_path / "entry-points.yaml"
    config.write_text(yaml.safe_dump(doc))
    return config


def test_gtep_algorithms_lists_the_plugins_with_their_distribution(installed, tmp_path):
    result = gtep(plugin_env(installed["lab"]), "algorithms", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    rows = {line.split()[1]: line for line in result.stdout.splitlines() if line.startswith("│")}
    assert "ep_method" in rows and "ep_object_method" in rows and "replay" in rows, result.stdout
    assert "gtep-ep-lab 0.1" in rows["ep_method"] and "gtep-ep-lab 0.1" in rows["ep_object_method"]
    assert "gtep-ep-lab" not in rows["replay"]


def test_module_object_entry_points_register_under_their_names_and_checkpoints_reload(installed, tmp_path):
    code = """
        import sys
        from pathlib import Path

        from gtep.algorithms import ALGORITHMS
        from gtep.data import DATASETS, resolve_dataset
        from gtep.engine import OrderingJob, run_ordering
        from gtep.protocol.families import FAMILIES

        found = {"ep_object_method": ALGORITHMS.get("ep_object_method"), "ep_method": ALGORITHMS.get("ep_method"),
                 "ep_pairs": FAMILIES.get("ep_pairs"), "tiny": DATASETS.get("tiny")}
        methods, pairs, data = (sys.modules[f"ep_lab.{name}"] for name in ("methods", "pairs", "data"))
        assert found["ep_object_method"] is methods.EpObjectMethod  # module:object, registered by gtep
        assert found["ep_method"] is methods.EpMethod  # a module that registers its learner itself
        assert type(found["ep_pairs"]) is pairs.EpPairs  # a family class: registered as an instance
        assert found["tiny"] is data.tiny
        data = resolve_dataset("tiny:classes=4,train=4,test=2,size=8").load()
        job = OrderingJob("ep_object_method", {"epochs": 1}, "resnet8", (2, 2), (0, 1, 2, 3), seed=0, ordering=0)
        checkpoint = Path("ordering.pt")
        outcome = run_ordering(job, data, checkpoint=checkpoint)
        assert outcome.status == "finished" and len(outcome.acc_matrix) == 2, outcome
        print("ok")
    """
    env = plugin_env(installed["lab"])
    result = python(env, code, tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().endswith("ok")
    # a fresh process that imported no plugin: the checkpoint loader trusts the plugin's package all the same
    reload = """
        from pathlib import Path

        import torch

        from gtep.engine import OrderingJob
        from gtep.engine.checkpoint import fingerprint, load_checkpoint

        job = OrderingJob("ep_object_method", {"epochs": 1}, "resnet8", (2, 2), (0, 1, 2, 3), seed=0, ordering=0)
        saved = load_checkpoint(Path("ordering.pt"), fingerprint(job), torch.device("cpu"))
        assert saved is not None and saved.tasks_done == 1
        assert type(saved.learner.net).__module__ == "ep_lab.methods", type(saved.learner.net)
        print("ok")
    """
    result = python(env, reload, tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().endswith("ok")


@pytest.mark.slow  # a whole study on Ray (~40 s): the slow group, beside the other studies of every learner
def test_a_study_runs_on_ray_with_the_plugins_of_its_entry_points(installed, tmp_path):
    markers = tmp_path / "markers"
    markers.mkdir()
    env = plugin_env(installed["lab"], EP_LAB_MARKERS=str(markers))
    config = study_config(tmp_path)
    process = subprocess.Popen([sys.executable, "-m", "gtep.cli", "run", "--config", str(config), "--output",
                                str(tmp_path / "out")], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, cwd=tmp_path)
    stdout, stderr = process.communicate(timeout=600)
    assert process.returncode == 0, stdout[-3000:] + stderr[-3000:]
    assert "ep_pairs" in stdout
    trainers = {int(marker.name) for marker in markers.iterdir()}
    # the learner trained in Ray's workers, which found the learner, the family and the dataset by entry point
    assert trainers and process.pid not in trainers, (trainers, process.pid)


def one_error_line(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


def test_a_plugin_that_raises_on_import_is_one_error_naming_its_distribution(installed, tmp_path):
    env = plugin_env(installed["broken"])
    config = study_config(tmp_path)
    doc = yaml.safe_load(config.read_text())
    doc.update(algorithm="replay", scenario={"increments": "2x2"},
               datasets={"split": {"dataset": "synthetic:classes=8,train=8,test=4", "classes_per_phase": 4}})
    doc["search"].pop("space")
    config.write_text(yaml.safe_dump(doc))
    for args in (("check", "--config", str(config)), ("algorithms",)):
        line = one_error_line(gtep(env, *args, cwd=tmp_path))
        for part in ("gtep-ep-broken 0.3", "ep_broken = ep_broken", "gtep.algorithms",
                     "RuntimeError: boom from ep_broken", "pip install --force-reinstall gtep-ep-broken",
                     "pip uninstall gtep-ep-broken"):
            assert part in line, (part, line)


def test_a_broken_family_plugin_is_the_error_of_the_command_not_of_its_import(installed, tmp_path):
    env = plugin_env(installed["broken_family"])
    assert gtep(env, "--help", cwd=tmp_path).returncode == 0  # gtep.config imports: the family is kept for later
    line = one_error_line(gtep(env, "run", "--config", str(study_config(tmp_path)), "--output", str(tmp_path / "out"),
                               cwd=tmp_path))
    assert "gtep-ep-broken-family 0.2" in line and "gtep.families" in line and "boom from the family" in line, line
