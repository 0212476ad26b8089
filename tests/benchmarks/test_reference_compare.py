"""benchmarks/reference_compare.py: its recipes are gtep's real hyperparameters, its statistics are Welch's, its
table is built from stored runs, and its reference side drives a toolbox checkout through the iData protocol
(here a fake toolbox with PyCIL's module layout, so the plumbing is tested without PyCIL)."""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy import stats

from gtep.spaces import validate_values

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))
import reference_compare as rc  # noqa: E402


def setting(**overrides) -> argparse.Namespace:
    values = dict(epochs=12, lr=0.05, weight_decay=5e-4, batch=32, memory=150, classes=15, increments="5x3",
                  dataset="npz:x/tiny.npz", results="unused", vit="vit_micro_patch4_32", vit_weights=None,
                  rp_dim=2000, seeds=2)
    return argparse.Namespace(**{**values, **overrides})


@pytest.mark.parametrize("method", rc.METHODS + rc.VIT_METHODS)
def test_every_recipe_sets_real_hyperparameters_of_the_gtep_method(method):
    job = rc.gtep_job(setting(), method, seed=0)
    validate_values(Path("reference_compare"), method, job.hparams)  # a misspelt name raises
    assert job.first_task.epochs == 12 and job.first_task.scheduler == job.hparams["scheduler"]


def test_extra_stages_are_scaled_from_pycils_defaults_in_both_toolboxes():
    podnet, foster, beef = (rc.recipe_for(m, setting(epochs=16)) for m in ("podnet", "foster", "beef"))
    assert podnet.gtep["ft_epochs"] == podnet.pycil_globals["ft_epochs"] == 2  # 20 of 160
    assert foster.gtep["compression_epochs"] == foster.pycil_args["compression_epochs"] == 12  # 130 of 170
    assert beef.gtep["fusion_epochs"] == beef.pycil_args["fusion_epochs"] == 6  # 60 of 170
    assert rc.recipe_for("bic", setting()).gtep["bias_epochs"] == 12  # PyCIL's bias stage runs `epochs`


def test_difference_is_welchs_interval_and_p():
    ours, theirs = [10.0, 12.0, 11.0, 13.0, 9.0], [8.0, 9.5, 7.0, 10.0, 8.5]
    diff, low, high, p = rc.difference(ours, theirs)
    assert diff == pytest.approx(np.mean(ours) - np.mean(theirs))
    assert p == pytest.approx(stats.ttest_ind(ours, theirs, equal_var=False).pvalue)
    assert low < diff < high and p < 0.05
    assert rc.difference([5.0, 5.0], [5.0, 5.0])[3] == 1.0


def test_training_images_count_each_tasks_images_and_the_replayed_memory():
    assert rc.training_images([100, 100, 100], memory=50, epochs=2) == 2 * (100 + 150 + 150)


def store(folder: Path, method: str, toolbox: str, seed: int, acc_t: list[float], seconds: float) -> None:
    path = folder / method / f"{toolbox}-seed{seed}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"acc_t": acc_t, "seconds": seconds, "seed": seed}))


def test_table_is_built_from_stored_runs_without_training(tmp_path):
    npz = tmp_path / "tiny.npz"
    rng = np.random.default_rng(0)
    np.savez(npz, x_train=rng.integers(0, 255, (60, 32, 32, 3), dtype=np.uint8), y_train=np.repeat(np.arange(6), 10),
             x_test=rng.integers(0, 255, (12, 32, 32, 3), dtype=np.uint8), y_test=np.repeat(np.arange(6), 2))
    args = setting(dataset=f"npz:{npz}", results=str(tmp_path / "results"), classes=6, increments="3x2", memory=6)
    folder = rc.setting_folder(args)
    for seed, (ours, theirs) in enumerate([(30.0, 20.0), (32.0, 21.0), (31.0, 19.0)]):
        store(folder, "replay", "gtep", seed, [50.0, ours], 10.0)
        store(folder, "replay", "pycil", seed, [48.0, theirs], 20.0)
    store(folder, "wa", "gtep", 0, [50.0, 25.0], 10.0)  # no PyCIL run yet: not in the table
    command = [sys.executable, str(BENCHMARKS / "reference_compare.py"), "--markdown", "--algorithm", "replay",
               "--algorithm", "wa", "--dataset", f"npz:{npz}", "--results", args.results, "--classes", "6",
               "--increments", "3x2", "--memory", "6", "--seeds", "3"]
    out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    final_row, speed_row = [line for line in out.splitlines() if line.startswith("| replay")]  # two tables
    assert "| PyCIL | 3 | 31.00 ± 1.00 | 20.00 ± 1.00 |" in final_row
    images = 12 * (30 + 36)  # 12 epochs x (task 1's 30 images, task 2's 30 + 6 exemplars)
    assert speed_row.endswith(f"| {images / 10:.0f} / {images / 20:.0f} |")
    assert "wa: no stored runs" in out
    assert out.splitlines()[-1].startswith("verdict: largest |final Acc difference| 11.00 points (replay); "
                                           "significant at 5% for replay")


def test_a_deterministic_method_equal_in_both_toolboxes_is_not_a_difference():
    ours = [29.6, 29.6, 29.6]
    theirs = [29.6 + 1e-13, 29.6, 29.6 - 1e-13]  # float noise of the same numbers
    assert rc.difference(ours, theirs)[3] == 1.0


def test_an_ablation_changes_gteps_hyperparameter_and_reuses_the_reference_runs(tmp_path):
    args = setting(gtep_set=["nca_margin=0"], results=str(tmp_path / "results"))
    assert rc.gtep_job(args, "podnet", 0).hparams["nca_margin"] == 0
    assert rc.gtep_job(setting(), "podnet", 0).hparams.get("nca_margin", 0.6) != 0
    ours = rc.result_path(args, "podnet", "gtep", 0)
    assert ours.parent.name == "podnet[nca_margin=0]"
    assert rc.result_path(args, "podnet", "reference", 0) == rc.result_path(setting(results=args.results),
                                                                             "podnet", "reference", 0)
    folder = rc.setting_folder(args)
    for seed, (ours_acc, theirs) in enumerate([(12.0, 9.0), (13.0, 10.0)]):
        store(folder, "podnet[nca_margin=0]", "gtep", seed, [40.0, 20.0, ours_acc], 10.0)
        store(folder, "podnet", "pycil", seed, [45.0, 20.0, theirs], 20.0)
    comparison = rc.summarise(args, "podnet", 100)
    assert comparison.label == "podnet[nca_margin=0]" and comparison.reference == "PyCIL"
    assert comparison.finals("gtep") == [12.0, 13.0] and comparison.finals("reference") == [9.0, 10.0]
    with pytest.raises(SystemExit, match="NAME=VALUE"):
        rc.ablation(setting(gtep_set=["nca_margin"]))


def test_foster_is_also_compared_with_pycils_student_and_the_verdict_uses_that_row(tmp_path):
    """PyCIL's FOSTER reports its teacher and goes on with the student; gtep reports the student. The table gets a
    second row against PyCIL's student, and the verdict compares like with like."""
    args = setting(results=str(tmp_path / "results"), increments="5x3", seeds=3)
    folder = rc.setting_folder(args)
    for seed, (ours, teacher, student) in enumerate([(16.0, 21.0, 16.5), (17.0, 22.0, 17.5), (18.0, 20.0, 16.0)]):
        store(folder, "foster", "gtep", seed, [40.0, 25.0, ours], 10.0)
        path = folder / "foster" / f"pycil-seed{seed}.json"
        path.write_text(json.dumps({"acc_t": [44.0, 28.0, teacher], "student_acc_t": [44.0, 24.0, student],
                                    "seconds": 20.0, "seed": seed}))
    teacher_row = rc.summarise(args, "foster", 100)
    student_row = rc.summarise(args, "foster", 100, student=True)
    assert teacher_row.label == "foster" and teacher_row.finals("reference") == [21.0, 22.0, 20.0]
    assert student_row.label == "foster (PyCIL's student)"
    assert student_row.finals("reference") == [16.5, 17.5, 16.0] and student_row.finals("gtep") == [16.0, 17.0, 18.0]
    assert rc.verdict([teacher_row, student_row]).startswith("verdict: largest |final Acc difference| 0.33 points "
                                                             "(foster (PyCIL's student))")
    assert rc.summarise(args, "replay", 100, student=True) is None


def test_a_stored_foster_reference_run_without_the_student_is_trained_again(tmp_path):
    path = tmp_path / "pycil-seed0.json"
    assert not rc.stored_complete(path, "foster", "reference")
    path.write_text(json.dumps({"acc_t": [44.0], "seconds": 1.0}))
    assert not rc.stored_complete(path, "foster", "reference")
    assert rc.stored_complete(path, "foster", "gtep") and rc.stored_complete(path, "beef", "reference")
    path.write_text(json.dumps({"acc_t": [44.0], "student_acc_t": [44.0], "seconds": 1.0}))
    assert rc.stored_complete(path, "foster", "reference")


FAKE_PYCIL = {
    "utils/__init__.py": "",
    "utils/data.py": "class iData:\n    pass\n\n\nclass iCIFAR100:\n    train_trsf, test_trsf = [], []\n",
    "utils/data_manager.py": '''
_get_idata = None  # reference_side points this at its adapter


class DataManager:
    def __init__(self, name, shuffle, seed, init_cls, increment):
        self.data = _get_idata(name)
        self.data.download_data()
        self.increments = [init_cls]
        while sum(self.increments) < len(self.data.class_order):
            self.increments.append(increment)
        self.nb_tasks = len(self.increments)
''',
    "utils/factory.py": "def get_model(name, args):\n    from models.fake import Fake\n\n    return Fake(args)\n",
    "models/__init__.py": "",
    "models/fake.py": '''
EPOCHS = 1  # a recipe global the job sets


class Fake:
    """Reports, as its accuracy, the training images of the classes seen so far times EPOCHS plus a draw of torch's
    generator; from its second task on it holds a student, as PyCIL's FOSTER does, whose accuracy is 7 points a
    task."""

    def __init__(self, args):
        self.args, self._cur_task, self._snet, self.test_loader = args, -1, None, "the test loader"

    def incremental_train(self, manager):
        self._cur_task += 1
        seen = manager.data.class_order[:sum(manager.increments[:self._cur_task + 1])]
        self.images = int(sum((manager.data.train_targets == c).sum() for c in seen))
        self._snet = "the student" if self._cur_task else None

    def eval_task(self):
        import torch

        return {"top1": self.images * EPOCHS + round(float(torch.rand(())), 4)}, None

    def after_task(self):
        pass

    def _compute_accuracy(self, model, loader):
        import torch

        assert (model, loader) == ("the student", "the test loader")
        torch.rand(3)  # a DataLoader draws from the global generator; the run must not see it
        return 7.0 * self._cur_task
''',
}


def test_the_reference_side_drives_a_toolbox_checkout_and_records_the_student(tmp_path):
    checkout = tmp_path / "pycil"
    for name, text in FAKE_PYCIL.items():
        (checkout / name).parent.mkdir(parents=True, exist_ok=True)
        (checkout / name).write_text(text)
    npz = tmp_path / "tiny.npz"
    rng = np.random.default_rng(0)
    np.savez(npz, x_train=rng.integers(0, 255, (15, 32, 32, 3), dtype=np.uint8),
             y_train=np.array([0] * 3 + [1] * 5 + [2] * 7), x_test=rng.integers(0, 255, (3, 32, 32, 3), dtype=np.uint8),
             y_test=np.arange(3))
    job = {"toolbox": "pycil", "method": "fake", "backbone": "resnet32", "npz": str(npz), "class_order": [2, 0, 1],
           "increments": [1, 1], "memory": 0, "seed": 0, "threads": 1, "args": {}, "globals": {"EPOCHS": 2},
           "mean": [0.5] * 3, "std": [0.25] * 3}
    (tmp_path / "job.json").write_text(json.dumps(job))
    env = {"PYTHONPATH": f"{checkout}:{BENCHMARKS}:{Path(__file__).resolve().parents[2]}", "PATH": "/usr/bin:/bin"}
    subprocess.run([sys.executable, str(BENCHMARKS / "reference_side.py"), "job.json", "result.json"],
                   cwd=tmp_path, env=env, check=True, capture_output=True, text=True)
    result = json.loads((tmp_path / "result.json").read_text())
    torch.manual_seed(0)  # the job's seed: the run's draws are the generator's first three
    draws = [round(float(torch.rand(())), 4) for _ in range(3)]
    # class 2's 7 images, then class 0's 3 too, then class 1's 5, times the EPOCHS global; the student's evaluation
    # in between leaves the generator where it was
    assert result["acc_t"] == [14 + draws[0], 20 + draws[1], 30 + draws[2]]
    assert result["student_acc_t"] == [14 + draws[0], 7.0, 14.0], "the only model at first, then the student"
