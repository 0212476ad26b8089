"""The shared first task: keyed by all it depends on, the same result as training it, trained once per key."""
from __future__ import annotations

import json
import multiprocessing
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from gtep.algorithms import ALGORITHMS
from gtep.engine import FirstTaskSpec, OrderingJob, run_ordering
from gtep.engine.checkpoint import TaskCheckpoint
from gtep.engine.first_task import REUSED, TRAINED, FirstTaskStore
from gtep.engine.runner import OrderingRun, hparams_reaching_first_task
from gtep.spaces import load_space
from tests.helpers import load

DATA = "synthetic:classes=6,train=24,test=8"
FIXED_FIRST_TASK = sorted(n for n in ALGORITHMS.names() if ALGORITHMS.get(n).fixed_first_task and n != "finetune"
                          and "class_incremental" in ALGORITHMS.get(n).data_flows)


def job_for(algorithm: str, hparams: dict, ordering: int = 0) -> OrderingJob:
    return OrderingJob(algorithm, hparams, "resnet8", (3, 3), tuple(range(6)), seed=5, ordering=ordering,
                       memory_size=12, first_task=FirstTaskSpec(epochs=2, milestones=(1,), batch_size=16),
                       dataset=DATA)


def two_sets_sharing_the_first_task(algorithm: str) -> tuple[dict, dict]:
    """Two sets from the method's space: equal where a value reaches task 1, different everywhere else."""
    space = load_space(algorithm).space.sets
    reaching = hparams_reaching_first_task(ALGORITHMS.get(algorithm), job_for(algorithm, {}))
    a, b = {}, {}
    for name, values in space.items():
        values = list(values)
        a[name] = values[0]
        b[name] = values[0] if name in reaching or len(values) == 1 else values[-1]
    for h in (a, b):  # small and fast: the first task's recipe is fixed anyway
        h.update(epochs=2, batch_size=16)
        h.pop("milestone_num", None)
    return a, b


def learner_state(run: OrderingRun) -> dict[str, torch.Tensor]:
    state = {f"net.{k}": v for k, v in run.learner.net.state_dict().items()}
    xs, ys = run.learner.memory.tensors()
    return state | {"memory.x": xs, "memory.y": ys}


@pytest.mark.parametrize("algorithm", FIXED_FIRST_TASK)
def test_task_one_depends_only_on_the_values_in_its_key(algorithm):
    """The audit behind each method's first_task_hparams: values outside the key change nothing in task 1."""
    a, b = two_sets_sharing_the_first_task(algorithm)
    assert a != b, "the space has values outside the key, so this compares two different sets"
    runs = [OrderingRun(job_for(algorithm, h), load(DATA)) for h in (a, b)]
    assert runs[0].first_task_key() == runs[1].first_task_key()
    for run in runs:
        run.train_first_task()
    np.testing.assert_array_equal(runs[0].outcome.acc_matrix, runs[1].outcome.acc_matrix)
    first, second = (learner_state(r) for r in runs)
    assert first.keys() == second.keys()
    for name in first:
        assert torch.equal(first[name], second[name]), f"{algorithm}: {name} differs after task 1"


def test_the_key_separates_what_reaches_task_one():
    job = job_for("podnet", {"nb_proxy": 10, "lambda_c": 1})
    run = OrderingRun(job, load(DATA))
    other_proxies = OrderingRun(job_for("podnet", {"nb_proxy": 20, "lambda_c": 1}), load(DATA))
    other_ordering = OrderingRun(job_for("podnet", {"nb_proxy": 10, "lambda_c": 1}, ordering=1), load(DATA))
    same = OrderingRun(job_for("podnet", {"nb_proxy": 10, "lambda_c": 9}), load(DATA))
    assert run.first_task_key() == same.first_task_key()
    assert run.first_task_key() != other_proxies.first_task_key()
    assert run.first_task_key() != other_ordering.first_task_key()
    cosine = OrderingRun(job_for("replay", {"scheduler": "cosine"}), load(DATA))
    steplr = OrderingRun(job_for("replay", {"scheduler": "steplr"}), load(DATA))
    assert cosine.first_task_key() != steplr.first_task_key(), "the sampled scheduler reaches task 1"


@pytest.mark.parametrize("algorithm", ["icarl", "podnet"])
def test_a_reused_first_task_gives_the_metrics_of_training_it(algorithm, tmp_path):
    a, b = two_sets_sharing_the_first_task(algorithm)
    alone = run_ordering(job_for(algorithm, b), load(DATA))
    store = FirstTaskStore(tmp_path)
    owner = run_ordering(job_for(algorithm, a), load(DATA), first_tasks=store)
    reuser = run_ordering(job_for(algorithm, b), load(DATA), first_tasks=store)
    assert (owner.first_task, reuser.first_task, alone.first_task) == (TRAINED, REUSED, TRAINED)
    np.testing.assert_array_equal(reuser.acc_matrix, alone.acc_matrix)
    assert reuser.metrics == alone.metrics
    assert reuser.task_seconds[0] == owner.task_seconds[0], "the stored task 1 keeps its own time"
    assert len(list(tmp_path.glob("*.pt"))) == 1 and not list(tmp_path.glob("*.lock"))


def test_a_diverged_first_task_is_stored_and_not_trained_again(tmp_path):
    blowup = {"lr": 1e30}
    store = FirstTaskStore(tmp_path)
    job = OrderingJob("replay", blowup, "resnet8", (3, 3), tuple(range(6)), seed=5, ordering=0, memory_size=12,
                      first_task=FirstTaskSpec(epochs=2, lr=1e30, milestones=(1,), batch_size=16), dataset=DATA)
    first = run_ordering(job, load(DATA), first_tasks=store)
    second = run_ordering(job, load(DATA), first_tasks=store)
    assert first.diverged and second.diverged
    assert (first.first_task, second.first_task) == (TRAINED, REUSED)
    assert second.message == first.message and "task 1" in second.message


# ---- the store's lock across processes ------------------------------------------------------------

def _obtain_in_process(root: str, key: str, counter: str, out: str) -> None:
    def train() -> TaskCheckpoint:
        with open(counter, "a") as fh:
            fh.write(f"{os.getpid()}\n")
        time.sleep(1.5)  # long enough that the other processes find the claim
        return TaskCheckpoint(key, 1, nn.Linear(2, 2), {}, [[0.5]], [4], [1.5])

    stored, source = FirstTaskStore(Path(root), poll=0.05).obtain(key, train, torch.device("cpu"))
    Path(out).write_text(json.dumps({"source": source, "rows": stored.acc_matrix if stored else None}))


def test_concurrent_processes_train_a_key_once(tmp_path):
    counter = tmp_path / "trainings.txt"
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_obtain_in_process, args=(str(tmp_path / "store"), "k1", str(counter),
                                                           str(tmp_path / f"out{i}.json"))) for i in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    assert len(counter.read_text().split()) == 1
    sources = sorted(json.loads((tmp_path / f"out{i}.json").read_text())["source"] for i in range(3))
    assert sources == [REUSED, REUSED, TRAINED]
    assert all(json.loads((tmp_path / f"out{i}.json").read_text())["rows"] in (None, [[0.5]]) for i in range(3))


def _write_lock(store: FirstTaskStore, key: str, host: str, pid: int, age: float) -> None:
    store.root.mkdir(parents=True, exist_ok=True)
    store.lock_path(key).write_text(json.dumps({"host": host, "pid": pid, "since": time.time() - age}))
    os.utime(store.lock_path(key), (time.time() - age, time.time() - age))


def _train_once(calls: list[int]):
    def train() -> TaskCheckpoint:
        calls.append(1)
        return TaskCheckpoint("k", 1, nn.Linear(1, 1), {}, [[1.0]], [1], [0.1])
    return train


def test_a_crashed_owner_on_this_host_is_taken_over_at_once(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    store = FirstTaskStore(tmp_path, poll=0.05, stale_after=3600)
    _write_lock(store, "k", socket.gethostname(), dead.pid, age=0)
    calls: list[int] = []
    _, source = store.obtain("k", _train_once(calls), torch.device("cpu"))
    assert source == TRAINED and calls == [1]


def test_a_silent_owner_elsewhere_is_taken_over_after_stale_after(tmp_path):
    store = FirstTaskStore(tmp_path, poll=0.05, stale_after=1.0)
    _write_lock(store, "k", "another-node", 12345, age=0)
    assert store.state("k") == "claimed"
    calls: list[int] = []
    tic = time.monotonic()
    _, source = store.obtain("k", _train_once(calls), torch.device("cpu"))
    assert source == TRAINED and calls == [1]
    assert time.monotonic() - tic >= 0.9, "a live claim is respected until its heartbeat is stale"
    assert store.state("k") == "ready"


class RacingTrial(FirstTaskStore):
    """A trial whose first look at the stale claim waits for the other trial's (both find the same stale
    claim); `then_wait` holds this one back further, so it breaks the claim it examined only after the other
    trial broke it and claimed the key afresh: the racy order, forced."""

    def __init__(self, root: Path, both_saw_it: threading.Barrier, then_wait: threading.Event | None) -> None:
        super().__init__(root, poll=0.05, stale_after=3600)
        self.both_saw_it, self.then_wait = both_saw_it, then_wait
        self.tokens: list[str] = []
        self.breaks = 0
        self.broke = threading.Event()

    def _stale_claim(self, key):
        stale = super()._stale_claim(key)
        if stale is not None and not self.breaks:
            self.both_saw_it.wait(10)
            if self.then_wait is not None:
                assert self.then_wait.wait(10)
        return stale

    def _claim(self, key):
        token = super()._claim(key)
        self.tokens += [token] if token else []
        return token

    def _break(self, key, stale):
        super()._break(key, stale)
        self.breaks += 1
        self.broke.set()


def test_two_trials_taking_over_the_same_stale_claim_train_it_once(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    _write_lock(FirstTaskStore(tmp_path), "k", socket.gethostname(), dead.pid, age=0)
    both_saw_it, first_claimed = threading.Barrier(2), threading.Event()
    first = RacingTrial(tmp_path, both_saw_it, then_wait=None)
    second = RacingTrial(tmp_path, both_saw_it, then_wait=first_claimed)
    trainings, lock_while_training, sources, errors = [], [], {}, []

    def train() -> TaskCheckpoint:
        trainings.append(threading.current_thread().name)
        first_claimed.set()
        second.broke.wait(10)  # train on while the second trial breaks the claim it examined
        lock_while_training.append((first._owner(first.lock_path("k")) or {}).get("token"))
        return TaskCheckpoint("k", 1, nn.Linear(1, 1), {}, [[1.0]], [1], [0.1])

    def trial(store: RacingTrial, name: str) -> None:
        try:
            sources[name] = store.obtain("k", train, torch.device("cpu"))[1]
        except BaseException as err:  # noqa: BLE001 - reported by the assertion below
            errors.append(err)

    threads = [threading.Thread(target=trial, args=(s, n), name=n) for s, n in ((first, "first"), (second, "second"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors and not any(t.is_alive() for t in threads)
    assert second.breaks == 1, "the second trial did break the stale claim it had examined, after the first"
    assert trainings == ["first"] and sources == {"first": TRAINED, "second": REUSED}
    assert lock_while_training == first.tokens, "the first trial's fresh claim was still in place after the break"
    assert second.tokens == [], "the second trial never claimed the key"
    assert not list(tmp_path.glob("*.lock")) and not list(tmp_path.glob(".k.*")), "no claim or aside file left"


def test_a_release_leaves_a_claim_that_is_not_ours(tmp_path):
    """Our claim went stale and was taken over: our late release must not remove the new owner's claim."""
    ours, theirs = FirstTaskStore(tmp_path), FirstTaskStore(tmp_path)
    tmp_path.mkdir(exist_ok=True)
    our_token = ours._claim("k")
    theirs._break("k", ours._owner(ours.lock_path("k")))
    their_token = theirs._claim("k")
    assert our_token and their_token and our_token != their_token
    ours._release("k", our_token)
    assert json.loads(ours.lock_path("k").read_text())["token"] == their_token
    theirs._release("k", their_token)
    assert not ours.lock_path("k").exists()


def test_methods_that_train_task_one_with_the_set_do_not_fill_the_store(tmp_path, monkeypatch):
    """ViT methods (PILOT) train task 1 with the sampled set: a stored model per set would only cost disk."""
    monkeypatch.setattr(ALGORITHMS.get("replay"), "fixed_first_task", False)
    outcome = run_ordering(job_for("replay", {"epochs": 2, "batch_size": 16}), load(DATA),
                           first_tasks=FirstTaskStore(tmp_path / "store"))
    assert outcome.first_task == TRAINED and not (tmp_path / "store").exists()
