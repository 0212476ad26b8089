"""The tracking journal's background writer and the manifest's deferred saves, on a real sqlite store, no Ray.

While Ray Tune runs a phase, MLflow writes are applied by a thread of their own so the Tune loop only appends to
the journal; they must still reach the store in order, once, and survive a store that refuses them for a while.
"""
import json
import shutil
import threading
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from gtep.orchestration import journal as journal_module
from gtep.orchestration.journal import JournalState, TrackingJournal
from gtep.orchestration.study import Manifest


@pytest.fixture(scope="module")
def blank_store(tmp_path_factory):
    """A migrated, empty sqlite store: creating one runs MLflow's migrations, seconds per test otherwise."""
    path = tmp_path_factory.mktemp("blank") / "mlflow.db"
    MlflowClient(tracking_uri=f"sqlite:///{path}").search_experiments()
    return path


@pytest.fixture
def store(tmp_path, blank_store):
    shutil.copyfile(blank_store, tmp_path / "mlflow.db")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    return uri, client, client.create_experiment("journal", artifact_location=(tmp_path / "art").as_uri())


def write_units(journal: TrackingJournal, units: int) -> None:
    journal.create_run("phase", "phase")
    for u in range(units):
        with journal.batch():
            journal.create_run(f"phase/o{u}", f"ordering{u}", parent="phase", tags={"gtep.ordering": str(u)})
            journal.log(f"phase/o{u}", {"acc": u / 10}, steps=[("acc_t", 0.5, 1), ("acc_t", u / 10, 2)],
                        params={"ordering": u})
            journal.log_text(f"phase/o{u}", "accuracy.json", json.dumps({"ordering": u}))
            journal.terminate(f"phase/o{u}", "FINISHED")
    journal.terminate("phase", "FINISHED")


def runs_by_ordering(client: MlflowClient, experiment: str) -> dict[str, object]:
    found = client.search_runs([experiment], max_results=1000)
    return {r.data.tags.get("gtep.ordering", "phase"): r for r in found}


def test_the_background_writer_applies_every_write_once_in_order_off_the_callers_thread(store, tmp_path):
    uri, client, experiment = store
    journal = TrackingJournal.open(tmp_path / "study", uri, experiment)
    threads = set()
    create_run = journal.client.create_run

    def recording_create_run(*args, **kwargs):
        threads.add(threading.current_thread().name)
        return create_run(*args, **kwargs)

    journal.client.create_run = recording_create_run
    with journal.in_background():
        write_units(journal, 12)
    assert journal.pending == [] and threads == {"gtep-mlflow-writer"}
    runs = runs_by_ordering(client, experiment)
    assert len(runs) == 13 and all(r.info.status == "FINISHED" for r in runs.values())
    for u in range(12):
        run = runs[str(u)]
        assert run.data.metrics["acc"] == pytest.approx(u / 10) and run.data.params["ordering"] == str(u)
        assert run.data.tags["mlflow.parentRunId"] == runs["phase"].info.run_id
        assert [m.value for m in client.get_metric_history(run.info.run_id, "acc_t")] == [0.5, pytest.approx(u / 10)]
        assert [a.path for a in client.list_artifacts(run.info.run_id)] == ["accuracy.json"]
    state = json.loads((tmp_path / "study" / "tracking" / "state.json").read_text())
    assert state["applied"] == 1 + 12 * 4 + 1


def test_a_store_that_refuses_writes_neither_blocks_nor_loses_them(store, tmp_path, monkeypatch):
    """Writes journaled while the store fails wait in the journal; they are applied, once, when it answers
    again: by the writer's retry inside the block, or by a flush after it."""
    monkeypatch.setattr(journal_module, "RETRY_AFTER_SECONDS", 0.2)
    uri, client, experiment = store
    journal = TrackingJournal.open(tmp_path / "study", uri, experiment)
    down = threading.Event()
    down.set()
    log_batch = journal.client.log_batch

    def flaky_log_batch(*args, **kwargs):
        if down.is_set():
            raise ConnectionError("store away")
        return log_batch(*args, **kwargs)

    journal.client.log_batch = flaky_log_batch
    with journal.in_background():
        write_units(journal, 5)
        time.sleep(0.5)
        assert journal.pending and "store away" in journal.last_error
        down.clear()  # back: the writer's next retry applies the rest
        deadline = time.monotonic() + 10
        while journal.pending and time.monotonic() < deadline:
            time.sleep(0.05)
    assert journal.pending == []
    runs = runs_by_ordering(client, experiment)
    assert len(runs) == 6 and all(r.info.status == "FINISHED" for r in runs.values())
    assert all(runs[str(u)].data.metrics["acc"] == pytest.approx(u / 10) for u in range(5))

    down.set()  # refused until after the block: kept in the journal, applied by the next flush
    with journal.in_background():
        journal.log("phase/o0", {"late": 1.0})
    assert len(journal.pending) == 1
    down.clear()
    assert journal.flush(force=True) == 0
    assert client.get_run(runs["0"].info.run_id).data.metrics["late"] == 1.0
    assert len(runs_by_ordering(client, experiment)) == 6, "no run was created twice"


def journal_seqs(study) -> list[int]:
    text = (study / "tracking" / "journal.jsonl").read_text()
    return [json.loads(line)["seq"] for line in text.splitlines()]


def snapshots(study) -> list[str]:
    return sorted(p.name for p in (study / "tracking" / "files").iterdir())


def test_a_phase_whose_writes_are_applied_leaves_an_empty_journal_and_a_resume_finds_its_runs(store, tmp_path):
    uri, client, experiment = store
    study = tmp_path / "study"
    journal = TrackingJournal.open(study, uri, experiment)
    with journal.in_background():
        write_units(journal, 4)
    assert len(journal_seqs(study)) == 1 + 4 * 4 + 1 and len(snapshots(study)) == 4, "applied, not compacted yet"
    assert journal.flush(force=True) == 0  # the phase's end (finish_journal)
    assert journal_seqs(study) == [] and snapshots(study) == []
    ids = {key: journal.run_id(key) for key in ("phase", "phase/o0", "phase/o3")}

    resumed = TrackingJournal.open(study, uri, experiment)  # a resume reads back state.json and the journal
    assert resumed.pending == [] and {key: resumed.run_id(key) for key in ids} == ids
    resumed.create_run("phase", "phase")  # what a resumed phase journals again: found, not created
    resumed.reopen("phase")
    resumed.create_run("phase/o3", "ordering3", parent="phase", tags={"gtep.ordering": "3"})
    resumed.log("phase/o3", {"late": 1.0})
    resumed.create_run("phase/o4", "ordering4", parent="phase", tags={"gtep.ordering": "4"})
    assert resumed.flush(force=True) == 0 and journal_seqs(study) == []
    assert json.loads((study / "tracking" / "state.json").read_text())["applied"] == 1 + 4 * 4 + 1 + 5
    runs = runs_by_ordering(client, experiment)
    assert len(client.search_runs([experiment], max_results=1000)) == 6, "no run was created twice"
    assert runs["phase"].info.run_id == ids["phase"] and runs["3"].info.run_id == ids["phase/o3"]
    assert runs["3"].data.metrics == {"acc": pytest.approx(0.3), "acc_t": pytest.approx(0.3), "late": 1.0}
    assert [a.path for a in client.list_artifacts(ids["phase/o0"])] == ["accuracy.json"], "nothing was lost"


def test_pending_writes_are_kept_through_a_compaction_and_applied_later(store, tmp_path):
    uri, client, experiment = store
    study = tmp_path / "study"
    journal = TrackingJournal.open(study, uri, experiment)
    journal.client.log_batch = lambda *args, **kwargs: (_ for _ in ()).throw(ConnectionError("store away"))
    write_units(journal, 3)
    assert journal.flush(force=True) == 1 + 3 * 4 + 1 - 2, "the phase's run and o0's were created, then o0's log failed"
    assert journal_seqs(study) == [op["seq"] for op in journal.pending] == list(range(3, 3 * 4 + 3))
    assert len(snapshots(study)) == 3, "the pending artifacts' snapshots stay"

    synced = TrackingJournal.load(study)  # `gtep sync` once the store answers again
    assert [op["seq"] for op in synced.pending] == journal_seqs(study)
    assert synced.flush(force=True) == 0 and journal_seqs(study) == [] and snapshots(study) == []
    runs = runs_by_ordering(client, experiment)
    assert len(client.search_runs([experiment], max_results=1000)) == 4, "no run was created twice"
    assert all(runs[str(u)].data.metrics["acc"] == pytest.approx(u / 10) for u in range(3))
    assert all(r.info.status == "FINISHED" for r in runs.values())
    assert [a.path for a in client.list_artifacts(runs["2"].info.run_id)] == ["accuracy.json"]


def test_a_write_journaled_during_a_compaction_is_kept_on_disk(store, tmp_path, monkeypatch):
    """The driver appends while the writer thread compacts: an append into the file being replaced would be
    lost on disk (kept only in memory, gone with a killed driver)."""
    uri, client, experiment = store
    study = tmp_path / "study"
    journal = TrackingJournal.open(study, uri, experiment)
    journal.client.log_batch = lambda *args, **kwargs: (_ for _ in ()).throw(ConnectionError("store away"))
    write_units(journal, 1)
    late = threading.Thread(target=lambda: journal.log("phase/o0", {"late": 1.0}))
    write_atomic = journal_module.write_atomic

    def append_while_rewriting(path, text):
        if path == journal.journal_path and not late.is_alive():
            late.start()
            time.sleep(0.3)  # the append runs now, unless the compaction holds the journal file
        write_atomic(path, text)

    monkeypatch.setattr(journal_module, "write_atomic", append_while_rewriting)
    journal.flush(force=True)
    late.join(10)
    on_disk = TrackingJournal.load(study)  # what a resume after a kill would find
    assert [op["seq"] for op in on_disk.pending] == [op["seq"] for op in journal.pending]
    assert on_disk.pending[-1]["metrics"][0][:2] == ["late", 1.0]


def test_a_long_phase_compacts_its_journal_as_it_goes(store, tmp_path, monkeypatch):
    """Not only at the phase's end: a flush that applies everything compacts a journal grown past the bound."""
    monkeypatch.setattr(journal_module, "COMPACT_AFTER_BYTES", 2000)
    uri, client, experiment = store
    study = tmp_path / "study"
    journal = TrackingJournal.open(study, uri, experiment)
    journal.create_run("phase", "phase")
    sizes = []
    for u in range(8):
        with journal.batch():  # applied when the batch ends
            journal.create_run(f"phase/o{u}", f"ordering{u}", parent="phase")
            journal.log(f"phase/o{u}", {"acc": 0.5}, params={"pad": "p" * 500})
        sizes.append(journal._journal_bytes())
    assert max(sizes) <= 2000 and sizes.count(0) >= 2, sizes
    assert len(client.search_runs([experiment], max_results=1000)) == 1 + 8


def test_units_and_trial_keys_are_saved_at_most_every_few_seconds_and_at_the_end(tmp_path, monkeypatch):
    path = tmp_path / "manifest.json"
    manifest = Manifest.create(path, {"study": "s"})
    manifest.record_unit("tune", 0, 0, {"acc": 0.5}, deferred=True)
    manifest.set_phase("tune", deferred=True, trial_keys={"0": "tune:1/set000"})
    on_disk = json.loads(path.read_text())
    assert on_disk["units"] == {} and "tune" not in on_disk["phases"]
    monkeypatch.setattr(Manifest, "UNIT_SAVE_SECONDS", 0.0)
    manifest.save_units()
    on_disk = json.loads(path.read_text())
    assert on_disk["units"] == {"tune/0/0": {"acc": 0.5}}
    assert on_disk["phases"]["tune"]["trial_keys"] == {"0": "tune:1/set000"}
    manifest.record_unit("tune", 0, 1, {"acc": 0.25})  # not deferred: on disk at once
    assert "tune/0/1" in json.loads(path.read_text())["units"]


def record_calls(journal: TrackingJournal, delay: float = 0.0, fail_for: set[str] | None = None) -> list[tuple]:
    """Wrap the client's writes: each call is recorded as (start, end, method, run key or parent) and takes `delay`
    seconds, so that several writer threads overlap; calls for the run ids of the keys in `fail_for` fail."""
    calls: list[tuple] = []
    lock = threading.Lock()
    key_of_id = {}
    fail_for = fail_for if fail_for is not None else set()

    def wrap(name):
        method = getattr(journal.client, name)

        def recorded(*args, **kwargs):
            start = time.monotonic()
            time.sleep(delay)
            if name == "create_run":
                key = kwargs["tags"]["gtep.key"]
            else:
                key = key_of_id[args[0]]
            if key in fail_for:
                raise ConnectionError(f"store away for {key}")
            result = method(*args, **kwargs)
            if name == "create_run":
                key_of_id[result.info.run_id] = key
            with lock:
                calls.append((start, time.monotonic(), name, key, kwargs.get("tags", {})))
            return result
        setattr(journal.client, name, recorded)

    for name in ("create_run", "log_batch", "set_terminated", "update_run", "log_artifact"):
        wrap(name)
    return calls


def write_units_with_a_reference(journal: TrackingJournal, units: int) -> None:
    with journal.batch():  # journaled first, applied in one flush: what a server that was away finds
        write_units(journal, units)
        journal.log("phase", tags={"best": journal_module.RUN_REF + f"phase/o{units - 1}"})


def test_writers_apply_different_runs_at_once_and_each_runs_writes_in_journal_order(store, tmp_path):
    """Against a tracking server a unit's four writes are four round trips: several writers apply different runs'
    writes at once, and what must stay ordered stays ordered (a run's own writes, a child after its parent, a
    tag naming a run after that run exists)."""
    uri, client, experiment = store
    journal = TrackingJournal.open(tmp_path / "study", uri, experiment)
    journal.writers = 4
    journal._log_artifact = lambda run_id, name, source: journal.client.log_artifact(run_id, str(source))
    calls = record_calls(journal, delay=0.02)
    write_units_with_a_reference(journal, 12)
    assert journal.pending == [] and journal.last_error == ""

    overlapping = max(sum(1 for s, e, *_ in calls if s <= start < e) for start, *_ in calls)
    assert overlapping >= 3, "the writers applied several runs' writes at once"
    journal_order = {"create_run": 0, "log_batch": 1, "log_artifact": 2, "set_terminated": 3}
    for u in range(12):
        own = [name for _, _, name, key, _ in sorted(calls) if key == f"phase/o{u}"]
        assert own == sorted(own, key=journal_order.get) and len(own) == 4, own
    created = {key: end for _, end, name, key, _ in calls if name == "create_run"}
    started = {key: start for start, _, name, key, _ in calls if name == "create_run"}
    assert all(started[f"phase/o{u}"] >= created["phase"] for u in range(12)), "children after their parent"
    reference = next(start for start, _, name, key, _ in calls if name == "log_batch" and key == "phase")
    assert reference >= created["phase/o11"]

    runs = runs_by_ordering(client, experiment)
    assert len(runs) == 13 and all(r.info.status == "FINISHED" for r in runs.values())
    assert runs["phase"].data.tags["best"] == runs["11"].info.run_id
    assert all(runs[str(u)].data.metrics["acc"] == pytest.approx(u / 10) for u in range(12))
    state = json.loads((tmp_path / "study" / "tracking" / "state.json").read_text())
    assert state["applied"] == 1 + 12 * 4 + 2 and state["applied_after"] == []


def test_writes_applied_past_a_failure_are_neither_applied_again_nor_renumbered(store, tmp_path):
    """One run's writes fail while the other writers go on: `applied` stops before the first write left, the writes
    applied past it are listed in state.json, and a resume (`gtep sync`) applies only what is left, once."""
    uri, client, experiment = store
    study = tmp_path / "study"
    journal = TrackingJournal.open(study, uri, experiment)
    journal.writers = 4
    journal._log_artifact = lambda run_id, name, source: journal.client.log_artifact(run_id, str(source))
    calls = record_calls(journal, fail_for={"phase/o2"})
    with journal.batch():
        write_units(journal, 6)
    left = journal.flush()
    assert "store away for phase/o2" in journal.last_error
    o2 = [op for op in journal.pending if op["key"] == "phase/o2"]
    assert [op["op"] for op in o2] == ["create_run", "log", "artifact", "terminate"], "o2's writes wait, in order"
    assert left == len(journal.pending) and o2[0]["seq"] >= journal.pending[0]["seq"]
    state = json.loads((study / "tracking" / "state.json").read_text())
    assert state["applied"] == journal.pending[0]["seq"] - 1
    assert set(state["applied_after"]).isdisjoint(op["seq"] for op in journal.pending) and state["applied_after"]
    applied_before = len(calls)

    synced = TrackingJournal.load(study)
    synced.writers = 4
    assert [op["seq"] for op in synced.pending] == [op["seq"] for op in journal.pending], "nothing applied twice"
    assert synced._next_seq == journal._next_seq, "no number is given twice"
    assert synced.flush(force=True) == 0 and synced.last_error == ""
    assert len(calls) == applied_before, "the resumed journal writes through its own client"
    runs = runs_by_ordering(client, experiment)
    assert len(client.search_runs([experiment], max_results=1000)) == 1 + 6, "no run was created twice"
    assert all(r.info.status == "FINISHED" for r in runs.values())
    assert all(runs[str(u)].data.metrics["acc"] == pytest.approx(u / 10) for u in range(6))
    assert [m.value for m in client.get_metric_history(runs["3"].info.run_id, "acc_t")] == [0.5, pytest.approx(0.3)]
    state = json.loads((study / "tracking" / "state.json").read_text())
    assert state["applied"] == 1 + 6 * 4 + 1 and state["applied_after"] == []
    assert journal_seqs(study) == [] and snapshots(study) == []


def test_a_local_store_takes_one_writer_and_a_server_several():
    assert TrackingJournal(Path("/nonexistent"), None, JournalState("sqlite:///x.db", "0")).writers == 1
    assert TrackingJournal(Path("/nonexistent"), None, JournalState("http://127.0.0.1:5000", "0")).writers == 4
