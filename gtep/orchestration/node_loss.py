"""A Ray node lost while a study runs (a preempted or crashed machine): one line on the terminal, the rest in the
study's log.

Ray retries the trials the node was running (compute.max_failures) and each retry continues from its units'
files and last task checkpoint, so the study ends as it would have without the loss (docs/faults.md). What Ray
prints about it (the controller's "Trial task failed" with an ActorDiedError traceback and the node's state dump,
the GCS's "marked dead" notice, the lost node's agents' "Raylet is terminated" with the raylet log's last lines) is
nothing a user can act on: it goes to <study>/ray-errors.log, and the terminal gets one line naming the node and
how many units it was training, which are trained again elsewhere.

The GCS marks a node dead only after it missed its heartbeats (some 15-30 s after the loss), often after the retry
finished the phase, so one watch spans the whole study (every phase and the gaps between them), and a watch that
saw an actor die for a node not yet declared dead waits for the GCS's verdict before it lets go."""
from __future__ import annotations

import json
import logging
import re
import threading
import time
import traceback
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

import ray
from ray import tune

from gtep.config.private import private_folder

LOG_NAME = "ray-errors.log"
# what Ray's lines about a lost node or the actors that died with it say (Ray 2.4x-2.6x)
# (a trial that fails of its own error keeps its traceback on the terminal)
MARKS = ("its node has died", "node has died", "NodeDiedError", "has been marked dead", "node was terminated",
         "ActorDiedError", "ActorUnavailableError", "The actor died", "raylet died",
         # the lost node's agents, as their raylet goes: "Raylet is terminated. Termination is unexpected. ..." and
         # the raylet log's last 20 lines, published to the driver (ray/_private/process_watcher.py), each agent once
         "Raylet is terminated")
# the longest the GCS takes to declare a node dead once its actors died (Ray's health check: 5 s initial delay,
# then 5 missed checks 3 s apart, each allowed 10 s), with room for a busy head node
VERDICT_S = 45.0


def record_text(record: logging.LogRecord) -> str:
    try:
        text = record.getMessage()
    except Exception:  # noqa: BLE001 - a malformed record is logging's to report
        return ""
    if record.exc_info and record.exc_info[1] is not None:
        text += "\n" + "".join(traceback.format_exception(*record.exc_info))
    return text


def append(path: Path, line: str) -> None:
    private_folder(path.parent)  # a loss may come before the phase made the study folder: owner-only, as it makes it
    with path.open("a") as log:
        log.write(line)


class ToStudyLog(logging.Filter):
    """Takes Ray's lines about a lost node (or a dead trial actor) off the terminal and appends them to the study's
    log, whole, with their time and logger; `on_mark` hears of each."""

    def __init__(self, path: Path, on_mark: Callable[[], None] | None = None) -> None:
        super().__init__()
        self.path, self.on_mark = path, on_mark

    def filter(self, record: logging.LogRecord) -> bool:
        text = record_text(record)
        if not any(mark in text for mark in MARKS):
            return True
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(record.created))
        append(self.path, f"{stamp} {record.levelname} {record.name}: {text}\n")
        if self.on_mark is not None:
            self.on_mark()
        return False


DEAD_NODE = re.compile(r"node id: ([0-9a-f]+) and address: (\S+)")


@contextmanager
def ray_lines_to_study_log(study_root: Path, on_dead_node: Callable[[str, str], None] | None = None,
                           on_mark: Callable[[], None] | None = None) -> Iterator[Path]:
    """While the block runs, Ray's node-loss lines go to <study>/ray-errors.log instead of the terminal: those of
    its loggers (every handler of Ray's loggers and the root logger drops them, and tells `on_mark`), and the
    GCS's notices that Ray's driver prints itself ("(raylet) The node with node id: ... has been marked dead ..."),
    which also tell `on_dead_node` (node id, address)."""
    from ray._private import worker

    path = study_root / LOG_NAME
    drop = ToStudyLog(path, on_mark)
    handlers = {h for name in ("", "ray", "ray.tune", "ray.tune.execution.tune_controller", "ray.train")
                for h in logging.getLogger(name).handlers}
    for handler in handlers:
        handler.addFilter(drop)
    printing = worker.print_to_stdstream

    def print_to_stdstream(data: dict[str, Any], ignore_prefix: bool) -> None:
        lines = [str(line) for line in data.get("lines", ())]
        text = "\n".join(lines)
        if data.get("pid") != "raylet" or not any(mark in text for mark in MARKS):
            printing(data, ignore_prefix)
            return
        append(path, f"{time.strftime('%Y-%m-%d %H:%M:%S')} (raylet) {text}\n")
        found = DEAD_NODE.search(text)
        if found and on_dead_node is not None:
            on_dead_node(found.group(1), found.group(2))

    worker.print_to_stdstream = print_to_stdstream  # the driver's error-listener thread looks it up on each call
    try:
        yield path
    finally:
        worker.print_to_stdstream = printing
        for handler in handlers:
            handler.removeFilter(drop)


def units_on(events_path: Path, node: str) -> int:
    """Units started on `node` and not finished there, in any phase: what the node was training when it went (a
    retry elsewhere may have finished some since)."""
    started, done = set(), set()
    try:
        lines = events_path.read_text().splitlines()
    except OSError:
        return 0
    for line in lines:
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if event.get("node") != node:
            continue
        key = (event.get("phase"), event.get("set_index"), event.get("ordering"))
        if event.get("event") == "unit_started":
            started.add(key)
        elif event.get("event") in ("unit_trained", "unit_reused"):
            done.add(key)
    return len(started - done)


def dead_nodes() -> dict[str, str]:
    """Node id -> its address, for the cluster's nodes that are not alive."""
    try:
        return {n["NodeID"]: str(n.get("NodeManagerAddress", "")) for n in ray.nodes() if not n.get("Alive")}
    except Exception:  # noqa: BLE001 - the GCS busy or gone: nothing to say now
        return {}


class NodeLossWatch:
    """Says each node the study loses once: when Ray's GCS reports the node dead, or when a trial failed and the
    cluster lists a node that is no longer alive. Nodes gone before the study began are not its news."""

    def __init__(self, say: Callable[[str], Any], study_root: Path, known: set[str] | None = None) -> None:
        self.say, self.root = say, study_root
        self.known = set(dead_nodes()) if known is None else known
        self.lock = threading.Lock()
        self.checked = 0.0
        self.failing = False  # a trial failed since the last loss was said: worth asking the cluster again
        self.actor_died = False  # ... and an actor died with it: a loss the GCS may not have declared yet

    def trial_failed(self, actor_died: bool) -> None:
        self.failing = True
        self.actor_died = self.actor_died or actor_died
        self.check()

    def died(self) -> None:
        self.failing = self.actor_died = True

    def check(self) -> None:
        self.checked = time.monotonic()
        for node, address in dead_nodes().items():
            self.lost(node, address)

    def lost(self, node: str, address: str) -> None:
        with self.lock:
            if node in self.known:
                return
            self.known.add(node)
            self.failing = self.actor_died = False
        units = units_on(self.root / "events.jsonl", node)
        where = f" ({address})" if address else ""
        self.say(f"Ray node {node[:8]}{where} was lost: {units} unit(s) it was training are trained again on the "
                 f"other nodes, from their last task checkpoint (Ray's account: {self.root / LOG_NAME})")

    def await_verdict(self, timeout: float = VERDICT_S, poll: float = 1.0) -> None:
        """Before the study lets Ray go, after an actor died: the GCS's word on its node, so the loss is said even
        where the retry finished first. Returns at once when no actor died, and as soon as the loss is said (an
        actor that died on a live node, killed by the kernel say, costs the wait)."""
        deadline = time.monotonic() + timeout
        while self.actor_died and time.monotonic() < deadline:
            self.check()
            if self.actor_died:
                time.sleep(poll)


_watching: dict[Path, NodeLossWatch] = {}


@contextmanager
def watching_node_loss(study_root: Path, say: Callable[[str], Any]) -> Iterator[NodeLossWatch]:
    """The study's node-loss watch while the block runs; a block inside another of the same study (a phase inside
    `gtep run`) shares the outer watch, so a loss is said once whichever phase or gap it falls in."""
    root = study_root.resolve()
    if root in _watching:
        yield _watching[root]
        return
    watch = NodeLossWatch(say, root)
    _watching[root] = watch
    try:
        with ray_lines_to_study_log(root, watch.lost, watch.died):
            try:
                yield watch
            finally:
                watch.await_verdict()
    finally:
        del _watching[root]


class NodeLossCallback(tune.Callback):
    """Tells the study's watch of a phase's failed trials (and whether their actor died), and asks the cluster
    again while the GCS may still be about to declare a node dead."""

    def __init__(self, watch: NodeLossWatch) -> None:
        self.watch = watch

    def __getstate__(self) -> dict[str, Any]:
        return {}  # the terminal stays on the driver when Ray pickles its run config

    def on_trial_recover(self, iteration, trials, trial, **info) -> None:
        self.watch.trial_failed(died_with_its_actor(trial))

    def on_trial_error(self, iteration, trials, trial, **info) -> None:
        self.watch.trial_failed(died_with_its_actor(trial))

    def on_step_end(self, iteration, trials, **info) -> None:
        if self.watch.failing and time.monotonic() - self.watch.checked > 5:  # the GCS marks a node dead late
            self.watch.check()


def died_with_its_actor(trial: Any) -> bool:
    """Whether the trial's last error is its actor's death (a lost node, a killed process), not its own error."""
    try:
        text = str(trial.get_error() or "")
    except Exception:  # noqa: BLE001 - storage unreadable: its own error, as far as we can tell
        return False
    return any(mark in text for mark in MARKS)
