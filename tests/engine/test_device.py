"""The one device rule (gtep/engine/device.py: choose_device), as each of its callers asks it: the driver naming a
trial's device (orchestration/trial_job.py, the calibration's trial slots), a command on this machine (gtep
pretrain, the study's pretraining, the engine's resolve_device, the pre-flight device check) and the calibration
timing a trial where its GPUs are simulated. trial_device's table is tests/orchestration/test_simulated_gpus.py's."""
from __future__ import annotations

import pytest
import torch

from gtep.engine.device import DeviceUnavailableError, choose_device, resolve_device


@pytest.mark.parametrize("asked, cuda, gpus, simulate, expected", [
    # the driver names a trial's device, CUDA unknown here (its workers check it): 'auto' follows the trial's GPUs
    ("auto", None, 0.5, False, "cuda"),
    ("auto", None, 0, False, "cpu"),
    ("cuda", None, 0, False, "cuda"),  # named: kept, whatever the trial's GPUs
    ("cuda:1", None, 1, False, "cuda:1"),
    ("cpu", None, 1, False, "cpu"),
    # a trial with no GPUs trains on the CPU even where the machine has CUDA (a GPU there is another trial's)
    ("auto", True, 0, False, "cpu"),
    # outside a trial (gtep pretrain, the study's pretraining, a benchmark): 'auto' is this machine's CUDA
    ("auto", True, None, False, "cuda"),
    ("auto", False, None, False, "cpu"),
    ("cuda", True, None, False, "cuda"),
    # a CUDA device torch cannot see, simulated (compute.simulate_gpus; the calibration's timing): the CPU
    ("cuda", False, 1, True, "cpu"),
    ("cuda:2", False, None, True, "cpu"),
    ("auto", False, 1, True, "cpu"),
])
def test_one_rule_decides_the_device_for_every_caller(asked, cuda, gpus, simulate, expected):
    assert choose_device(asked, cuda, trial_gpus=gpus, simulate=simulate) == expected


@pytest.mark.parametrize("asked, gpus", [("cuda", None), ("cuda:0", 1), ("auto", 1)])
def test_cuda_torch_cannot_see_is_an_error_without_simulation(asked, gpus):
    with pytest.raises(DeviceUnavailableError, match="CUDA is not available") as err:
        choose_device(asked, False, trial_gpus=gpus)
    assert isinstance(err.value, RuntimeError)  # what resolve_device raised before the rule had its own name


def test_resolve_device_asks_the_rule_with_this_machines_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == torch.device("cpu") == resolve_device("cpu")
    with pytest.raises(RuntimeError, match="'cpu' or 'auto'"):
        resolve_device("cuda")
