"""Every registered algorithm's results on a tiny CPU scenario, compared bit for bit with a golden record.

Each algorithm runs one ordering of the 3-task scenario of tests/helpers.py (ResNet methods through
`small_job`, pretrained-ViT methods through `small_vit_job`) with a couple of epochs, its own extra stages
shortened too. The record holds the accuracy matrix, Acc and AvgAcc, the parameter counts, and a digest of
the final network's weights and buffers and of the exemplar memory. Floats must be equal exactly (NaN
equals NaN): a refactoring that claims to change nothing must change no bit of any result.

The golden file is tests/algorithms/golden_matrices.json. Regenerate it only on purpose, when a change is
meant to change results (a new initialisation, a fixed bug), and say so in that commit's message:

    PYTHONPATH=. python -m tests.algorithms.test_contract_regression            # every algorithm
    PYTHONPATH=. python -m tests.algorithms.test_contract_regression wa der     # only these entries

A newly registered algorithm has no entry and fails here until it is recorded the same way.
"""
from __future__ import annotations

import hashlib
import json
import math
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from gtep.algorithms import ALGORITHMS
from gtep.engine.runner import OrderingRun
from tests.helpers import small_job, small_vit_job

GOLDEN = Path(__file__).with_name("golden_matrices.json")

# Short versions of the algorithms' own stages (their defaults run 20-170 epochs whatever `epochs` says).
SHORT_STAGES: dict[str, dict[str, Any]] = {
    "bic": {"bias_epochs": 2},
    "podnet": {"ft_epochs": 2},
    "foster": {"compression_epochs": 2},
    "beef": {"fusion_epochs": 2},
    "ranpac": {"M": 256},
    "coda_prompt": {"pool_size": 6, "n_tasks": 3, "optimizer": "adam", "lr": 0.0025},
    "cec": {"meta_epochs": 2, "episodes": 10},
}


def job_for(name: str):
    hparams = SHORT_STAGES.get(name, {})
    if ALGORITHMS.get(name).uses_pretrained:
        return small_vit_job(name, hparams, epochs=2)
    return small_job(name, hparams, epochs=4)


def state_digest(tensors: dict[str, torch.Tensor]) -> str:
    """sha256 over every tensor's dtype, shape and bytes, independent of names and order: renaming or
    moving a module keeps the digest, changing any value does not."""
    parts = sorted(hashlib.sha256(f"{t.dtype}{tuple(t.shape)}".encode() + t.detach().cpu().contiguous().numpy()
                                  .tobytes()).hexdigest() for t in tensors.values())
    return hashlib.sha256("".join(parts).encode()).hexdigest()


def record(name: str) -> dict[str, Any]:
    """One ordering of `name`, as run_ordering trains it, with what the learner holds at its end."""
    job, data = job_for(name)
    run = OrderingRun(job, data)
    for task in run.tasks:
        run.train_task(task)
        if run.outcome.diverged:
            break
    outcome = run.finish()
    memory_x, memory_y = run.learner.memory.tensors()
    return {
        "status": outcome.status,
        "acc_matrix": outcome.acc_matrix,
        "acc": outcome.metrics.get("acc"),
        "avg_acc": outcome.metrics.get("avg_acc"),
        "params_total": outcome.params_total,
        "params_trainable": outcome.params_trainable,
        "net_digest": state_digest(run.learner.net.state_dict()),
        "memory_digest": state_digest({"x": memory_x, "y": memory_y}),
    }


def identical(a: Any, b: Any) -> bool:
    """Equality where NaN equals NaN and floats must match bit for bit (no tolerance)."""
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(identical(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def load_golden() -> dict[str, dict[str, Any]]:
    return json.loads(GOLDEN.read_text()) if GOLDEN.exists() else {}


def test_the_golden_file_names_only_registered_algorithms():
    assert set(load_golden()) <= set(ALGORITHMS.names())


@pytest.mark.parametrize("name", [n for n in ALGORITHMS.names() if "class_incremental" in ALGORITHMS.get(n).data_flows])
def test_results_are_bit_identical_to_the_golden_record(name):
    golden = load_golden()
    assert name in golden, f"{name} has no golden record; run `python -m {__name__} {name}` and commit it"
    now = json.loads(json.dumps(record(name)))  # through JSON, as the golden values went
    for field, expected in golden[name].items():
        assert identical(now[field], expected), f"{name}: {field} is {now[field]!r}, recorded {expected!r}"


def main(names: list[str]) -> None:
    torch.set_num_threads(1)  # as tests/conftest.py: the same kernels, so the same bits
    golden = load_golden()
    for name in names or [n for n in ALGORITHMS.names() if "class_incremental" in ALGORITHMS.get(n).data_flows]:
        golden[name] = record(name)
        print(name, golden[name]["acc_matrix"][-1], flush=True)
    GOLDEN.write_text(json.dumps(dict(sorted(golden.items())), indent=1) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
