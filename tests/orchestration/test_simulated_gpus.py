"""compute.simulate_gpus (issue 48): a trial that Ray gave a GPU torch cannot see (`ray start --num-gpus 8` on a CPU
machine, or a CPU build of torch on a GPU node) trains on the CPU only when simulation is asked for, and records the
GPU ids Ray gave it; otherwise it stops with one clear error, logged as the unit's failure. No Ray here: the decision
is a pure function, and run_unit is called directly with Ray's GPU ids stood in for."""
from __future__ import annotations

import dataclasses
import json

import pytest

from gtep.config import ConfigError, ExperimentConfig
from gtep.config.files import validate_config
from gtep.config.resolution import resolve
from gtep.data import resolve_dataset
from gtep.engine.device import GpuNotVisibleError, TrialDevice, trial_device
from gtep.orchestration import trainable
from gtep.orchestration.trial_job import StudyFolders, trial_job
from tests.orchestration.test_phases import config


@pytest.mark.parametrize("asked, ids, cuda, simulate, expected", [
    ("cuda", ["3"], False, True, TrialDevice("cpu", ("3",), simulated=True)),  # the rehearsal: CPU, ids kept
    ("cuda", [0, 1], True, True, TrialDevice("cuda", ("0", "1"))),  # a GPU torch sees is used, simulation or not
    ("cuda", ["0"], True, False, TrialDevice("cuda", ("0",))),
    ("cpu", ["2"], False, False, TrialDevice("cpu", ("2",))),  # training.device cpu: the GPU is not used at all
    ("cuda", [], False, False, TrialDevice("cuda", ())),  # no GPU from Ray: resolve_device says what is wrong
])
def test_the_device_follows_the_gpus_ray_gave_torch_and_the_simulate_flag(asked, ids, cuda, simulate, expected):
    assert trial_device(asked, ids, cuda, simulate) == expected


def test_a_gpu_torch_cannot_see_is_one_clear_error_without_simulation(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5")
    with pytest.raises(GpuNotVisibleError) as err:
        trial_device("cuda", ["5"], cuda_available=False, simulate=False)
    message = str(err.value)
    assert "\n" not in message
    assert "GPU 5" in message and "CUDA_VISIBLE_DEVICES='5'" in message and "compute.simulate_gpus: true" in message


def test_simulate_gpus_without_gpus_per_trial_is_refused_naming_the_field():
    doc = config(compute={"simulate_gpus": True})
    with pytest.raises(ConfigError, match="simulate_gpus") as err:
        validate_config(doc, "exp.yaml")
    assert "gpus_per_trial" in str(err.value)
    with pytest.raises(ConfigError, match="simulate_gpus"):
        validate_config(config(compute={"simulate_gpus": "sometimes"}), "exp.yaml")
    accepted = validate_config(config(compute={"simulate_gpus": True, "gpus_per_trial": 0.25}), "exp.yaml")
    assert accepted.compute.simulate_gpus is True


def unit_job(tmp_path, simulate: bool):
    resolved = resolve(ExperimentConfig.model_validate(
        config(compute={"gpus_per_trial": 0.5, "simulate_gpus": simulate})))
    folders = StudyFolders(unit_dir=tmp_path / "units", events=tmp_path / "events.jsonl", attempt="a")
    folders.unit_dir.mkdir()
    job = trial_job(resolved, "tune", folders)
    spec = resolved.phase("tune")
    data = resolve_dataset(spec.dataset).load().subset(sorted(spec.classes))
    return job, data


def events(tmp_path) -> list[dict]:
    return [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]


@pytest.fixture
def gpu_3_that_torch_cannot_see(monkeypatch):
    monkeypatch.setattr(trainable, "ray_gpu_ids", lambda: ["3"])
    monkeypatch.setattr(trainable.torch.cuda, "is_available", lambda: False)


def test_a_simulated_gpu_trains_on_the_cpu_and_records_its_id(tmp_path, gpu_3_that_torch_cannot_see, monkeypatch):
    job, data = unit_job(tmp_path, simulate=True)
    assert job.scenario.device == "cuda", "gpus_per_trial > 0 asks for CUDA"
    trained_on: list[str] = []

    def train(set_index, hparams, s, phase_data, job, checkpoint, on_task_end=None, fit_mode=None):  # the engine, faster
        trained_on.append(job.ordering(hparams, s).device)
        return {"status": "finished", "device": "cpu", "node": "", "resumed_tasks": 0, "first_task": ""}

    monkeypatch.setattr(trainable, "_train_unit", train)
    record = trainable.run_unit(0, {}, 0, data, job)
    assert trained_on == ["cpu"]
    assert record["status"] == "finished" and record["gpu_ids"] == "3"
    assert record["device"] == "cpu (simulating GPU 3)"  # MLflow's gtep.device, beside gtep.gpu_ids
    started, trained = [e for e in events(tmp_path) if e["event"] in ("unit_started", "unit_trained")]
    assert started["gpu_ids"] == trained["gpu_ids"] == ["3"] and started["device"] == "cpu"


def test_without_simulation_the_unit_fails_with_that_one_line(tmp_path, gpu_3_that_torch_cannot_see):
    job, data = unit_job(tmp_path, simulate=False)
    with pytest.raises(GpuNotVisibleError, match="compute.simulate_gpus"):
        trainable.run_unit(0, {}, 0, data, job)
    failed, = events(tmp_path)
    assert failed["event"] == "unit_failed" and "GPU 3" in failed["message"]
    assert not list((tmp_path / "units").iterdir()), "nothing trained"


def test_the_job_keeps_its_device_when_nothing_changes(tmp_path):
    job, _ = unit_job(tmp_path, simulate=True)
    assert job.on_device("cuda") is job
    assert job.on_device("cpu") == dataclasses.replace(job, scenario=dataclasses.replace(job.scenario, device="cpu"))


def test_a_failed_trials_run_gets_its_errors_last_line():
    from gtep.orchestration.tracking import error_message

    class Trial:
        def __init__(self, text):
            self.text = text

        def get_error(self):
            if isinstance(self.text, Exception):
                raise self.text
            return self.text

    traceback = ("Failure # 1\nTraceback (most recent call last):\n  File \"trainable.py\", line 9\n"
                 "gtep.engine.device.GpuNotVisibleError: Ray gave this trial GPU 3 but torch sees no CUDA device\n\n")
    assert error_message(Trial(traceback)) == ("gtep.engine.device.GpuNotVisibleError: Ray gave this trial GPU 3 "
                                                "but torch sees no CUDA device")
    assert error_message(Trial(None)) == "" and error_message(Trial(OSError("gone"))) == ""
