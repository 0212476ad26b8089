"""The packages gtep needs that the GPU machine's image lacks, as one xz archive that travels with the device call.

The device machine (see docs/benchmarks.md, "On a GPU") has Python 3.12, torch, torchvision, timm and a long list
of scientific packages, but no Ray, MLflow, Optuna, pydantic or SQLAlchemy, and no network; what travels with a
call is at most 64 MiB. This script:

1. walks gtep's requirements (this environment's installed metadata, markers evaluated for the target Python)
   and keeps the distributions the image lacks (IMAGE_PACKAGES, read off the image's package list);
2. downloads their wheels from the package registry for CPython `--python` on manylinux x86_64, at the versions
   installed here (the versions gtep's tests ran with), and installs them with pip into a staging folder;
3. cuts what a real study never touches. The cut is decided by a trace, not a guess: `--trace` (or the first
   build) runs a real study (`gtep run` of the GPU study's CPU dry run, benchmarks/gpu_study.py) with an audit
   hook in every process, Ray's workers and agents included, that records each module imported, file opened,
   library loaded and program started under this environment's site-packages. A folder of a bundled package
   that no traced process touched is cut whole, unless it is small (CUT_MIN_BYTES): small folders cost little
   and a path the trace missed costs a failed device call;
4. packs the rest into `.device-bundle/gtep-deps-cp<XY>.tar.xz` with `MANIFEST.json` (what is in it, what was cut
   and why, each package's version) beside it and inside it, prints its size and refuses above 48 MiB, so that
   the working tree and the bundle travel together in one call (64 MiB).

    python benchmarks/device_bundle.py                 # the device's CPython 3.12
    python benchmarks/device_bundle.py --python 3.11   # this machine's, to test the bundle here
    python benchmarks/device_bundle.py --trace         # trace a study again (after a dependency upgrade)

On the device: `tar -xJf .device-bundle/gtep-deps-cp312.tar.xz -C /tmp/gtep-deps` and put /tmp/gtep-deps and the
repository on PYTHONPATH (benchmarks/gpu_study.sh does this).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
BUNDLE_DIR = ROOT / ".device-bundle"
TRACE_FILE = BUNDLE_DIR / "trace.json"
LIMIT_MIB = 48.0
CUT_MIN_BYTES = 64 * 1024
MANYLINUX = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux_2_5_x86_64", "manylinux1_x86_64")

# The GPU machine's image ('cuda'), read off a machine running it on 2026-11-17 (the device tool's KINDS.md).
# A distribution named here is not bundled: the image's own version is used.
IMAGE_PACKAGES = frozenset(canonicalize_name(n) for n in """
absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch build certifi
charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings cuda-core cuda-pathfinder
cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils execnet filelock flatbuffers flax fonttools
formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize hypothesis idna
imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib kiwisolver
lazy-loader lightning lightning-utilities linear-operator lineax llvmlite lxml markdown markdown-it-py markupsafe
matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack multidict multipledispatch mypy-extensions nanobind narwhals
networkx ninja numba numba-cuda numpy numpyro nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc nvidia-cuda-runtime
nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13
nvidia-ml-py nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir onnxruntime onnxscript
optax opt-einsum opt-einsum-fx optimistix orbax-checkpoint packaging pandas pathspec patsy peft pillow pip pluggy
portalocker prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments pyparsing
pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout pytest-xdist
python-dateutil pytorch-lightning pyyaml regex requests rich sacrebleu safetensors scikit-build-core scikit-image
scikit-learn scipy seaborn sentencepiece sentence-transformers setuptools shellingham simplejson six
sortedcontainers statsmodels sympy tabulate tensorboard tensorboard-data-server tensorstore threadpoolctl tifffile
tiktoken timm tokenizers toolz torch torchaudio torchdiffeq torch-geometric torchmetrics torchvision tqdm
transformers treescope triton typer typing-extensions typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel
wrapt xarray xxhash yarl zipp
""".split())


def marker_environment(python: str) -> dict[str, str]:
    return {"python_version": python, "python_full_version": f"{python}.0", "sys_platform": "linux",
            "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix",
            "implementation_name": "cpython", "platform_python_implementation": "CPython", "platform_release": "",
            "platform_version": "", "implementation_version": f"{python}.0"}


def requirement_closure(root: str, python: str) -> dict[str, str]:
    """Every distribution `root` needs, with extras followed, as installed here: name -> version."""
    env = marker_environment(python)
    found: dict[str, str] = {}
    todo: list[tuple[str, frozenset[str]]] = [(root, frozenset())]
    seen: set[tuple[str, frozenset[str]]] = set()
    while todo:
        name, extras = todo.pop()
        if (name, extras) in seen:
            continue
        seen.add((name, extras))
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            raise SystemExit(f"{name} is needed by gtep but not installed here: install gtep first "
                             f"(pip install -e .) and run this script with that environment's python")
        found[canonicalize_name(name)] = dist.version
        for line in dist.requires or []:
            req = Requirement(line)
            if req.marker is not None and not any(
                    req.marker.evaluate({**env, "extra": extra}) for extra in (extras or {""})):
                continue
            todo.append((req.name, frozenset(req.extras)))
    found.pop(canonicalize_name(root), None)
    return found


def wanted(python: str) -> dict[str, str]:
    """The distributions to bundle: gtep's closure less what the device image holds."""
    return {name: version for name, version in sorted(requirement_closure("gtep", python).items())
            if name not in IMAGE_PACKAGES}


def download(packages: dict[str, str], python: str, wheels: Path) -> list[Path]:
    wheels.mkdir(parents=True, exist_ok=True)
    platforms = [arg for plat in MANYLINUX for arg in ("--platform", plat)]
    command = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
               "--python-version", python, "--implementation", "cp", *platforms, "-d", str(wheels),
               *(f"{name}=={version}" for name, version in packages.items())]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"pip download failed for CPython {python}:\n{done.stderr[-3000:]}")
    by_name = {canonicalize_name(w.name.split("-")[0]): w for w in wheels.glob("*.whl")}
    missing = sorted(set(packages) - set(by_name))
    if missing:
        raise SystemExit(f"no wheel downloaded for: {', '.join(missing)}")
    return [by_name[name] for name in packages]


def stage(wheel_files: list[Path], python: str, target: Path) -> None:
    """pip's own install of the wheels into `target` (no compiled .pyc: the device compiles what it imports)."""
    platforms = [arg for plat in MANYLINUX for arg in ("--platform", plat)]
    command = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--no-compile",
               "--only-binary=:all:", "--python-version", python, "--implementation", "cp", *platforms,
               "--target", str(target), *map(str, wheel_files)]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"pip install --target failed:\n{done.stderr[-3000:]}")


# --- the trace -------------------------------------------------------------------------------------------------

SITECUSTOMIZE = '''
# gtep's device_bundle trace: what this process imports, opens, loads and starts under the traced roots.
import os, sys
_dir = os.environ["GTEP_BUNDLE_TRACE_DIR"]
_roots = tuple(p for p in os.environ["GTEP_BUNDLE_TRACE_ROOTS"].split(os.pathsep) if p)
_seen = set()
_out = []
def _path(value):
    if isinstance(value, bytes):
        value = os.fsdecode(value)
    return value if isinstance(value, str) else None
def _record(kind, value):
    if value is None or (kind != "import" and not value.startswith(_roots)) or (kind, value) in _seen:
        return
    _seen.add((kind, value))
    if not _out:
        _out.append(open(os.path.join(_dir, f"{os.getpid()}.txt"), "a", buffering=1))
    _out[0].write(kind + "\\t" + value + "\\n")
def _hook(event, args):
    try:
        if event == "open":
            _record("file", _path(args[0]))
        elif event == "import":
            _record("import", args[0])
        elif event == "ctypes.dlopen":
            _record("file", _path(args[0]))
        elif event in ("subprocess.Popen", "os.posix_spawn", "os.exec"):
            _record("file", _path(args[0]))
            if event == "subprocess.Popen" and args[1]:
                _record("file", _path(list(args[1])[0]))
    except Exception:
        pass
sys.addaudithook(_hook)
'''


def site_packages() -> Path:
    import sysconfig
    return Path(sysconfig.get_paths()["purelib"])


def run_trace() -> dict:
    """Run the GPU study's CPU dry run (a real `gtep run` through Ray) with the audit hook in every process."""
    site = site_packages()
    with tempfile.TemporaryDirectory(prefix="gtep-bundle-trace-") as tmp:
        hook_dir, log_dir = Path(tmp) / "hook", Path(tmp) / "log"
        hook_dir.mkdir()
        log_dir.mkdir()
        (hook_dir / "sitecustomize.py").write_text(SITECUSTOMIZE)
        env = {**os.environ, "GTEP_BUNDLE_TRACE_DIR": str(log_dir), "GTEP_BUNDLE_TRACE_ROOTS": str(site),
               "PYTHONPATH": os.pathsep.join([str(hook_dir), str(ROOT), os.environ.get("PYTHONPATH", "")])}
        tic = time.time()
        done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_study.py"), "--device", "cpu",
                               "--quick", "--out", str(Path(tmp) / "study")], env=env, cwd=tmp,
                              capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"the traced study failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
        dry_run = json.loads((Path(tmp) / "study" / "gpu_study.json").read_text())
        files: set[str] = set()
        imports: set[str] = set()
        processes = 0
        for log in log_dir.glob("*.txt"):
            processes += 1
            for line in log.read_text().splitlines():
                kind, _, value = line.partition("\t")
                if kind == "import":
                    imports.add(value)
                else:
                    files.add(os.path.relpath(value, site))
    return {"study": "benchmarks/gpu_study.py --device cpu --quick", "seconds": round(time.time() - tic, 1),
            "processes": processes, "python": sys.version.split()[0],
            "dry_run": {"table": dry_run["table"], "studies": [{**{k: row.get(k) for k in (
                "share", "trials_at_once", "returncode", "store", "tune", "evaluate", "best")},
                "printed": study_table(row.get("output", ""))} for row in dry_run["studies"]]},
            "files": sorted(f for f in files if not f.startswith("..")), "imports": sorted(imports)}


def study_table(printed: str) -> list[str]:
    """The phases side by side as `gtep run` printed them: the table's rows, without the lines that name folders
    (what a bundled run of the same study must print again)."""
    return [line for line in printed.splitlines() if "│" in line or "|" in line]


def used_folders(trace: dict) -> set[str]:
    """Folders (relative to site-packages, '/'-separated) holding something the study touched, and their parents."""
    used: set[str] = set()
    paths = [f for f in trace["files"]]
    # an imported module's folder: a.b.c is a/b/c (a package) or lives in a/b (a module, an extension)
    paths += [name.replace(".", "/") + "/__init__.py" for name in trace["imports"]]
    paths += [name.replace(".", "/") for name in trace["imports"]]
    for path in paths:
        parts = path.split("/")[:-1]
        for depth in range(1, len(parts) + 1):
            used.add("/".join(parts[:depth]))
    return used


def folder_sizes(top: Path) -> dict[str, int]:
    sizes: dict[str, int] = {}
    for dirpath, _, filenames in os.walk(top):
        size = sum((Path(dirpath) / f).stat().st_size for f in filenames)
        rel = Path(dirpath).relative_to(top).as_posix()
        parts = [] if rel == "." else rel.split("/")
        for depth in range(1, len(parts) + 1):
            key = "/".join(parts[:depth])
            sizes[key] = sizes.get(key, 0) + size
    return sizes


def cuts(staged: Path, used: set[str]) -> list[dict]:
    """The largest folders no traced process touched (their parent was touched), each at least CUT_MIN_BYTES."""
    sizes = folder_sizes(staged)
    chosen = []
    for folder, size in sorted(sizes.items()):
        parent = folder.rpartition("/")[0]
        if folder in used or (parent and parent not in used) or size < CUT_MIN_BYTES:
            continue
        if folder.endswith(".dist-info"):
            continue  # metadata: version checks read it
        reason = "scripts: gtep starts Ray from Python" if folder == "bin" else "no traced process touched it"
        chosen.append({"path": folder, "bytes": size, "reason": reason})
    return chosen


def pack(staged: Path, archive: Path, manifest: dict) -> None:
    """tar | xz -6 on every core where the xz program is there (Python's lzma is single-threaded: minutes)."""
    (staged / "GTEP_BUNDLE_MANIFEST.json").write_text(json.dumps(manifest, indent=1))
    names = sorted(item.name for item in staged.iterdir())
    if shutil.which("xz") and shutil.which("tar"):
        with open(archive, "wb") as out:
            tar = subprocess.Popen(["tar", "-cf", "-", "-C", str(staged), *names], stdout=subprocess.PIPE)
            xz = subprocess.run(["xz", "-6", "-T0", "-c"], stdin=tar.stdout, stdout=out)
            assert tar.stdout is not None
            tar.stdout.close()
            if tar.wait() != 0 or xz.returncode != 0:
                raise SystemExit(f"tar | xz failed ({tar.returncode}, {xz.returncode}) while packing {archive}")
        return
    with tarfile.open(archive, "w:xz", preset=6) as tar_file:
        for name in names:
            tar_file.add(staged / name, arcname=name)


def build(python: str, retrace: bool) -> Path:
    tag = "cp" + python.replace(".", "")
    packages = wanted(python)
    print(f"gtep needs {len(packages)} distributions the device image lacks (CPython {python}): "
          + ", ".join(f"{n} {v}" for n, v in packages.items()), flush=True)
    if retrace or not TRACE_FILE.exists():
        print("tracing a real study (gpu_study.py --device cpu --quick) ...", flush=True)
        BUNDLE_DIR.mkdir(exist_ok=True)
        TRACE_FILE.write_text(json.dumps(run_trace(), indent=1))
    trace = json.loads(TRACE_FILE.read_text())
    used = used_folders(trace)
    wheel_files = download(packages, python, BUNDLE_DIR / f"wheels-{tag}")
    staged = BUNDLE_DIR / f"stage-{tag}"
    shutil.rmtree(staged, ignore_errors=True)
    stage(wheel_files, python, staged)
    before = sum(folder_sizes(staged).get(item.name, item.stat().st_size) for item in staged.iterdir())
    cut = cuts(staged, used)
    for item in cut:
        shutil.rmtree(staged / item["path"])
    after = sum(folder_sizes(staged).get(item.name, item.stat().st_size) for item in staged.iterdir())
    manifest = {"python": python, "platform": "manylinux x86_64", "built": time.strftime("%Y-%m-%d %H:%M:%S"),
                "packages": packages, "trace": {k: trace[k] for k in ("study", "seconds", "processes", "python")},
                "unpacked_bytes_before_cut": before, "unpacked_bytes": after, "cut": cut}
    archive = BUNDLE_DIR / f"gtep-deps-{tag}.tar.xz"
    pack(staged, archive, manifest)
    mib = archive.stat().st_size / 2**20
    manifest["archive_mib"] = round(mib, 2)
    (BUNDLE_DIR / f"MANIFEST-{tag}.json").write_text(json.dumps(manifest, indent=1))
    print(f"cut {len(cut)} folders ({sum(c['bytes'] for c in cut) / 2**20:.1f} MiB of {before / 2**20:.1f} MiB "
          f"unpacked); largest: " + ", ".join(f"{c['path']} ({c['bytes'] / 2**20:.1f} MiB)" for c in
                                             sorted(cut, key=lambda c: -c["bytes"])[:6]))
    print(f"{archive.relative_to(ROOT)}: {mib:.1f} MiB (limit {LIMIT_MIB:.0f} MiB), manifest "
          f"{(BUNDLE_DIR / f'MANIFEST-{tag}.json').relative_to(ROOT)}")
    refuse_if_too_large(archive)
    return archive


def refuse_if_too_large(archive: Path) -> None:
    """Above LIMIT_MIB the bundle and the working tree would not travel in one call: removed, with the reason."""
    mib = archive.stat().st_size / 2**20
    if mib > LIMIT_MIB:
        archive.unlink()
        raise SystemExit(f"the bundle is {mib:.1f} MiB, over {LIMIT_MIB:.0f} MiB: with the working tree it would not "
                         f"travel in one call (64 MiB); cut more (see the manifest's largest folders)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", default="3.12", help="the target CPython, X.Y (default 3.12: the device's)")
    parser.add_argument("--trace", action="store_true", help="trace a real study again before cutting")
    args = parser.parse_args(argv)
    if not re.fullmatch(r"3\.\d+", args.python):
        parser.error(f"--python {args.python}: give a CPython version as X.Y, e.g. 3.12")
    build(args.python, args.trace)
    return 0


if __name__ == "__main__":
    sys.exit(main())
