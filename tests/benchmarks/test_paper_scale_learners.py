"""benchmarks/paper_scale_learners.py (issue 34's rehearsal): fifteen learners that train nothing but answer with
their paper algorithm's accuracy matrix, through the real engine: the right number of tasks, the same matrices for
the same seed, a real optimum for tuning to find, forgetting, and divergence recorded as a real run's."""
from __future__ import annotations

import statistics
import sys
from pathlib import Path

import numpy as np
import pytest

from gtep.data import resolve_dataset
from gtep.engine import run_ordering
from gtep.engine.runner import FirstTaskSpec, OrderingJob

BENCHMARKS = str(Path(__file__).resolve().parents[2] / "benchmarks")
DATA = resolve_dataset("synthetic:classes=20,train=6,test=40").load()


@pytest.fixture(scope="module", autouse=True)
def ps():
    """The plugin registered for this module's tests only: other modules enumerate the registry (every algorithm
    has a search space, a golden record...), which the benchmark's learners are not part of."""
    from gtep.algorithms import ALGORITHMS

    sys.path.insert(0, BENCHMARKS)
    import paper_scale_learners

    yield paper_scale_learners
    for name in paper_scale_learners.LEARNERS:
        ALGORITHMS._entries.pop(f"ps_{name}", None)  # noqa: SLF001 - a test's own registrations, removed
    sys.modules.pop("paper_scale_learners", None)
    sys.modules.pop("paper_scale", None)
    sys.path.remove(BENCHMARKS)


def ordering(name: str, lr: float, ordering: int = 0, seed: int = 0):
    job = OrderingJob(name, {"lr": lr, "batch_size": 128, "epochs": 1}, "resnet8", (5, 5, 5, 5), tuple(range(20)),
                      seed=seed, ordering=ordering, memory_size=0, first_task=FirstTaskSpec(epochs=1), device="cpu")
    return run_ordering(job, DATA)


def test_the_papers_fifteen_algorithms_are_registered(ps):
    assert len(ps.LEARNERS) == 15
    assert {f"ps_{name}" for name in ps.PROFILES} <= set(ps.ALGORITHMS.names())


def test_an_ordering_has_one_row_per_task_and_the_same_seed_gives_the_same_matrix():
    out = ordering("ps_der", 0.1)
    assert out.status == "finished" and len(out.acc_matrix) == 4 and out.params_total == 0
    assert np.array_equal(ordering("ps_der", 0.1).acc_matrix, out.acc_matrix, equal_nan=True)
    assert not np.array_equal(ordering("ps_der", 0.1, ordering=1).acc_matrix, out.acc_matrix, equal_nan=True)


def test_accuracy_follows_the_profile_best_set_above_far_sets_and_old_tasks_forgotten(ps):
    profile = ps.PROFILES["replay"]
    best = [ordering("ps_replay", profile.best_lr, o) for o in range(3)]
    far = [ordering("ps_replay", profile.best_lr / 100, o) for o in range(3)]
    final = statistics.mean(o.metrics["acc"] for o in best)
    assert final > statistics.mean(o.metrics["acc"] for o in far) + 0.2
    # task 0's classes: as learnt, then after three more tasks (forgetting 0.10 a task)
    learnt = statistics.mean(o.acc_matrix[0][0] for o in best)
    later = statistics.mean(o.acc_matrix[3][0] for o in best)
    assert learnt == pytest.approx(profile.base, abs=0.08)
    assert later == pytest.approx(profile.base * (1 - profile.forgetting) ** 3, abs=0.08) and later < learnt


def test_a_learning_rate_a_decade_above_the_best_diverges_as_a_real_run(ps):
    out = ordering("ps_icarl", 10 * ps.PROFILES["icarl"].best_lr)
    message = out.message.lower()
    assert out.status == "diverged" and ("non-finite" in message or "nan" in message), out.message


def test_the_paper_scale_matrix_has_the_papers_shape_and_every_cell_resolves(tmp_path):
    import paper_scale

    from gtep.matrix import parse_matrix, resolve_cells

    full = paper_scale.matrix_document(tmp_path / "full")
    assert paper_scale.units(full) == (120, 120 * 31 * 5)  # 15 x 8 studies, R x S tuning + S evaluation units
    assert (len(full["algorithms"]), len(full["scenarios"]) * len(full["pairings"])) == (15, 8)
    small = paper_scale.matrix_document(tmp_path / "small", scale=0.1, algorithms=2, cell_count=2)
    cells = resolve_cells(parse_matrix(small, "test"), tmp_path / "small" / "runs")
    assert [c.cell.name.removeprefix("paper-scale-") for c in cells] == [
        "ps_replay-10tasks-split-a", "ps_icarl-10tasks-split-a", "ps_replay-6tasks-split-a", "ps_icarl-6tasks-split-a"]
    assert {c.resolved.config.search.trials for c in cells} == {3}
    assert cells[2].resolved.increments[:2] == (25, 5)  # 6 tasks: half of the 50 classes first (Table 1)


def test_a_learner_pickles_as_checkpoints_do(ps):
    """The engine's task checkpoints torch.save the learner: its class must be found by name in the module."""
    import pickle

    cls = ps.ALGORITHMS.get("ps_replay")
    assert pickle.loads(pickle.dumps(cls)) is cls


def test_the_store_counts_a_diverged_ordering_failed_by_design_apart_from_unfinished_runs(tmp_path):
    """A diverged ordering ends its MLflow run FAILED with metric diverged = 1 (gtep's tracking does so on purpose):
    the rehearsal's 'every run finished' verdict must not count it, and must count any other run left unfinished."""
    from mlflow.tracking import MlflowClient

    sys.path.insert(0, BENCHMARKS)
    import paper_scale

    backend = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=backend)
    experiment = client.create_experiment("gtep/s", artifact_location=str(tmp_path / "artifacts"))
    for key, status, diverged in (("o0", "FINISHED", None), ("o1", "FAILED", 1.0), ("o2", "FAILED", None),
                                  ("o3", "RUNNING", None)):
        run = client.create_run(experiment, tags={"gtep.key": key, "gtep.level": "ordering"})
        if diverged is not None:
            client.log_metric(run.info.run_id, "diverged", diverged)
        if status != "RUNNING":
            client.set_terminated(run.info.run_id, status)
    store = paper_scale.store_figures(backend)
    assert store["runs_failed_as_diverged"] == 1 and store["runs_not_finished"] == 2
