"""`gtep check` says when the installed torch is a CUDA build and the machine has no CUDA device (issue 68): one
line, the alternative (PyTorch's CPU wheel index) in it."""
from __future__ import annotations

import pytest
import torch
from typer.testing import CliRunner

import gtep
from gtep.cli import app
from gtep.preflight.checks import CPU_WHEELS, cuda_build_note


def checked(tmp_path, monkeypatch: pytest.MonkeyPatch, cuda: str | None) -> str:
    monkeypatch.setattr(torch.version, "cuda", cuda)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    result = CliRunner().invoke(app, ["check", "--preset", "default", "--output", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    return result.output


def test_check_says_a_cuda_build_on_a_machine_without_cuda(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    output = checked(tmp_path, monkeypatch, "12.4")
    notes = [" ".join(part.split()) for part in output.split("note:")[1:]]
    said = [n for n in notes if "CUDA 12.4 build" in n]
    assert said, output
    assert "this machine has no CUDA device" in said[0] and CPU_WHEELS in said[0], said[0]
    assert "several GB" in said[0]


def test_check_says_nothing_of_a_cpu_build(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert "CUDA" not in checked(tmp_path, monkeypatch, None)


def test_nothing_is_said_where_cuda_works_or_trials_run_elsewhere(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.version, "cuda", "12.4")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert cuda_build_note(gtep.experiment()) is None
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert cuda_build_note(gtep.experiment()) is not None
    on_cluster = gtep.experiment().with_overrides(**{"compute.ray_address": "auto"})
    assert cuda_build_note(on_cluster) is None
