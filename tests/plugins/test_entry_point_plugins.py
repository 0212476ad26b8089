"""Plugins found through package metadata: a tiny plugin package with `[project.entry-points."gtep.*"]` is
installed (pip, setuptools) into a folder put on PYTHONPATH, never into the test venv, and gtep finds it in
fresh processes as a user's would: `gtep algorithms` lists it, a study runs with it on Ray (whose workers find it
by its entry points, with GTEP_PLUGINS unset), a `module:object` entry point registers under its name, and a
plugin that raises on import is one line naming its distribution, exit 2, no traceback; a module that is not
installed, one that raises and one that lacks a dependency are told apart.

The code blocks of docs/extending.md run here as written (those marked `<!-- runs: tests/plugins/test_entry_point_plugins.py
-->`): the in-package algorithm, family and criterion as modules, the plugin package (its pyproject.toml, learner
and search space) installed with pip, so that `gtep algorithms` lists its space and the pre-flight pass uses it.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from importlib import metadata
from pathlib import Path

import pytest
import yaml

from gtep.plugins import PluginError, load_entry_point
from tests.plugin_code import COUNTING_NET, LEARNER_IMPORTS, pairs_family

EXTENDING = Path(__file__).resolve().parents[2] / "docs" / "extending.md"
RUNS_HERE = "<!-- runs: tests/plugins/test_entry_point_plugins.py -->"
FENCE = re.compile(r"^(`{3,})(\w*)\s*$")

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
''' + LEARNER_IMPORTS + COUNTING_NET + '''

@ALGORITHMS.register("ep_method")
class EpMethod(CountingLearner):
    """EpMethod (an entry-point plugin)."""

    def fit_task(self, task, fit):
        markers = os.environ.get("EP_LAB_MARKERS")
        if markers:  # which process trained: a Ray worker, not the driver
            Path(markers, str(os.getpid())).touch()


class EpObjectMethod(EpMethod):
    """EpObjectMethod (a module:object entry point)."""
'''

PAIRS = pairs_family("A scenario family of two tasks of two classes, registered by gtep from its module:object "
                     "entry point.", '''
class EpPairs(TaskFamily):
    name = "ep_pairs"
    description = "two tasks of two classes"
    metrics = (ACC, AVG_ACC, ACC_T)
''')

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


def page_blocks(marker: str = RUNS_HERE) -> dict[str, str]:
    """The code blocks of docs/extending.md marked `marker` (on a comment line of those just before the fence), by
    their first line: the file a block names (`# my-lab/pyproject.toml` -> my-lab/pyproject.toml) or the first
    line itself (a command, an import)."""
    blocks: dict[str, str] = {}
    lines = EXTENDING.read_text().splitlines()
    index = 0
    while index < len(lines):
        opening = FENCE.match(lines[index])
        if not opening:
            index += 1
            continue
        end = next(i for i in range(index + 1, len(lines)) if lines[i].strip() == opening.group(1))
        before = [line.strip() for line in lines[max(0, index - 3):index]]
        if marker in before:
            text = "\n".join(lines[index + 1:end]) + "\n"
            first = text.splitlines()[0]
            blocks[first[2:].strip() if first.startswith("# ") else first] = text
        index = end + 1
    return blocks


def plugin_project(root: Path) -> Path:
    """The page's plugin package as written: the files its blocks name under my-lab/, and the empty __init__.py
    its layout lists."""
    project = root / "my-lab"
    for name, text in page_blocks().items():
        if name.startswith("my-lab/"):
            (project / name.removeprefix("my-lab/")).parent.mkdir(parents=True, exist_ok=True)
            (project / name.removeprefix("my-lab/")).write_text(text)
    (project / "my_lab" / "__init__.py").touch()
    return project


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> dict[str, Path]:
    """Four install folders: `lab` (learners, a family and a dataset), `broken` (a gtep.algorithms plugin that
    raises on import), `broken_family` (the same in gtep.families) and `docs` (docs/extending.md's plugin)."""
    root = tmp_path_factory.mktemp("entry-point-plugins")
    projects = {
        "docs": plugin_project(root / "src-docs"),
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
    assert (targets["docs"] / "my_lab" / "my_method.yaml").exists()  # the page's package data ships the space
    return targets


def plugin_env(target: Path | list[Path], **extra: str) -> dict[str, str]:
    """The environment of a fresh gtep process that sees `target` (and so Ray's workers, which inherit it)."""
    targets = [str(path) for path in (target if isinstance(target, list) else [target])]
    env = {key: value for key, value in os.environ.items() if key != "GTEP_PLUGINS"}
    env.update(PYTHONPATH=os.pathsep.join(filter(None, [*targets, os.environ.get("PYTHONPATH", "")])),
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
    assert "(no search space)" in rows["ep_method"]  # it declares none: `gtep check` says how to add one


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
                     "failed to import: RuntimeError: boom from ep_broken", "fix the error in ep_broken",
                     "pip uninstall gtep-ep-broken"):
            assert part in line, (part, line)
        assert "not installed" not in line and "reinstall" not in line, line  # it is installed: it raised


def test_a_broken_family_plugin_is_the_error_of_the_command_not_of_its_import(installed, tmp_path):
    env = plugin_env(installed["broken_family"])
    assert gtep(env, "--help", cwd=tmp_path).returncode == 0  # gtep.config imports: the family is kept for later
    line = one_error_line(gtep(env, "run", "--config", str(study_config(tmp_path)), "--output", str(tmp_path / "out"),
                               cwd=tmp_path))
    assert "gtep-ep-broken-family 0.2" in line and "gtep.families" in line and "boom from the family" in line, line


# ---------------------------------------------------------------- why an entry point cannot be loaded

def fake_entry_points(tmp_path: Path, modules: dict[str, str], entry_points: str) -> list[metadata.EntryPoint]:
    """A distribution's metadata without installing it (fake-lab 0.2: a dist-info folder with its entry points),
    and its modules, in `tmp_path` (put on sys.path by the caller)."""
    for module, text in modules.items():
        (tmp_path / f"{module}.py").write_text(text)
    info = tmp_path / "fake_lab-0.2.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fake-lab\nVersion: 0.2\n")
    (info / "entry_points.txt").write_text(entry_points)
    return list(metadata.Distribution.at(info).entry_points)


def load_error(ep: metadata.EntryPoint) -> str:
    with pytest.raises(PluginError) as raised:
        load_entry_point("gtep.algorithms", ep, lambda name, obj: None)
    return str(raised.value)


def test_a_module_that_raises_or_lacks_a_dependency_failed_to_import_and_a_missing_one_is_not_installed(
        tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    eps = {ep.name: ep for ep in fake_entry_points(
        tmp_path, {"fake_raises": "raise RuntimeError('boom at import')\n",
                   "fake_needs_dep": "import nonexistent_dep_of_fake_lab\n"},
        "[gtep.algorithms]\nraises = fake_raises\nneeds_dep = fake_needs_dep:Method\nghost = fake_ghost_module\n")}
    raises = load_error(eps["raises"])
    assert "the gtep plugin 'raises' of the distribution fake-lab 0.2 (entry point raises = fake_raises" in raises
    assert "failed to import: RuntimeError: boom at import; fix the error in fake_raises" in raises, raises
    assert "pip uninstall fake-lab" in raises and "not installed" not in raises, raises
    needs_dep = load_error(eps["needs_dep"])
    assert ("failed to import: ModuleNotFoundError: No module named 'nonexistent_dep_of_fake_lab'; install the "
            "module it imports (nonexistent_dep_of_fake_lab: pip install nonexistent_dep_of_fake_lab)") in needs_dep
    assert "not installed" not in needs_dep, needs_dep
    ghost = load_error(eps["ghost"])
    assert "(entry point ghost = fake_ghost_module in group gtep.algorithms) is not installed" in ghost, ghost
    assert "pip install --force-reinstall fake-lab" in ghost and "failed to import" not in ghost, ghost


def test_an_object_that_cannot_be_registered_is_neither_missing_nor_a_failed_import(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    [ep] = fake_entry_points(tmp_path, {"fake_fine": "class Method:\n    pass\n"},
                             "[gtep.algorithms]\nlost = fake_fine:NoSuchObject\n")
    line = load_error(ep)
    assert "cannot be loaded (AttributeError:" in line and "NoSuchObject" in line, line
    assert "failed to import" not in line and "not installed" not in line, line


# ---------------------------------------------------------------- docs/extending.md, run as written

def test_the_page_marks_as_run_here_exactly_the_blocks_this_file_runs():
    assert set(page_blocks()) == {
        "gtep/algorithms/my_method.py", "search_spaces/my_method.yaml", "gtep/protocol/families/pairs/__init__.py",
        "from gtep.protocol.criteria import Criterion, register_criterion",
        "my-lab/pyproject.toml", "my-lab/my_lab/methods.py", "my-lab/my_lab/my_method.yaml",
        "GTEP_PLUGINS=noop_learner PYTHONPATH=benchmarks gtep algorithms"}


def test_the_pages_algorithm_family_and_criterion_register_and_resolve_together(tmp_path):
    """The in-package examples as modules of their own (GTEP_PLUGINS, as gtep imports its own): a config with the
    algorithm, its space file, the family and the criterion resolves."""
    blocks = page_blocks()
    (tmp_path / "doc_method.py").write_text(blocks["gtep/algorithms/my_method.py"])
    (tmp_path / "doc_pairs.py").write_text(blocks["gtep/protocol/families/pairs/__init__.py"])
    [criterion] = [text for name, text in blocks.items() if name.startswith("from gtep.protocol.criteria import")]
    (tmp_path / "doc_criterion.py").write_text(criterion)
    (tmp_path / "my_method.yaml").write_text(blocks["search_spaces/my_method.yaml"])
    code = """
        from gtep.config import resolve, validate_config
        from gtep.spaces import load_space

        doc = {"study": "docs-extending", "algorithm": "my_method", "backbone": "resnet8",
               "scenario": {"family": "pairs"},
               "datasets": {"split": {"dataset": "synthetic:classes=8,train=8,test=4", "classes_per_phase": 4}},
               "search": {"trials": 2, "orderings": 1, "space": "my_method.yaml", "criterion": "last_task_acc"},
               "first_task": {"epochs": 1, "milestones": [1], "batch_size": 16},
               "training": {"memory_size": 8}, "seed": 0}
        resolved = resolve(validate_config(doc, "docs/extending.md"))
        assert resolved.increments == (2, 2), resolved.increments
        space = load_space("my_method", resolved.space_path)
        assert set(space.space.names) == {"epochs", "lr", "kd_weight"}, space.space.names
        assert space.presets["original"]["kd_weight"] == 1.0
        print("ok")
    """
    env = {**plugin_env(tmp_path), "GTEP_PLUGINS": "doc_method,doc_pairs,doc_criterion"}
    result = python(env, code, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().endswith("ok")


def test_the_pages_gtep_plugins_command_lists_the_benchmarks_noop_learner(tmp_path):
    [command] = [text for name, text in page_blocks().items() if name.startswith("GTEP_PLUGINS=")]
    root = EXTENDING.parent.parent
    env = {**plugin_env([]), "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]])}
    result = subprocess.run(["bash", "-c", command], env=env, capture_output=True, text=True, cwd=root, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert any(line.startswith("│ noop ") for line in result.stdout.splitlines()), result.stdout


def test_the_pages_plugin_package_ships_its_search_space_to_gtep_algorithms_and_the_preflight(installed, tmp_path):
    """docs/extending.md's plugin, installed with pip from its blocks: `gtep algorithms` lists its space (3 tuned
    hyperparameters, the original preset) and the pre-flight pass uses it for a config that names no space; the
    lab's learner, which declares none, is refused with what to add."""
    env = plugin_env([installed["docs"], installed["lab"]])
    result = gtep(env, "algorithms", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    rows = {line.split()[1]: line for line in result.stdout.splitlines() if line.startswith("│")}
    cells = [cell.strip() for cell in rows["my_method"].split("│")]
    assert cells[3:5] == ["3", "original"] and cells[5] == "my-lab 0.1", rows["my_method"]
    code = f"""
        from pathlib import Path

        from gtep.config import ConfigError, validate_config
        from gtep.preflight import preflight

        doc = {{"study": "docs-plugin", "algorithm": "my_method", "backbone": "resnet8",
               "scenario": {{"increments": "2x2"}},
               "datasets": {{"split": {{"dataset": "synthetic:classes=8,train=8,test=4", "classes_per_phase": 4}}}},
               "search": {{"trials": 2, "orderings": 1}}, "first_task": {{"epochs": 1, "milestones": [1]}},
               "training": {{"memory_size": 8}}, "seed": 0}}
        plan = preflight(validate_config(doc, "plugin"))
        assert plan.resolved.space_path == Path({str(installed["docs"])!r}, "my_lab", "my_method.yaml"), plan
        try:
            preflight(validate_config({{**doc, "algorithm": "ep_method"}}, "plugin"))
        except ConfigError as err:
            print(err)
    """
    result = python(env, code, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    line = result.stdout.strip()
    assert "search.space" in line and "ep_method has no search space" in line, line
    assert 'search_space = "ep_method.yaml"' in line and "docs/extending.md" in line, line
