"""A plain install works: a wheel built from this checkout, installed (not editable) into a fresh venv, runs the
default study's pre-flight pass and a tiny tune from a folder outside the repository. Everything gtep reads at run
time must be in the wheel (package data), and `python -m gtep` is the command line.

The fresh venv reuses this venv's installed libraries (torch, Ray, MLflow...) through a .pth file, so the test
downloads nothing: the wheel goes in with --no-deps, and gtep itself is imported from the fresh venv, never from
this checkout (the editable install's finder lives in a .pth of this venv's site-packages, which a path line in
another .pth does not run)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def run(*args: str | Path, cwd: Path, env: dict[str, str], timeout: float = 600) -> str:
    done = subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"{' '.join(map(str, args))}: exit {done.returncode}\n{output[-4000:]}"
    return output


def checkout_files() -> list[str]:
    """What a clone of this working tree holds: tracked files and new ones git does not ignore."""
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout
    return [name for name in listed.split("\0") if name and (os.path.islink(ROOT / name) or (ROOT / name).exists())]


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """The wheel, and a fresh venv with it installed; returns (wheel, venv's python, environment, work folder)."""
    root = tmp_path_factory.mktemp("install")
    source = root / "source"
    for name in checkout_files():
        target = source / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if os.path.islink(ROOT / name):
            os.symlink(os.readlink(ROOT / name), target)
        else:
            shutil.copy2(ROOT / name, target)
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "VIRTUAL_ENV")}
    # the build backend of this venv (setuptools), offline: what `pip install .` does, without fetching it
    run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q",
        "-w", root / "dist", source, cwd=root, env=env)
    wheel, = (root / "dist").glob("gtep-*.whl")

    venv = root / "venv"
    run(sys.executable, "-m", "venv", "--without-pip", venv, cwd=root, env=env)
    python = venv / "bin" / "python"
    site = Path(run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])", cwd=root,
                    env=env).strip())
    libraries = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (site / "zz-main-venv-libraries.pth").write_text("\n".join(sorted(libraries)) + "\n")
    # pip from this venv's libraries, installing into the fresh one; --ignore-installed: the gtep this venv has
    # (editable) is neither uninstalled nor taken as already there
    run(python, "-m", "pip", "install", "--no-deps", "--no-index", "--ignore-installed", "-q", wheel, cwd=root,
        env=env)
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    work = root / "work"  # outside the repository: no search_spaces/ or gtep/ beside it
    work.mkdir()
    return wheel, python, env, work


def test_the_wheel_holds_every_file_the_package_reads(installed):
    wheel, *_ = installed
    names = set(zipfile.ZipFile(wheel).namelist())
    # every data file in the package's folders (a README there is for readers of the repository, not read)
    data = [name for name in checkout_files() if name.startswith("gtep/") and not name.endswith((".py", ".md"))]
    assert any(name.startswith("gtep/search_spaces/") for name in data)
    assert [name for name in data if name not in names] == []
    assert "gtep/__main__.py" in names
    assert any(name.endswith(".dist-info/licenses/LICENSE") or name.endswith(".dist-info/LICENSE") for name in names)


def test_gtep_is_imported_from_the_fresh_venv(installed):
    _, python, env, work = installed
    where = run(python, "-c", "import gtep, gtep.spaces; print(gtep.__file__); print(gtep.spaces.spaces_dir())",
                cwd=work, env=env).split()
    venv = python.parent.parent
    assert all(Path(p).is_relative_to(venv) for p in where), where
    assert Path(where[1]).is_dir()


def test_every_learner_has_its_search_space(installed):
    _, python, env, work = installed
    output = run(python, "-m", "gtep", "algorithms", cwd=work, env={**env, "COLUMNS": "250"})
    rows = {cells[1]: cells for line in output.splitlines()
            if len(cells := [cell.strip() for cell in line.split("│")]) > 2 and cells[1]}
    shipped = sorted(path.stem for path in (ROOT / "gtep" / "search_spaces").glob("*.yaml"))
    assert len(shipped) >= 40 and "replay" in shipped
    assert [name for name in shipped if name not in rows or "(no search space)" in rows[name]] == []


def test_the_default_study_passes_its_preflight_and_tunes(installed):
    _, python, env, work = installed
    checked = run(python, "-m", "gtep", "check", "--output", work / "out", cwd=work, env=env)
    assert "omniglot-replay" in checked
    # the installed `gtep` script, as a user types it: the default study, tiny (one set over one ordering, epochs
    # scaled to a few steps, the smallest ResNet), still on the bundled Omniglot and replay's shipped search space
    config = yaml.safe_load((ROOT / "gtep" / "presets" / "default.yaml").read_text())
    config["training"]["epoch_scale"] = 0.01
    config["backbone"] = "resnet8"
    config.pop("search", None)
    (work / "tiny.yaml").write_text(yaml.safe_dump(config))
    run(python.parent / "gtep", "tune", "--config", "tiny.yaml", "--trials", "1", "--orderings", "1", "--output",
        work / "out", cwd=work, env=env)
    best = yaml.safe_load((work / "out" / "omniglot-replay" / "best.yaml").read_text())
    space = yaml.safe_load((ROOT / "search_spaces" / "replay.yaml").read_text())["space"]
    assert best["hparams"] and set(space) <= set(best["hparams"])
    assert all(best["hparams"][name] in values for name, values in space.items())
