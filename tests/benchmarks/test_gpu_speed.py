"""benchmarks/gpu_speed.py cannot rot while no GPU is lent: its CPU dry run (`--device cpu --quick`) runs here and
what it records is read back as the device call's caller would, the tables on stdout and the JSON it leaves."""
from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import assert_cuda_is_refused_without_cuda, load_benchmark

ROOT = Path(__file__).resolve().parents[2]
PYCIL = ROOT / ".pycil"  # docs/speed.md unpacks upstream PyCIL there (ignored by git)
HAS_PYCIL = (PYCIL / "utils" / "data_manager.py").is_file()




@pytest.fixture(scope="module")
def speed():
    return load_benchmark("gpu_speed")


@pytest.fixture(scope="module")
def dry_run(speed, tmp_path_factory):
    """The trainer and ViT parts at toy size; PyCIL's part on replay alone where a checkout is here (its
    exemplar loaders start worker processes: tens of seconds on a loaded machine), else its skip."""
    out = tmp_path_factory.mktemp("gpu-speed")
    code = speed.main(["--device", "cpu", "--quick", "--out", str(out), "--pycil-methods", "replay"])
    return code, json.loads((out / "gpu_speed.json").read_text())


def positive(value: float) -> bool:
    return isinstance(value, float) and math.isfinite(value) and value > 0


def test_the_trainer_part_compares_both_sides_on_every_requested_row(speed, dry_run):
    code, report = dry_run
    rows = report["trainer"]
    assert code == 0
    assert {(r["batch"], r["precision"], r["compile"]) for r in rows} == {(16, "fp32", False), (32, "fp32", False)}
    for r in rows:
        assert positive(r["gtep_images_per_s"]) and positive(r["bare_images_per_s"]) and positive(r["ratio"])
        assert r["ratio"] == pytest.approx(r["gtep_images_per_s"] / r["bare_images_per_s"])
        assert positive(r["gflop_per_image"]) and r["peak_share"] is None  # a CPU has no bf16 peak: n/a
        # the same work on both sides: the same batches from the same weights end at the same loss
        assert r["loss"]["gtep"] == pytest.approx(r["loss"]["bare"], rel=1e-4)
    assert report["facts"]["device"] == "cpu" and report["peak_bf16_tflops"] is None


def test_the_vit_part_trains_each_method_and_records_its_cost(dry_run):
    _, report = dry_run
    rows = {r["method"]: r for r in report["vit"]}
    assert set(rows) == {"simplecil", "l2p", "dualprompt", "coda_prompt"}
    for method, r in rows.items():
        assert r["status"] == "finished" and positive(r["images_per_s"]) and r["backbone_images"] > 0
        assert r["peak_memory_mib"] is None  # no GPU memory on the CPU
        assert (r["training_steps"] == 0) == (method == "simplecil")  # SimpleCIL only averages features
    assert rows["coda_prompt"]["pipeline"].startswith("pilot-coda@")


def test_without_a_pycil_checkout_the_comparison_is_skipped_with_its_message(speed, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(speed, "DEFAULT_PYCIL", tmp_path / "no-pycil")  # as on a clone that has not unpacked one
    assert speed.main(["--device", "cpu", "--quick", "--out", str(tmp_path), "--parts", "pycil"]) == 0
    report = json.loads((tmp_path / "gpu_speed.json").read_text())
    assert "no PyCIL checkout: give --pycil PATH" in report["pycil"]["skipped"]
    assert "skipped: no PyCIL checkout" in capsys.readouterr().out


@pytest.mark.skipif(not HAS_PYCIL, reason="no PyCIL checkout at .pycil (docs/speed.md says how to unpack one)")
def test_with_a_pycil_checkout_both_toolboxes_train_the_same_work(dry_run):
    _, report = dry_run
    rows = report["pycil"]["rows"]
    assert [r["method"] for r in rows] == ["replay"]
    for r in rows:
        assert positive(r["gtep_seconds"]) and positive(r["pycil_seconds"]) and positive(r["ratio"])
        assert r["ratio"] == pytest.approx(r["gtep_seconds"] / r["pycil_seconds"])


def test_the_tables_name_each_part(speed, tmp_path, capsys):
    speed.main(["--device", "cpu", "--quick", "--out", str(tmp_path), "--parts", "vit"])
    printed = capsys.readouterr().out
    assert "(c) the paper's ViT methods" in printed and "coda_prompt" in printed and "n/a" in printed


def test_a_missing_pycil_checkout_given_by_path_is_one_error_naming_the_option(speed, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        speed.main(["--device", "cpu", "--quick", "--pycil", str(tmp_path)])
    assert exit_.value.code == 2 and f"--pycil {tmp_path}: not a PyCIL checkout" in capsys.readouterr().err


def test_cuda_without_cuda_is_one_error_naming_the_option(speed, capsys):
    assert_cuda_is_refused_without_cuda(speed.main, capsys)


def test_the_scipy_shim_computes_pycil_s_distances(speed, tmp_path):
    """The device has no scipy; PyCIL's NME classifier calls scipy.spatial.distance.cdist(..., "sqeuclidean")."""
    import numpy as np

    namespace: dict = {}
    exec(speed.SCIPY_SHIM, namespace)  # noqa: S102 - the shim's own source, as the PyCIL subprocess imports it
    a, b = np.random.default_rng(0).normal(size=(3, 5)), np.random.default_rng(1).normal(size=(4, 5))
    expected = ((a[:, None, :] - b[None, :, :]) ** 2).sum(-1)
    assert np.allclose(namespace["cdist"](a, b, "sqeuclidean"), expected)
    assert np.allclose(namespace["cdist"](a, b), np.sqrt(expected))


def test_the_script_imports_nothing_the_device_lacks():
    """The device has torch, timm, torchvision and numpy, no Ray, MLflow, Optuna, pydantic or scipy: the script and
    the benchmarks it reuses import none of them (PyCIL's one use of scipy gets a shim there)."""
    code = ("import sys\n"
            "from tests.helpers import load_benchmark\n"
            "load_benchmark('gpu_speed')\n"
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'ray', 'mlflow', 'optuna', 'pydantic', 'scipy'}))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]", done.stdout
