"""benchmarks/gpu_check.py cannot rot while no GPU is lent: its CPU dry run (`--device cpu --quick`) runs here on
two learners, one trained and one deterministic, and what it records is read back as a person and the device
call's caller would: the table on stdout and the JSON it leaves."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import assert_cuda_is_refused_without_cuda, load_benchmark

ROOT = Path(__file__).resolve().parents[2]




@pytest.fixture(scope="module")
def check():
    return load_benchmark("gpu_check")


@pytest.fixture(scope="module")
def dry_run(check, tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu-check")
    code = check.main(["--device", "cpu", "--quick", "--no-tests", "--learners", "replay", "simplecil",
                       "--out", str(out)])
    return code, json.loads((out / "gpu_check.json").read_text())


def test_the_dry_run_checks_each_learner_and_the_imagenet_pipeline(dry_run, capsys):
    code, report = dry_run
    rows = {row["learner"]: row for row in report["learners"]}
    assert code == 0, [row["problems"] for row in report["learners"]]
    assert set(rows) == {"replay", "simplecil", "replay (ImageNet crops)"}
    assert rows["replay"]["pipeline"] == "pycil-cifar" and rows["simplecil"]["pipeline"].startswith("pilot@")
    assert rows["replay (ImageNet crops)"]["pipeline"] == "pycil-imagenet@32"
    for row in rows.values():
        assert row["status"] == "finished" and not row["problems"] and 0 <= row["acc"] <= 1
        assert row["seconds"] > 0 and row["peak_memory_mib"] is None  # no GPU memory on the CPU
    # every image of every stage is counted: replay's epochs over the tasks and memory, and its tests, are more
    # than SimpleCIL's one pass of prototypes and tests over the same scenario
    assert rows["replay"]["images_per_second"] > 0 and rows["simplecil"]["backbone_images"] > 0
    assert rows["replay"]["backbone_images"] > rows["simplecil"]["backbone_images"]
    assert report["facts"]["device"] == "cpu" and report["tests"] is None


def test_a_deterministic_learner_is_compared_with_the_cpu(dry_run):
    _, report = dry_run
    simplecil = next(r for r in report["learners"] if r["learner"] == "simplecil")
    assert "simplecil" in report["deterministic"]
    assert simplecil["cpu_acc"] is not None and simplecil["cpu_acc"] == simplecil["fp32_acc"]  # CPU against CPU
    replay = next(r for r in report["learners"] if r["learner"] == "replay")
    assert replay["cpu_acc"] is None  # trained: only finite is asked of it


def test_a_failing_learner_is_recorded_with_its_traceback_and_fails_the_check(check, tmp_path, monkeypatch, capsys):
    def broken(job, data, *args, **kwargs):
        raise RuntimeError("expected all tensors to be on the same device")

    monkeypatch.setattr(check, "run_ordering", broken)
    code = check.main(["--device", "cpu", "--quick", "--no-tests", "--learners", "fluid_ncm", "--out", str(tmp_path)])
    row = json.loads((tmp_path / "gpu_check.json").read_text())["learners"][0]
    printed = capsys.readouterr().out
    assert code == 1 and row["status"] == "failed"
    assert "RuntimeError: expected all tensors" in row["problems"][0] and "Traceback" in row["traceback"]
    assert "0 of 1 learners ran; failed: fluid_ncm" in printed


def test_every_registered_learner_gets_a_job_of_its_family(check, tmp_path):
    from gtep.algorithms import ALGORITHMS
    from gtep.data import resolve_dataset

    dataset = check.dataset_spec(check.QUICK)
    data = resolve_dataset(dataset).load()
    families = set()
    for name in ALGORITHMS.names():
        if ALGORITHMS.get(name).uses_pretrained or name.startswith("cfsl"):
            continue  # their weights are pretrained first: covered by the dry run above
        job = check.job_for(name, check.QUICK, "cpu", data, dataset, tmp_path)
        assert job.scenario_family.data_flow in ALGORITHMS.get(name).data_flows
        families.add(job.family)
    assert families == {"class_incremental", "fscil", "iirc", "fluid"}


def test_the_gpu_tests_it_runs_need_no_ray(check):
    modules = {m.name for m in check.no_ray_gpu_tests()}
    assert "test_gpu_engine.py" in modules and "test_gpu_phases.py" not in modules


def test_cuda_without_cuda_is_one_error_naming_the_option(check, capsys):
    assert_cuda_is_refused_without_cuda(check.main, capsys)


def test_the_check_and_its_tests_import_nothing_the_device_lacks():
    """The device has torch, timm and torchvision, no Ray, MLflow, Optuna or pydantic: the check, the engine it
    drives, and the gpu tests it runs import none of them (pytest travels as a wheel: benchmarks/gpu_check.sh)."""
    import subprocess

    code = ("import sys\n"
            "from tests.helpers import load_benchmark\n"
            "load_benchmark('gpu_check')\n"
            "import tests.gpu.test_gpu_engine, gtep.engine.flows, gtep.engine.pretrain\n"
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'ray', 'mlflow', 'optuna', 'pydantic'}))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]", done.stdout


def test_the_stored_gpu_run_covers_every_learner_and_the_docs_show_its_rows():
    """The H200 run in benchmarks/results: every registered learner finished, the Ray-free gpu tests passed, and
    docs/benchmarks.md's table shows each row as stored (a learner added later shows up here as missing)."""
    from gtep.algorithms import ALGORITHMS

    stored = json.loads((ROOT / "benchmarks" / "results" / "gpu_check" / "gpu_check.json").read_text())
    assert stored["facts"]["gpu"].startswith("NVIDIA")
    rows = {r["learner"]: r for r in stored["learners"]}
    assert set(ALGORITHMS.names()) <= set(rows)
    assert all(r["status"] == "finished" for r in rows.values())
    assert stored["tests"]["returncode"] == 0 and " passed" in stored["tests"]["summary"]
    page = (ROOT / "docs" / "benchmarks.md").read_text()
    for name, r in rows.items():
        assert f"| {name} | {r['family']} | {r['backbone']} | {r['seconds']:.1f} |" in page, name
        assert f"| {r['acc']:.3f} |" in page



def test_the_gpu_test_step_is_sized_for_the_machine_it_runs_on(check, monkeypatch):
    """On a CPU the dry run's test step takes what this machine takes; on CUDA it keeps the device call's box; a
    limit given wins. The step runs its tests under that limit (None: subprocess.run waits for them)."""
    assert check.tests_timeout("cpu", None) is None
    assert check.tests_timeout("cuda", None) == check.tests_timeout("cuda:1", None) == 240.0
    assert check.tests_timeout("cpu", 90.0) == 90.0
    seen = {}

    def fake_run(command, **kwargs):
        seen.update(kwargs)
        return subprocess.CompletedProcess(command, 0, "1 passed in 0.1s\n", "")

    monkeypatch.setattr(check.subprocess, "run", fake_run)
    done = check.run_gpu_tests("cpu", None)
    assert seen["timeout"] is None and done["returncode"] == 0 and done["summary"] == "1 passed in 0.1s"
