"""Which ordering a trial runs next when first tasks are shared: stored ones first, then ones nobody trains,
each trial looking from its own start so trials that start together train different first tasks."""
from types import SimpleNamespace

import pytest

from gtep.orchestration import trainable


@pytest.fixture
def states(monkeypatch):
    """The first-task state of each ordering, as the store would report it."""
    table: dict[int, str] = {}
    store = SimpleNamespace(state=lambda key: table[key])
    monkeypatch.setattr(trainable, "first_task_store", lambda job: store)
    monkeypatch.setattr(trainable, "ordering_job", lambda hparams, s, job: SimpleNamespace(ordering=s, dataset="d"))
    monkeypatch.setattr(trainable, "first_task_key", lambda spec, dataset, reaching: spec.ordering)
    monkeypatch.setattr(trainable, "hparams_reaching_first_task", lambda algorithm, spec: set())
    return table


JOB = SimpleNamespace(scenario=SimpleNamespace(algorithm="replay"))  # only the algorithm is read


def test_trials_starting_together_pick_different_free_first_tasks(states):
    states.update({0: "free", 1: "free", 2: "free"})
    picks = [trainable.next_ordering([0, 1, 2], {}, JOB, trainable.trial_start(i, {})) for i in range(3)]
    assert picks == [0, 1, 2]
    assert trainable.next_ordering([0, 1, 2], {}, JOB, 4) == 1  # set 4 of three orderings starts at 4 mod 3


def test_a_stored_first_task_comes_before_a_free_one_and_a_free_one_before_waiting(states):
    states.update({0: "free", 1: "claimed", 2: "ready"})
    assert trainable.next_ordering([0, 1, 2], {}, JOB, 0) == 2
    states[2] = "claimed"
    assert trainable.next_ordering([0, 1, 2], {}, JOB, 1) == 0  # 1 is being trained: 0 is free
    states[0] = "claimed"
    assert trainable.next_ordering([0, 1, 2], {}, JOB, 1) == 1  # all claimed: wait on the trial's own first


def test_sets_of_an_adaptive_searcher_start_from_a_hash_of_their_values():
    hparams = {"lr": 0.1, "epochs": 70}
    assert trainable.trial_start(3, hparams) == 3
    assert trainable.trial_start(-1, hparams) == trainable.trial_start(-1, {"epochs": 70, "lr": 0.1})
    assert trainable.trial_start(-1, hparams) != trainable.trial_start(-1, {"lr": 0.2, "epochs": 70})
