"""benchmarks/device_bundle.py, the packages the GPU machine lacks as one archive: what it bundles, how the trace
decides what to cut, and the size it refuses (default group, no download); and the 3.11 bundle built for real,
unpacked into an environment with only torch, torchvision, timm and the device image's packages, running the
default study to the same H* and table as this install (slow group)."""
from __future__ import annotations

import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from tests.helpers import load_benchmark

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def bundle():
    return load_benchmark("device_bundle")


def test_the_bundle_holds_what_gtep_needs_and_the_image_lacks(bundle):
    wanted = bundle.wanted("3.12")
    for needed in ("ray", "mlflow", "optuna", "pydantic", "sqlalchemy", "alembic"):
        assert needed in wanted, needed
    for in_image in ("torch", "torchvision", "timm", "numpy", "pandas", "pyarrow", "typer", "rich", "pyyaml"):
        assert in_image not in wanted, in_image
    assert not set(wanted) & bundle.IMAGE_PACKAGES
    # the versions this environment runs, the ones gtep's tests passed with
    assert wanted["ray"] == metadata.version("ray") and wanted["mlflow"] == metadata.version("mlflow")


def write(path: Path, size: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x" * size)


def test_a_folder_no_traced_process_touched_is_cut_and_the_rest_kept(bundle, tmp_path):
    big, small = 2 * bundle.CUT_MIN_BYTES, bundle.CUT_MIN_BYTES // 4
    write(tmp_path / "pkg" / "__init__.py", 10)
    write(tmp_path / "pkg" / "used" / "mod.py", big)
    write(tmp_path / "pkg" / "opened" / "data.bin", big)           # read by a traced process, never imported
    write(tmp_path / "pkg" / "jars" / "big.jar", big)               # nothing touched it
    write(tmp_path / "pkg" / "jars" / "deeper" / "more.jar", big)   # cut with its parent, not listed apart
    write(tmp_path / "pkg" / "tiny" / "x.py", small)                # untouched but too small to matter
    write(tmp_path / "pkg-1.0.dist-info" / "RECORD", big)           # metadata: always kept
    write(tmp_path / "untouched_dist" / "__init__.py", big)         # a whole dependency no process imported
    write(tmp_path / "bin" / "ray", big)                            # console scripts
    trace = {"files": ["pkg/opened/data.bin"], "imports": ["pkg", "pkg.used.mod", "json"]}
    cut = {c["path"]: c for c in bundle.cuts(tmp_path, bundle.used_folders(trace))}
    assert set(cut) == {"pkg/jars", "untouched_dist", "bin"}
    assert cut["pkg/jars"]["bytes"] == 2 * big and cut["bin"]["reason"].startswith("scripts")


def test_the_audit_hook_records_what_a_process_imports_opens_and_starts(bundle, tmp_path):
    hook, log, root = tmp_path / "hook", tmp_path / "log", tmp_path / "root"
    for folder in (hook, log, root):
        folder.mkdir()
    (hook / "sitecustomize.py").write_text(bundle.SITECUSTOMIZE)
    (root / "data.txt").write_text("x")
    (tmp_path / "outside.txt").write_text("x")
    script = (f"import email.mime.text; open({str(root / 'data.txt')!r}).read(); "
              f"open({str(tmp_path / 'outside.txt')!r}).read(); "
              f"import subprocess; subprocess.run([{sys.executable!r}, '-c', 'import colorsys'])")
    env = {**os.environ, "PYTHONPATH": str(hook), "GTEP_BUNDLE_TRACE_DIR": str(log),
           "GTEP_BUNDLE_TRACE_ROOTS": str(root)}
    subprocess.run([sys.executable, "-c", script], env=env, check=True)
    lines = [line.split("\t") for f in log.glob("*.txt") for line in f.read_text().splitlines()]
    assert len(list(log.glob("*.txt"))) == 2  # the child process traced itself too
    imports = {value for kind, value in lines if kind == "import"}
    files = {value for kind, value in lines if kind == "file"}
    assert {"email.mime.text", "colorsys"} <= imports
    assert files == {str(root / "data.txt")}  # only what lies under the traced roots


def test_a_bundle_over_the_limit_is_refused_and_removed(bundle, tmp_path, monkeypatch):
    archive = tmp_path / "gtep-deps-cp312.tar.xz"
    archive.write_bytes(b"x" * 2**20)
    monkeypatch.setattr(bundle, "LIMIT_MIB", 0.5)
    with pytest.raises(SystemExit, match=r"1\.0 MiB, over 0 MiB: .* would not travel in one call"):
        bundle.refuse_if_too_large(archive)
    assert not archive.exists()
    monkeypatch.setattr(bundle, "LIMIT_MIB", 48.0)
    archive.write_bytes(b"x" * 2**20)
    bundle.refuse_if_too_large(archive)
    assert archive.exists()


def test_a_python_version_that_is_not_x_y_is_refused_before_anything_is_downloaded(bundle, capsys):
    with pytest.raises(SystemExit):
        bundle.main(["--python", "3"])
    assert "--python 3: give a CPython version as X.Y" in capsys.readouterr().err
