"""A Ray node lost while a phase runs (a preempted or crashed machine): one line on the terminal, the rest in the
study's log.

Ray retries the trials the node was running (compute.max_failures) and each retry continues from its units'
files and last task checkpoint, so the study ends as it would have without the loss (docs/faults.md). What Ray
prints about it (the controller's "Trial task failed" with an ActorDiedError traceback and the node's state dump,
the GCS's "marked dead" notice) is nothing a user can act on: it goes to <study>/ray-errors.log, and the terminal
gets one line naming the node and how many units it was training, which are trained again elsewhere."""
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

LOG_NAME = "ray-errors.log"
# what Ray's lines about a lost node or the actors that died with it say (Ray 2.4x-2.6x)
# (a trial that fails of its own error keeps its traceback on the terminal)
MARKS = ("its node has died", "node has died", "NodeDiedError", "has been marked dead", "node was terminated",
         "ActorDiedError", "ActorUnavailableError", "The actor died", "raylet died")


def record_text(record: logging.LogRecord) -> str:
    try:
        text = record.getMessage()
    except Exception:  # noqa: BLE001 - a malformed record is logging's to report
        return ""
    if record.exc_info and record.exc_info[1] is not None:
        text += "\n" + "".join(traceback.format_exception(*record.exc_info))
    return text


class ToStudyLog(logging.Filter):
    """Takes Ray's lines about a lost node (or a dead trial actor) off the terminal and appends them to the study's
    log, whole, with their time and logger."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path

    def filter(self, record: logging.LogRecord) -> bool:
        text = record_text(record)
        if not any(mark in text for mark in MARKS):
            return True
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(record.created))
        with self.path.open("a") as log:
            log.write(f"{stamp} {record.levelname} {record.name}: {text}\n")
        return False


DEAD_NODE = re.compile(r"node id: ([0-9a-f]+) and address: (\S+)")


@contextmanager
def ray_lines_to_study_log(study_root: Path, on_dead_node: Callable[[str, str], None] | None = None
                           ) -> Iterator[Path]:
    """While the block runs, Ray's node-loss lines go to <study>/ray-errors.log instead of the terminal: those of
    its loggers (every handler of Ray's loggers and the root logger drops them), and the GCS's notices that Ray's
    driver prints itself ("(raylet) The node with node id: ... has been marked dead ..."), which also tell
    `on_dead_node` (node id, address)."""
    from ray._private import worker

    path = study_root / LOG_NAME
    drop = ToStudyLog(path)
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
        with path.open("a") as log:
            log.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} (raylet) {text}\n")
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


def units_on(events_path: Path, node: str, phase: str) -> int:
    """Units of `phase` started on `node` and not finished there: what the node was training when it went (a
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
        if event.get("phase") != phase:
            continue
        key = (event.get("set_index"), event.get("ordering"))
        if event.get("event") == "unit_started" and event.get("node") == node:
            started.add(key)
        elif event.get("event") in ("unit_trained", "unit_reused") and event.get("node") == node:
            done.add(key)
    return len(started - done)


def dead_nodes() -> dict[str, str]:
    """Node id -> its address, for the cluster's nodes that are not alive."""
    try:
        return {n["NodeID"]: str(n.get("NodeManagerAddress", "")) for n in ray.nodes() if not n.get("Alive")}
    except Exception:  # noqa: BLE001 - the GCS busy or gone: nothing to say now
        return {}


class NodeLossCallback(tune.Callback):
    """Says each node's loss once: when Ray's GCS reports the node dead (ray_lines_to_study_log), or when a trial
    fails and the cluster lists a node that is no longer alive."""

    def __init__(self, say: Callable[[str], Any], study_root: Path, phase: str) -> None:
        self.say, self.root, self.phase = say, study_root, phase
        self.known = set(dead_nodes())  # nodes already gone before this phase: said by an earlier one, or not ours
        self.lock = threading.Lock()
        self.checked = 0.0
        self.failures = 0  # trials that failed since the last node loss was said

    def __getstate__(self) -> dict[str, Any]:
        return {}  # the terminal stays on the driver when Ray pickles its run config

    def on_trial_recover(self, iteration, trials, trial, **info) -> None:
        self.failures += 1
        self.check()

    def on_trial_error(self, iteration, trials, trial, **info) -> None:
        self.failures += 1
        self.check()

    def on_step_end(self, iteration, trials, **info) -> None:
        if self.failures and time.monotonic() - self.checked > 5:  # the GCS marks a node dead some seconds late
            self.check()

    def check(self) -> None:
        self.checked = time.monotonic()
        for node, address in dead_nodes().items():
            self.lost(node, address)

    def lost(self, node: str, address: str) -> None:
        with self.lock:
            if node in self.known:
                return
            self.known.add(node)
            self.failures = 0
        units = units_on(self.root / "events.jsonl", node, self.phase)
        where = f" ({address})" if address else ""
        self.say(f"Ray node {node[:8]}{where} was lost: {units} unit(s) it was training are trained again on the "
                 f"other nodes, from their last task checkpoint (Ray's account: {self.root / LOG_NAME})")
