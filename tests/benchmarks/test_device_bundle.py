"""benchmarks/device_bundle.py, the packages the GPU machine lacks as one archive: what it bundles, how the trace
decides what to cut, and the size it refuses (default group, no download); and the 3.11 bundle built for real,
unpacked into an environment with only torch, torchvision, timm and the device image's packages, running the
GPU study's packed CPU dry run (the device call's own path) to the same H*, table and images as this install (slow
group)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from tests.helpers import load_benchmark

ROOT = Path(__file__).resolve().parents[2]


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


# ---------------------------------------------------------------- the 3.11 bundle for real (slow group)

def image_site(folder: Path, bundle) -> Path:
    """What the device image holds of gtep's needs: torch, torchvision, timm and the image's packages that gtep's
    closure names, as links to this environment's installs (their files, their metadata), and nothing else."""
    keep = {name for name in bundle.requirement_closure("gtep", "3.11") if name in bundle.IMAGE_PACKAGES}
    for root in ("torch", "torchvision", "timm"):
        keep |= {name for name in bundle.requirement_closure(root, "3.11")} | {root}
    folder.mkdir()
    for name in sorted(keep):
        dist = metadata.distribution(name)
        base = Path(dist.locate_file(""))
        tops = {Path(f).parts[0] for f in dist.files or [] if not str(f).startswith("..")}
        for top in tops:
            if (base / top).exists() and not (folder / top).exists():
                (folder / top).symlink_to(base / top)
    return folder


def bundled_dry_run(python: str, folder: Path, env: dict[str, str], share: float) -> dict:
    """The GPU study's CPU dry run at one share, run by `python` (the bundled environment), as the device call runs
    it under the bundle (benchmarks/gpu_study.sh); its row of gpu_study.json."""
    done = subprocess.run([python, str(ROOT / "benchmarks" / "gpu_study.py"), "--device", "cpu", "--quick",
                           "--shares", str(share), "--out", str(folder)], env=env, cwd=folder,
                          capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
    row, = json.loads((folder / "gpu_study.json").read_text())["studies"]
    return row


def without_run_ids(best: dict) -> dict:
    """H* as best.yaml holds it, less its MLflow run ids (new in every store): the set, its values, its scores."""
    return {k: v for k, v in best.items() if not k.endswith("run_id")}


@pytest.mark.slow
def test_the_311_bundle_runs_the_gpu_study_as_a_normal_install_does(bundle, tmp_path):
    """The same script that builds the device's 3.12 bundle builds this machine's 3.11 one. Its trace is the GPU
    study's CPU dry run (benchmarks/gpu_study.py --device cpu --quick: `gtep run` through Ray at shares 1 and 0.5
    of a logical GPU) in this install: both studies are checked. Unpacked beside only torch, torchvision, timm and
    the device image's packages, the bundle runs the packed study again (share 0.5, two trials at once: the device
    call's own path) to the same H*, the same table and the same images trained as this install."""
    archive = bundle.build("3.11", retrace=True)
    manifest = json.loads((bundle.BUNDLE_DIR / "MANIFEST-cp311.json").read_text())
    assert archive.stat().st_size / 2**20 <= bundle.LIMIT_MIB and manifest["packages"]["ray"]
    cut = {c["path"] for c in manifest["cut"]}
    assert {"ray/jars", "ray/rllib"} <= cut, sorted(cut)[:40]  # what a Python-only study never loads
    trace = json.loads(bundle.TRACE_FILE.read_text())
    dry = {row["share"]: row for row in trace["dry_run"]["studies"]}
    assert set(dry) == {1.0, 0.5} and dry[0.5]["trials_at_once"] == 2
    assert all(row["returncode"] == 0 and row["store"]["passed"] for row in dry.values()), dry
    # packing two trials on a GPU changes no result: the same H* as one trial at a time (in a study of its own name)
    assert ({**without_run_ids(dry[0.5]["best"]), "study": ""} == {**without_run_ids(dry[1.0]["best"]), "study": ""}
            and dry[1.0]["best"]["hparams"])

    deps, venv = tmp_path / "deps", tmp_path / "venv"
    deps.mkdir()
    subprocess.run(["tar", "-xJf", str(archive), "-C", str(deps)], check=True)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next((venv / "lib").glob("python3.*/site-packages"))
    (site / "image.pth").write_text(str(image_site(tmp_path / "image", bundle)) + "\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    fresh_env = {**env, "PYTHONPATH": os.pathsep.join([str(deps), str(ROOT)])}
    python = str(venv / "bin" / "python")
    # the fresh environment has no Ray of its own: what it imports comes from the bundle
    probe = subprocess.run([python, "-c", "import ray, mlflow, torch; print(ray.__file__); print(torch.__file__)"],
                           env=fresh_env, capture_output=True, text=True, check=True).stdout.split()
    assert probe[0].startswith(str(deps)) and not probe[1].startswith(str(deps))
    bare = subprocess.run([python, "-c", "import ray"], env={**env, "PYTHONPATH": str(ROOT)}, capture_output=True)
    assert bare.returncode != 0

    (tmp_path / "study").mkdir()
    bundled = bundled_dry_run(python, tmp_path / "study", fresh_env, 0.5)
    assert bundled["returncode"] == 0 and bundled["store"]["passed"] and bundled["trials_at_once"] == 2
    assert without_run_ids(bundled["best"]) == without_run_ids(dry[0.5]["best"])
    assert bundle.study_table(bundled["output"]) == dry[0.5]["printed"] and dry[0.5]["printed"]
    for phase in ("tune", "evaluate"):
        assert bundled[phase]["images"] == dry[0.5][phase]["images"] > 0, phase
