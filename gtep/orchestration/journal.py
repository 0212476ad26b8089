"""A study's MLflow writes as a journal on disk, applied to the tracking server whenever it answers.

Every write (create a run, log metrics/params/tags, an artifact, end a run) is first appended to
`<study>/tracking/journal.jsonl`, then applied in order. When the server is away, the writes wait in the
journal and training goes on; they are applied when it answers again, or by `gtep sync <study>`.

While Ray Tune runs a phase the writes are applied by a thread of their own (`in_background`), so the Tune
loop on the driver never waits for MLflow (a server's round trips, sqlite's commits); it only appends.

Runs are named by keys (`tune:<attempt>/set003/o1`), not by MLflow ids, so a write can be journaled
before its run exists, and a resumed study finds its runs again instead of creating new ones. Every
operation is idempotent: a run is looked up by its `gtep.key` tag before it is created; metrics carry the
timestamp they were journaled with, so writing them twice stores them once.

Against a tracking server the writes of different runs are applied by several threads at once (`writers`,
GTEP_TRACKING_WRITERS, 4 by default): a unit's four writes are four round trips, and one thread applying them in
turn capped a matrix at about 3 units a second. The order that matters is kept: a run's own writes in journal
order, a child after its parent is created, a tag naming another run after that run is created. `applied` is
then the last write of the unbroken applied prefix; writes applied past it are listed in `state.json`
(`applied_after`), so a resume neither applies them again nor reuses their numbers. A local store (sqlite, files)
takes one writer: sqlite serialises writers anyway and answers a second one with "database is locked".

The journal holds only what is still needed: once the writes are applied (a forced flush, as at a phase's
end, or a journal grown past COMPACT_AFTER_BYTES) it is rewritten to the pending writes alone, and the
snapshots of applied artifacts are dropped. What a resume reads back besides them (the last applied write,
the run ids by key) is in `state.json`.
"""
from __future__ import annotations

import json
import os
import shutil
import threading
import time
from collections import deque
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

from mlflow.entities import Metric, Param, RunTag
from mlflow.tracking import MlflowClient
from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID, MLFLOW_RUN_NAME

from gtep.config.uris import check_no_userinfo, is_server
from gtep.orchestration.study import write_atomic

RUN_REF = "@run:"  # a tag value naming another run by key, resolved when applied
RETRY_AFTER_SECONDS = 5.0
COMPACT_AFTER_BYTES = 1 << 20  # ~700 units' writes: a flush that leaves nothing pending then compacts the journal


def now_ms() -> int:
    return int(time.time() * 1000)


def tracking_writers() -> int:
    """Threads applying a study's writes to a tracking server at once (GTEP_TRACKING_WRITERS, 4 by default)."""
    return max(1, int(os.environ.get("GTEP_TRACKING_WRITERS", 4)))


def quiet_http_client(tracking_uri: str) -> MlflowClient:
    """An MlflowClient that fails fast when a server is away (the journal retries, not the HTTP layer)."""
    if is_server(tracking_uri):
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "20")
        os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")  # one line per run would bury the table
    return MlflowClient(tracking_uri=tracking_uri)


@dataclass
class JournalState:
    tracking_uri: str
    experiment_id: str
    applied: int = 0  # sequence number of the last operation the server took
    applied_after: list[int] = field(default_factory=list)  # operations past `applied` it took too (concurrent writers)
    runs: dict[str, str] = field(default_factory=dict)  # key -> MLflow run id


class TrackingJournal:
    """The only path from gtep to MLflow during a study (one writer: the driver)."""

    def __init__(self, study_root: Path, client: MlflowClient, state: JournalState) -> None:
        self.dir = study_root / "tracking"
        self.client, self.state = client, state
        self.pending: list[dict[str, Any]] = []
        self.last_error: str = ""
        self._failed_at = 0.0
        self._next_seq = max([state.applied, *state.applied_after]) + 1
        self.writers = 1 if not is_server(state.tracking_uri) else tracking_writers()
        self._created: set[str] = set()  # keys of the runs this process created (no run had them before)
        self._artifact_uris: dict[str, str] = {}  # run id -> artifact URI, for the runs this process created
        self._attempted: set[int] = set()  # create operations this process has sent at least once
        self._batched = 0  # inside batch(): journal now, apply when the batch ends
        self._flushing = threading.Lock()  # one flush at a time: the background writer's or the caller's
        self._journal_file = threading.Lock()  # an append never lands in a journal file a compaction replaces
        self._wake: threading.Event | None = None  # set while a background writer applies the writes
        self.wait_seconds = 0.0  # how long a forced flush retries a store that does not answer (tracking_store)
        self._read_pending()

    # ---- opening -------------------------------------------------------------------------------
    @classmethod
    def open(cls, study_root: Path, tracking_uri: str, experiment_id: str) -> "TrackingJournal":
        """The study's journal for a phase. `tracking_uri` is stored in state.json: it is a resolved experiment's
        address, which its resolution checked once (gtep.config.uris), so it is not checked again here."""
        state_path = study_root / "tracking" / "state.json"
        if state_path.exists():
            state = JournalState(**json.loads(state_path.read_text()))
            state.tracking_uri, state.experiment_id = tracking_uri, experiment_id
        else:
            state = JournalState(tracking_uri, experiment_id)
        return cls(study_root, quiet_http_client(tracking_uri), state)

    @classmethod
    def load(cls, study_root: Path, tracking_uri: str | None = None) -> "TrackingJournal":
        """For `gtep sync`: the journal as the study left it."""
        state_path = study_root / "tracking" / "state.json"
        if not state_path.exists():
            raise FileNotFoundError(f"{study_root} has no tracking journal (tracking/state.json)")
        state = JournalState(**json.loads(state_path.read_text()))
        if tracking_uri:
            state.tracking_uri = tracking_uri
        # before any write or message: `gtep sync --tracking-uri` stores the address it is given in state.json
        check_no_userinfo(state.tracking_uri, "--tracking-uri" if tracking_uri else f"{state_path} tracking_uri")
        return cls(study_root, quiet_http_client(state.tracking_uri), state)

    @property
    def journal_path(self) -> Path:
        return self.dir / "journal.jsonl"

    def _read_pending(self) -> None:
        if not self.journal_path.exists():
            return
        for line in self.journal_path.read_text().splitlines():
            if not line.strip():
                continue
            try:
                op = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut short by a killed driver: its operation was never acknowledged
            self._next_seq = max(self._next_seq, op["seq"] + 1)
            if op["seq"] > self.state.applied and op["seq"] not in self.state.applied_after:
                self.pending.append(op)

    def _save_state(self) -> None:
        write_atomic(self.dir / "state.json", json.dumps(self.state.__dict__, indent=1))

    # ---- journaling ----------------------------------------------------------------------------
    def _append(self, op: dict[str, Any]) -> None:
        with self._journal_file:
            op["seq"] = self._next_seq
            self._next_seq += 1
            self.dir.mkdir(parents=True, exist_ok=True)
            with open(self.journal_path, "a") as fh:
                fh.write(json.dumps(op, default=str) + "\n")
            self.pending.append(op)
        if not self._batched:
            self._kick()

    def _kick(self) -> None:
        """Apply what was journaled: now, or by the background writer when there is one."""
        if self._wake is not None:
            self._wake.set()
        else:
            self.flush()

    @contextmanager
    def batch(self) -> Iterator[None]:
        """Journal the writes made inside, then apply them in one flush with one save of state.json (a
        unit's run is four writes; saving the state after each cost the driver ~7 ms per unit)."""
        self._batched += 1
        try:
            yield
        finally:
            self._batched -= 1
            if not self._batched:
                self._kick()

    @contextmanager
    def in_background(self) -> Iterator[None]:
        """Inside the block, writes are applied by a writer thread (in order, as before; a store that is away
        is retried every RETRY_AFTER_SECONDS). The block's end waits for one last flush; what the store still
        refuses stays pending, as it would without the thread."""
        stop, self._wake = threading.Event(), threading.Event()
        writer = threading.Thread(target=self._write_until, args=(stop,), name="gtep-mlflow-writer", daemon=True)
        writer.start()
        try:
            yield
        finally:
            stop.set()
            self._wake.set()
            writer.join()
            self._wake = None

    def _write_until(self, stop: threading.Event) -> None:
        assert self._wake is not None
        while True:
            self._wake.wait(timeout=RETRY_AFTER_SECONDS)
            self._wake.clear()
            self.flush()
            if stop.is_set():
                return

    def create_run(self, key: str, name: str, parent: str | None = None, tags: dict[str, str] | None = None,
                   start_time: int | None = None) -> None:
        """`start_time` (ms): when the run really started (an ordering trained before its run is written); by
        default the time it is journaled, not the time the store takes it (later, or much later if it was away)."""
        self._append({"op": "create_run", "key": key, "name": name, "parent": parent, "tags": tags or {},
                      "start_time": int(start_time or now_ms())})

    def reopen(self, key: str) -> None:
        """A resumed study marks its runs running again (they stay the same runs)."""
        self._append({"op": "reopen", "key": key})

    def log(self, key: str, metrics: Mapping[str, float] | None = None, steps: Sequence[tuple[str, float, int]] = (),
            params: dict[str, Any] | None = None, tags: dict[str, str] | None = None,
            timestamp: int | None = None) -> None:
        ts = timestamp or now_ms()
        rows = [[k, float(v), ts, 0] for k, v in (metrics or {}).items()] + [[k, float(v), ts, s] for k, v, s in steps]
        self._append({"op": "log", "key": key, "metrics": rows,
                      "params": {str(k): str(v)[:6000] for k, v in (params or {}).items()}, "tags": tags or {}})

    def log_text(self, key: str, name: str, text: str) -> None:
        self._append({"op": "artifact", "key": key, "name": name, "file": self._snapshot_text(name, text)})

    def log_file(self, key: str, path: Path) -> None:
        """The file as it is now: later changes to it (the manifest) do not change what is logged."""
        self._append({"op": "artifact", "key": key, "name": path.name,
                      "file": self._snapshot_text(path.name, path.read_text())})

    def terminate(self, key: str, status: str, end_time: int | None = None) -> None:
        """`end_time` (ms): by default the time it is journaled."""
        self._append({"op": "terminate", "key": key, "status": status, "end_time": int(end_time or now_ms())})

    def _snapshot_text(self, name: str, text: str) -> str:
        folder = self.dir / "files" / f"{self._next_seq:06d}"  # keeps the artifact's own name: logged as it is
        folder.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
        return f"{folder.name}/{name}"

    # ---- applying ------------------------------------------------------------------------------
    def run_id(self, key: str) -> str | None:
        return self.state.runs.get(key)

    def flush(self, force: bool = False) -> int:
        """Apply what is pending, in order; stop at the first failure. Returns how many remain. A forced
        flush (a phase's start and end, `gtep sync`) retries for `wait_seconds` while writes remain, then
        compacts the journal, as does one that finds it grown large."""
        with self._flushing:
            left = self._flush(force)
            deadline = time.monotonic() + (self.wait_seconds if force else 0.0)
            while left and time.monotonic() < deadline:  # a server being restarted: wait for it, a bounded time
                time.sleep(min(2.0, max(deadline - time.monotonic(), 0.0)))
                left = self._flush(force)
            if force or (not left and self._journal_bytes() > COMPACT_AFTER_BYTES):
                self._compact()
            return left

    def _journal_bytes(self) -> int:
        try:
            return self.journal_path.stat().st_size
        except FileNotFoundError:
            return 0

    def _compact(self) -> None:
        """Rewrite the journal to hold the pending writes alone (called under `_flushing`, so none is applied
        meanwhile). state.json is saved first: a crash at any point leaves a state that marks every write
        the journal no longer holds as applied, and a rename leaves the old journal or the new one, whole."""
        with self._journal_file:
            if not self.pending and self._journal_bytes() == 0:
                return
            self._save_state()
            write_atomic(self.journal_path, "".join(json.dumps(op, default=str) + "\n" for op in self.pending))
        self._drop_applied_snapshots()

    def _drop_applied_snapshots(self) -> None:
        """Artifact snapshots are named by the sequence number their write got (`files/000042/<name>`, or
        `files/000042-<name>` from older journals); those of applied writes are in the store. A snapshot
        numbered past `applied` belongs to a pending write or to one being journaled right now: it stays."""
        files = self.dir / "files"
        if not files.is_dir():
            return
        needed = {op["file"].split("/")[0] for op in self.pending if op["op"] == "artifact"}
        for entry in files.iterdir():
            number = entry.name.split("-")[0]
            if entry.name in needed or not number.isdigit() or int(number) > self.state.applied:
                continue
            if entry.is_dir():
                shutil.rmtree(entry)
            else:
                entry.unlink()

    def _flush(self, force: bool) -> int:
        if self.pending and not force and time.monotonic() - self._failed_at < RETRY_AFTER_SECONDS:
            return len(self.pending)
        before = (self.state.applied, len(self.state.applied_after))
        try:
            applied_all = self._apply_concurrently() if self.writers > 1 and len(self.pending) > 1 \
                else self._apply_in_turn()
        finally:
            # once per flush: a crash before this save re-applies the flush's writes, which are idempotent
            self.state.applied_after = [seq for seq in self.state.applied_after if seq > self.state.applied]
            if (self.state.applied, len(self.state.applied_after)) != before:
                self._save_state()
        if applied_all:
            self.last_error = ""
        return len(self.pending)

    def _apply_in_turn(self) -> bool:
        while self.pending:
            op = self.pending[0]
            try:
                self._apply(op)
            except Exception as err:  # noqa: BLE001 - any failure to reach the store means: keep it and retry
                self._failed(err)
                return False
            self.pending.pop(0)
            self.state.applied = op["seq"]
        return True

    def _failed(self, err: BaseException) -> None:
        self.last_error = f"{err.__class__.__name__}: {str(err).splitlines()[0][:200] if str(err) else ''}"
        self._failed_at = time.monotonic()

    def _apply_concurrently(self) -> bool:
        """Apply the pending writes with `writers` threads: one write of a run at a time, in its journal order, and
        a write that needs another run (its parent, a run its tags name) only once that run is created. After a
        failure nothing new is started; what is in flight finishes, and what is left stays pending, in order."""
        taken = list(self.pending)  # writes journaled meanwhile wait for the next flush
        lanes: dict[str, deque[dict[str, Any]]] = {}
        for op in taken:
            lanes.setdefault(op["key"], deque()).append(op)
        creating = {op["key"]: op["seq"] for op in taken if op["op"] == "create_run"}
        waiting: dict[str, list[str]] = {}  # a run still to be created -> the runs whose next write needs it
        ready = deque(lanes)
        done: set[int] = set()
        busy: dict[Future[None], str] = {}
        failed = False
        with ThreadPoolExecutor(self.writers, thread_name_prefix="gtep-mlflow-writer") as pool:
            while True:
                while ready and not failed and len(busy) < self.writers:
                    key = ready.popleft()
                    blocker = self._blocker(lanes[key][0], creating)
                    if blocker is None:
                        busy[pool.submit(self._apply, lanes[key][0])] = key
                    else:
                        waiting.setdefault(blocker, []).append(key)
                if not busy:
                    break
                finished, _ = wait(busy, return_when=FIRST_COMPLETED)
                for future in finished:
                    key = busy.pop(future)
                    error = future.exception()
                    if error is not None:  # any failure to reach the store means: keep it and retry
                        self._failed(error)
                        failed = True
                        continue
                    op = lanes[key].popleft()
                    done.add(op["seq"])
                    if op["op"] == "create_run" and creating.get(key) == op["seq"]:
                        del creating[key]
                        ready.extend(waiting.pop(key, []))
                    if lanes[key]:
                        ready.append(key)
        self._mark_applied(done)
        return not failed

    @staticmethod
    def _blocker(op: dict[str, Any], creating: Mapping[str, int]) -> str | None:
        """The run, journaled for creation before `op`, that `op` needs and that is not created yet."""
        needs = [op["parent"]] if op["op"] == "create_run" and op.get("parent") else []
        needs += [v[len(RUN_REF):] for v in op.get("tags", {}).values() if isinstance(v, str) and v.startswith(RUN_REF)]
        return next((k for k in needs if k != op["key"] and creating.get(k, op["seq"]) < op["seq"]), None)

    def _mark_applied(self, done: set[int]) -> None:
        """Drop the applied writes from `pending` (under the journal's lock: writes are appended meanwhile), move
        `applied` to the end of the unbroken applied prefix and list the writes applied past it."""
        with self._journal_file:
            self.pending = [op for op in self.pending if op["seq"] not in done]
            after = sorted(done.union(self.state.applied_after))
            first_left = self.pending[0]["seq"] if self.pending else self._next_seq
            self.state.applied = max([self.state.applied, *(seq for seq in after if seq < first_left)])
            self.state.applied_after = [seq for seq in after if seq > self.state.applied]

    def _resolve(self, tags: dict[str, str]) -> dict[str, str]:
        return {k: (self.state.runs.get(v[len(RUN_REF):], "") if isinstance(v, str) and v.startswith(RUN_REF) else v)
                for k, v in tags.items()}

    def _existing(self, key: str) -> str | None:
        found = self.client.search_runs([self.state.experiment_id], filter_string=f"tags.`gtep.key` = '{key}'",
                                        max_results=1)
        return found[0].info.run_id if found else None

    def _apply(self, op: dict[str, Any]) -> None:
        kind, key = op["op"], op["key"]
        if kind == "create_run":
            if key in self.state.runs:
                return
            # A child is created after its parent, so under a parent this process created a run can exist only
            # if an earlier try of this very operation reached the store: only then is the lookup needed (a
            # search per run: an eighth of the driver's MLflow time per unit on sqlite, a round trip on a server).
            fresh = op["parent"] in self._created and op["seq"] not in self._attempted
            self._attempted.add(op["seq"])
            run_id = None if fresh else self._existing(key)
            if run_id is None:
                tags = {**self._resolve(op["tags"]), "gtep.key": key, MLFLOW_RUN_NAME: op["name"]}
                if op["parent"]:
                    tags[MLFLOW_PARENT_RUN_ID] = self.state.runs[op["parent"]]
                info = self.client.create_run(self.state.experiment_id, start_time=op.get("start_time"),
                                              run_name=op["name"], tags=tags).info
                run_id = info.run_id
                self._artifact_uris[run_id] = info.artifact_uri
                self._created.add(key)
            self.state.runs[key] = run_id
            return
        run_id = self.state.runs[key]
        if kind == "reopen":
            self.client.update_run(run_id, status="RUNNING")
        elif kind == "log":
            self.client.log_batch(run_id, metrics=[Metric(*row) for row in op["metrics"]],
                                  params=[Param(k, v) for k, v in op["params"].items()],
                                  tags=[RunTag(k, v) for k, v in self._resolve(op["tags"]).items()])
        elif kind == "artifact":
            self._log_artifact(run_id, op["name"], self.dir / "files" / op["file"])
        elif kind == "terminate":
            self.client.set_terminated(run_id, op["status"], end_time=op.get("end_time"))
        else:
            raise ValueError(f"unknown journal operation {kind!r}")

    def _log_artifact(self, run_id: str, name: str, source: Path) -> None:
        import tempfile

        if source.name != name:  # a journal written before snapshots kept their names
            with tempfile.TemporaryDirectory() as scratch:
                target = Path(scratch) / name
                shutil.copyfile(source, target)
                self._log_artifact(run_id, name, target)
            return
        if run_id in self._artifact_uris:  # known from create_run: no get_run per artifact (a third of its cost)
            from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository

            get_artifact_repository(self._artifact_uris[run_id], tracking_uri=self.state.tracking_uri).log_artifact(
                str(source))
        else:
            self.client.log_artifact(run_id, str(source))
