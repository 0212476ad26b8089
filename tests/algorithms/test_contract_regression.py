"""Every registered algorithm's results on a tiny CPU scenario, compared with a golden record.

Each algorithm runs one ordering of the 3-task scenario of tests/helpers.py (ResNet methods through
`small_job`, pretrained-ViT methods through `small_vit_job`) with a couple of epochs, its own extra stages
shortened too. The record holds the accuracy matrix, Acc and AvgAcc, the parameter counts, a digest of the final
network's weights and buffers and of the exemplar memory, and a random projection of the weights.

Why the kernels are pinned. Training amplifies the last bit of a rounding difference: the same run with ATen's
AVX2 kernels instead of AVX-512 ends with weights 1-5 % apart (norm-relative) and accuracies up to 4 test images
apart, as far apart as the same run with a learning rate 1 % higher. So a record made with a processor's own
kernels holds only on that kind of processor. The records are therefore made, and checked, in a separate process
whose kernels do not depend on the processor's vector extensions: ATen's scalar kernels
(ATEN_CPU_CAPABILITY=default), oneDNN capped at SSE4.1 (which every x86-64 machine of ours has), MKL's conditional
numerical reproducibility (MKL_CBWR=COMPATIBLE, MKL's own switch for the same results on Intel and AMD) and one
thread. Checked on an AVX-512 Xeon: the pinned run gives the same bits whatever MKL and numpy are allowed to use.

What is compared:
- the same torch build and CPU vendor as the record's (stored in it as `environment`): every field bit for bit
  (NaN equals NaN): a refactoring that claims to change nothing must change no bit of any result;
- otherwise (another torch, another vendor, whose kernels the pins may not make identical): bit-identical
  passes; if not, the results must lie within TOLERANCE, with a warning that says the record was not reproduced
  bit for bit on this kind. The tolerance holds for rounding drift with margin (measured for every learner, the
  processor's own AVX2 kernels against the pinned record: at most 7 test images of 80 apart (replay), 1.6 % of the
  weights' norm (MEMO)) and catches a changed result beyond that: another initialisation is 33 % away and 20 images
  (test_the_tolerance_*). A change as small as rounding's own effect (a learning rate 1 % higher) shows only
  on the record's kind, where the comparison is bit for bit.

The golden file is tests/algorithms/golden_matrices.json. Regenerate it only on purpose, when a change is
meant to change results (a new initialisation, a fixed bug), and say so in that commit's message:

    PYTHONPATH=. python -m tests.algorithms.test_contract_regression            # every algorithm
    PYTHONPATH=. python -m tests.algorithms.test_contract_regression wa der     # only these entries

(it starts the pinned process itself). A newly registered algorithm has no entry and fails here until it is
recorded the same way.
"""
from __future__ import annotations

import hashlib
import json
import math
import multiprocessing
import os
import platform
import sys
import warnings
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import pytest

from gtep.algorithms import ALGORITHMS

GOLDEN = Path(__file__).with_name("golden_matrices.json")

# Kernels that give the same bits whatever vector extensions the processor has (module docstring).
PINNED_KERNELS = {"ATEN_CPU_CAPABILITY": "default", "ONEDNN_MAX_CPU_ISA": "SSE41", "MKL_CBWR": "COMPATIBLE",
                  "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}

# Off the record's kind: how far a result may drift by rounding alone (module docstring).
TOLERANCE = {"samples": 12, "weights": 0.05}

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

RECORDED = [n for n in ALGORITHMS.names() if "class_incremental" in ALGORITHMS.get(n).data_flows]


def job_for(name: str, seed: int = 0):
    from tests.helpers import small_job, small_vit_job

    hparams = SHORT_STAGES.get(name, {})
    if ALGORITHMS.get(name).uses_pretrained:
        return small_vit_job(name, hparams, epochs=2, seed=seed)
    return small_job(name, hparams, epochs=4, seed=seed)


def state_digest(tensors: dict[str, Any]) -> str:
    """sha256 over every tensor's dtype, shape and bytes, independent of names and order: renaming or
    moving a module keeps the digest, changing any value does not."""
    parts = sorted(hashlib.sha256(f"{t.dtype}{tuple(t.shape)}".encode() + t.detach().cpu().contiguous().numpy()
                                  .tobytes()).hexdigest() for t in tensors.values())
    return hashlib.sha256("".join(parts).encode()).hexdigest()


def weight_projection(tensors: dict[str, Any], k: int = 16) -> list[float]:
    """k fixed Gaussian projections of all weights and buffers, scaled so that the distance between two
    projections estimates the distance between the weights (Johnson-Lindenstrauss): a digest that can say how far."""
    import torch

    generator = torch.Generator().manual_seed(0)
    total = torch.zeros(k, dtype=torch.float64)
    for tensor in tensors.values():
        flat = tensor.detach().cpu().double().flatten()
        total += torch.randn(k, flat.numel(), generator=generator, dtype=torch.float64) @ flat / math.sqrt(k)
    return total.tolist()


def environment() -> dict[str, str]:
    """What decides the bits of a pinned run: the torch build, the kernels ATen uses, the processor's vendor."""
    import torch

    vendor = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                   if line.startswith("vendor_id")), platform.processor()) if Path("/proc/cpuinfo").exists() else ""
    return {"torch": torch.__version__, "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "vendor": vendor, "machine": platform.machine()}


def record(name: str, seed: int = 0) -> dict[str, Any]:
    """One ordering of `name`, as run_ordering trains it, with what the learner holds at its end."""
    import numpy as np

    from gtep.engine.runner import OrderingRun

    job, data = job_for(name, seed)
    run = OrderingRun(job, data)
    for task in run.tasks:
        run.train_task(task)
        if run.outcome.diverged:
            break
    outcome = run.finish()
    memory_x, memory_y = run.learner.memory.tensors()
    state = run.learner.net.state_dict()
    return {
        "status": outcome.status,
        "acc_matrix": outcome.acc_matrix,
        "acc": outcome.metrics.get("acc"),
        "avg_acc": outcome.metrics.get("avg_acc"),
        "params_total": outcome.params_total,
        "params_trainable": outcome.params_trainable,
        "net_digest": state_digest(state),
        "memory_digest": state_digest({"x": memory_x, "y": memory_y}),
        "test_images": [int(np.isin(data.y_test, list(t.new_classes)).sum()) for t in run.tasks],
        "weight_projection": weight_projection(state),
    }


def record_json(name: str, seed: int = 0) -> dict[str, Any]:
    """record() through JSON, as the golden values went, with the environment it ran in."""
    import torch

    torch.set_num_threads(1)
    return {**json.loads(json.dumps(record(name, seed))), "environment": environment()}


@contextmanager
def kernel_process(env: dict[str, str] | None = None) -> Iterator[ProcessPoolExecutor]:
    """A fresh process whose torch starts with `env` (the pinned kernels by default): ATen, oneDNN and MKL read
    these when they first run, so they cannot be changed in a process that has already used torch."""
    env = PINNED_KERNELS if env is None else env
    saved = {key: os.environ.get(key) for key in env}
    os.environ.update(env)
    try:
        executor = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))
        executor.submit(int).result()  # started now, under env (a spawned process copies it at start)
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    with executor:
        yield executor


def identical(a: Any, b: Any) -> bool:
    """Equality where NaN equals NaN and floats must match bit for bit (no tolerance)."""
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(identical(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def bit_differences(now: dict[str, Any], expected: dict[str, Any]) -> list[str]:
    return [f"{field} is {now.get(field)!r}, recorded {value!r}" for field, value in expected.items()
            if field != "environment" and not identical(now.get(field), value)]


def drift_beyond_tolerance(now: dict[str, Any], expected: dict[str, Any]) -> list[str]:
    """What differs by more than rounding can explain: structure and counts exactly, accuracies within
    TOLERANCE['samples'] test images of their task, the weights within TOLERANCE['weights'] of their norm."""
    problems = [f"{field} is {now[field]!r}, recorded {expected[field]!r}"
                for field in ("status", "params_total", "params_trainable", "test_images")
                if now[field] != expected[field]]
    images = expected["test_images"]
    for i, (row, old_row) in enumerate(zip(now["acc_matrix"], expected["acc_matrix"])):
        for j, (value, old) in enumerate(zip(row, old_row)):
            if math.isnan(old) != math.isnan(value) or abs(value - old) * images[j] > TOLERANCE["samples"] + 1e-6:
                problems.append(f"acc_matrix[{i}][{j}] is {value:.4f}, recorded {old:.4f} "
                                f"(more than {TOLERANCE['samples']} of {images[j]} test images apart)")
    for metric in ("acc", "avg_acc"):
        if abs(now[metric] - expected[metric]) * min(images) > TOLERANCE["samples"] + 1e-6:
            problems.append(f"{metric} is {now[metric]:.4f}, recorded {expected[metric]:.4f}")
    distance = weight_distance(now["weight_projection"], expected["weight_projection"])
    if distance > TOLERANCE["weights"]:
        problems.append(f"the weights are {distance:.1%} of their norm from the record's "
                        f"(rounding alone: under {TOLERANCE['weights']:.0%})")
    return problems


def weight_distance(now: list[float], recorded: list[float]) -> float:
    """Norm-relative distance of two weight projections: |w - w'| / |w'|, estimated."""
    return math.dist(now, recorded) / max(math.hypot(*recorded), 1e-30)


def same_kind(a: dict[str, str], b: dict[str, str]) -> bool:
    return all(a.get(key) == b.get(key) for key in ("torch", "cpu_capability", "vendor", "machine"))


def verdict(now: dict[str, Any], expected: dict[str, Any]) -> list[str]:
    """The problems of `now` against its golden record: bit for bit on the record's kind, else within tolerance."""
    differences = bit_differences(now, expected)
    if not differences or same_kind(now["environment"], expected["environment"]):
        return differences
    warnings.warn(f"results differ from the golden record made on {expected['environment']} (here: "
                  f"{now['environment']}): compared within the tolerance for rounding", stacklevel=2)
    return drift_beyond_tolerance(now, expected)


def load_golden() -> dict[str, dict[str, Any]]:
    return json.loads(GOLDEN.read_text()) if GOLDEN.exists() else {}


@pytest.fixture(scope="module")
def pinned():
    with kernel_process() as executor:
        yield executor


def test_the_golden_file_names_only_registered_algorithms():
    assert set(load_golden()) <= set(ALGORITHMS.names())


@pytest.mark.parametrize("name", RECORDED)
def test_results_match_the_golden_record(name, pinned):
    golden = load_golden()
    assert name in golden, f"{name} has no golden record; run `python -m {__name__} {name}` and commit it"
    problems = verdict(pinned.submit(record_json, name).result(), golden[name])
    assert not problems, f"{name}: " + "; ".join(problems)


@pytest.mark.parametrize("name", RECORDED)
def test_the_golden_records_hold_what_a_study_logs(name):
    """What `gtep run` of every learner through Ray once asserted of each (tests/orchestration/test_phases.py runs
    a learner of each kind there now): it finishes, and logs parameter counts, of which a pretrained method trains
    fewer than it holds. test_results_match_the_golden_record makes the record this code's result."""
    golden = load_golden()
    assert name in golden, f"{name} has no golden record"
    entry, pretrained = golden[name], ALGORITHMS.get(name).uses_pretrained
    assert entry["status"] == "finished" and len(entry["acc_matrix"]) == len(entry["test_images"])
    assert 0 <= entry["params_trainable"] <= entry["params_total"] and entry["params_total"] > 0
    if pretrained:
        assert entry["params_trainable"] < entry["params_total"], f"{name} trains its whole pretrained backbone"


def test_the_tolerance_passes_another_processors_rounding():
    """Replay (among the learners that drift most) with the processor's own AVX2 kernels instead of the pinned
    ones, as on another kind of machine: its bits differ, its results lie within the tolerance."""
    expected = load_golden()["replay"]
    with kernel_process({"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}) as other:
        now = other.submit(record_json, "replay").result()
    assert bit_differences(now, expected), "the AVX2 kernels gave the pinned bits: this test no longer shows drift"
    assert drift_beyond_tolerance(now, expected) == []


def test_the_tolerance_catches_a_changed_result(pinned):
    """Replay from another initialisation (seed 1): well beyond rounding, and the tolerance says so."""
    problems = drift_beyond_tolerance(pinned.submit(record_json, "replay", 1).result(), load_golden()["replay"])
    assert any("weights" in p for p in problems), problems


def main(names: list[str]) -> None:
    golden = load_golden()
    with kernel_process() as executor:
        for name in names or RECORDED:
            golden[name] = executor.submit(record_json, name).result()
            print(name, golden[name]["acc_matrix"][-1], flush=True)
    GOLDEN.write_text(json.dumps(dict(sorted(golden.items())), indent=1) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
