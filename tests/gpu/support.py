"""What the `gpu` group shares: the device it runs on and the skip without one.

The group runs where CUDA is (`pytest -m gpu`); everywhere else it is skipped. GTEP_GPU_TEST_DEVICE=cpu runs
the same tests on the CPU instead, with the CUDA-only expectations (bf16, channels-last, a GPU per trial)
turned into their CPU equivalents: that checks the tests themselves before GPU time is spent on them.
"""
from __future__ import annotations

import os

import pytest
import torch

DEVICE = os.environ.get("GTEP_GPU_TEST_DEVICE", "cuda")
ON_CUDA = DEVICE.startswith("cuda")

requires_device = pytest.mark.skipif(ON_CUDA and not torch.cuda.is_available(),
                                     reason="the gpu group needs CUDA (or GTEP_GPU_TEST_DEVICE=cpu for a dry run)")
gpu_group = [pytest.mark.gpu, requires_device]
