"""A paper-scale study matrix, rehearsed on this machine (issue 34): the matrix's shape, and a run of it end to end.

The GTEP paper's evaluation is a matrix of 15 algorithms over 8 scenario/pairing cells with R = 30 sets x S = 5
orderings per study plus each H*'s evaluation: 120 studies, 18,000 tuning units, 18,600 units in all. The
learners here cost nothing (benchmarks/paper_scale_learners.py: the paper's fifteen algorithms as `ps_<name>`,
answering with seeded accuracy matrices of the right number of tasks), so what is measured is gtep's own part:
the driver, the journal, the MLflow store, the reports and the UI.

The matrix: the fifteen learners x two scenarios (10 tasks; 6 tasks with half of the classes first, as Table 1)
x four pairings of synthetic 50-class phases (two splits of one pool: high similarity; two pairs of unrelated
pools: low), R = 30, S = 5, and one search space per learner (the paper's common values: lr, batch size, weight
decay, epochs, milestones, decay, scheduler). `--scale` shrinks R and S (and `--algorithms` and `--cells` the
product). `--write` writes it and checks it (`gtep matrix --check`: every cell resolved, nothing run):

    .venv/bin/python benchmarks/paper_scale.py --write runs/paper-scale            # the full matrix, checked

`--run FOLDER` rehearses it as a user would run it, and writes every figure to FOLDER/figures.json:

    bash tests/with-postgres.sh .venv/bin/python benchmarks/paper_scale.py --run runs/ps --scale 0.1 \
        --algorithms 3 --cells 2

1. a two-node Ray cluster on 127.0.0.1 (`ray start --head` and `ray start --address`, --cpus-per-node CPUs each)
   and `gtep server` on PostgreSQL (GTEP_TEST_POSTGRES_URI from tests/with-postgres.sh, or
   PAPER_SCALE_POSTGRES_URI; without one, sqlite, said), both stopped at the end whatever happens;
2. `gtep matrix --config ... --address 127.0.0.1:PORT --tracking-uri http://127.0.0.1:PORT --parallel-cells N`
   as a subprocess in its own process group, GTEP_PLUGINS/PYTHONPATH set for the driver and (through `ray
   start`) the workers; the driver's resident memory (VmRSS from /proc) sampled every second;
3. faults: the MLflow server restarted (down 5 s + its start) at --restart-server-at of the units, the driver's
   whole process group SIGKILLed at --kill-at of them, then the same command again (resume);
4. measured: slot time not spent in units, per unit = (slots x the time the cells ran - the units' own
   train_seconds) / units (slots = the cluster's CPUs), with the matrix's report and the faults' cost (a resume's
   start, the server's outage) apart; the store's rows by table and its size (SQL), the journal folders after
   compaction, `gtep report --matrix` under /usr/bin/time -v, and in headless Chromium
   the seconds until one study's runs table and the matrix's phase runs (compare-experiments view) show;
5. checked (`verdicts`): the driver's VmRSS grew less than 100 MiB from its first unit to its end, in each run
   (the matrix's report over the store included: a process of its own); every unit trained exactly
   once and none re-run by the resume (unit_trained events), one ordering run per unit and no duplicate run (by
   gtep.key, and by phase/level/set/ordering tags), every run finished, no write left in a journal, and --
   against the same matrix run again without faults into a sqlite store (skip with --no-reference) -- the same
   H* per cell and the same report tables (run ids and measured seconds left out, numbers to 9 digits).

tests/cluster/test_paper_scale.py runs a 64-unit version in the `cluster` group and asserts the verdicts.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import threading
import time
import urllib.parse
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import yaml
from paper_scale_learners import PROFILES  # a neighbour: this script's folder is first on sys.path

from gtep import testing
from gtep.testing import MlflowServer, RayCluster, gtep_command, kill_group

HERE = Path(__file__).resolve().parent

SPACE = {"lr": [0.001, 0.003, 0.01, 0.03, 0.05, 0.1, 0.2, 0.5], "batch_size": [16, 32, 64, 128, 256],
         "weight_decay": [0.0001, 0.0005, 0.001], "epochs": [30, 70, 120, 170], "milestone_num": [2, 3],
         "lr_decay": [0.1, 0.3], "scheduler": ["steplr", "cosine"]}
SCENARIOS = {"10tasks": {"tasks": 10}, "6tasks": {"tasks": 6, "first": "half"}}
PAIRINGS = {
    "split-a": {"similarity": "high", "datasets": {"split": {
        "dataset": "synthetic:classes=100,train=20,test=10,seed=11", "by": "class", "seed": 0,
        "classes_per_phase": 50}}},
    "split-b": {"similarity": "high", "datasets": {"split": {
        "dataset": "synthetic:classes=100,train=20,test=10,seed=12", "by": "class", "seed": 1,
        "classes_per_phase": 50}}},
    "a-to-b": {"similarity": "low", "datasets": {
        "tuning": {"dataset": "synthetic:classes=50,train=20,test=10,seed=21"},
        "evaluation": {"dataset": "synthetic:classes=50,train=20,test=10,seed=22"}}},
    "b-to-a": {"similarity": "low", "datasets": {
        "tuning": {"dataset": "synthetic:classes=50,train=20,test=10,seed=22"},
        "evaluation": {"dataset": "synthetic:classes=50,train=20,test=10,seed=21"}}},
}


def cells(count: int) -> tuple[dict, dict]:
    """The first `count` (scenario, pairing) cells of the 2 x 4, pairings first (as the matrix runs them)."""
    keys = [(s, p) for p in PAIRINGS for s in SCENARIOS][:count]
    return ({s: SCENARIOS[s] for s in dict.fromkeys(k[0] for k in keys)},
            {p: PAIRINGS[p] for p in dict.fromkeys(k[1] for k in keys)})


def matrix_document(folder: Path, scale: float = 1.0, algorithms: int = 15, cell_count: int = 8,
                    name: str = "paper-scale") -> dict:
    """The matrix file's content; writes each learner's search space into `folder`/spaces."""
    spaces = folder / "spaces"
    spaces.mkdir(parents=True, exist_ok=True)
    chosen = [f"ps_{n}" for n in list(PROFILES)[:algorithms]]
    for algorithm in chosen:
        (spaces / f"{algorithm}.yaml").write_text(yaml.safe_dump({"algorithm": algorithm, "space": SPACE}))
    scenarios, pairings = cells(cell_count)
    return {
        "matrix": name,
        "algorithms": chosen,
        "scenarios": scenarios,
        "pairings": pairings,
        "base": {"backbone": "resnet8", "search": {"trials": max(2, round(30 * scale)),
                                                   "orderings": max(2, round(5 * scale))},
                 "first_task": {"epochs": 200, "lr": 0.1, "milestones": [60, 120, 170], "batch_size": 128},
                 "training": {"memory_size": 0, "device": "cpu"},
                 "compute": {"cpus_per_trial": 1, "max_concurrent": 2},
                 "tracking": {"output": str(folder / "runs")}, "seed": 0},
        "algorithm_overrides": {a: {"search": {"space": str(spaces / f"{a}.yaml")}} for a in chosen},
        "protocol": "gtep",
    }


def plugin_environment() -> dict[str, str]:
    """The environment in which the driver and Ray's workers register the ps_ learners."""
    return testing.plugin_environment("paper_scale_learners", HERE)


def units(document: dict) -> tuple[int, int]:
    """(studies, units): each study's R x S tuning units and S evaluation units."""
    search = document["base"]["search"]
    studies = len(document["algorithms"]) * len(document["scenarios"]) * len(document["pairings"])
    return studies, studies * (search["trials"] + 1) * search["orderings"]


def write_matrix(folder: Path, scale: float, algorithms: int, cell_count: int) -> tuple[Path, dict]:
    document = matrix_document(folder, scale, algorithms, cell_count)
    path = folder / "paper-scale.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path, document


# ---- what is measured ---------------------------------------------------------------------------------------

def rss_kib(pid: int) -> int:
    """VmRSS of one process (KiB), 0 once it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


class MemorySampler(threading.Thread):
    """Every second: the driver's own VmRSS, and the largest single child (a cell driver) and the tree's sum."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid, self.done = pid, threading.Event()
        self.driver: list[tuple[float, int]] = []
        self.child_peak = self.tree_peak = 0
        self.units = 0  # units trained by this run so far, kept current by matrix_run
        self.by_units: list[tuple[int, int]] = []  # (units trained, driver VmRSS KiB) at each sample

    def run(self) -> None:
        start = time.monotonic()
        while not self.done.is_set():
            own = rss_kib(self.pid)
            if own:
                self.driver.append((round(time.monotonic() - start, 1), own))
                self.by_units.append((self.units, own))
                children = [rss_kib(p) for p in descendants(self.pid)]
                self.child_peak = max([self.child_peak, *children])
                self.tree_peak = max(self.tree_peak, own + sum(children))
            self.done.wait(1.0)

    def growth_check(self, after_units: int = 1) -> dict[str, Any]:
        """The driver's VmRSS once its first `after_units` units are trained (its imports, Ray's client and the
        cells' first phases are behind it by then), its peak from then until the process ended (the matrix's
        report over the whole store included: it runs as a process of its own), and the growth between them: a
        check (< 100 MiB)."""
        after = next((i for i, (n, _) in enumerate(self.by_units) if n >= after_units), None)
        if after is None:
            return {"after_units": after_units, "measured": False}
        start = self.by_units[after][1]
        peak = max(rss for _, rss in self.by_units[after:])
        return {"after_units": after_units, "units_at_end": self.by_units[-1][0], "measured": True,
                "rss_after_mib": round(start / 1024, 1), "rss_peak_after_mib": round(peak / 1024, 1),
                "rss_at_end_mib": round(self.by_units[-1][1] / 1024, 1),
                "growth_mib": round((peak - start) / 1024, 1), "growth_below_100_mib": peak - start < 100 * 1024}

    def figures(self, cells_done_s: float | None = None) -> dict[str, Any]:
        values = [v for _, v in self.driver] or [0]
        settled = values[min(len(values) - 1, 10):] or values  # after its first ten seconds (imports, Ray's client)
        running = [v for t, v in self.driver[10:] if cells_done_s is None or t <= cells_done_s] or settled
        return {"samples": len(self.driver), "driver_start_mib": round(values[0] / 1024, 1),
                "driver_growth_while_cells_ran_mib": round((max(running) - running[0]) / 1024, 1),
                "cells_done_s": cells_done_s,
                "driver_after_10s_mib": round(settled[0] / 1024, 1), "driver_peak_mib": round(max(values) / 1024, 1),
                "driver_end_mib": round(values[-1] / 1024, 1),
                "driver_growth_mib": round((max(settled) - settled[0]) / 1024, 1),
                "cell_driver_peak_mib": round(self.child_peak / 1024, 1),
                "tree_peak_mib": round(self.tree_peak / 1024, 1)}


class UnitEvents:
    """unit_trained / unit_reused events of every study folder of the matrix, read as they are appended."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.offsets: dict[Path, int] = {}
        self.trained: Counter = Counter()  # (study, phase, set, ordering) -> unit_trained events
        self.reused: Counter = Counter()

    def poll(self) -> int:
        for path in self.root.glob("*/events.jsonl"):
            with path.open("rb") as stream:
                stream.seek(self.offsets.get(path, 0))
                data = stream.read()
            complete = data[: data.rfind(b"\n") + 1]
            self.offsets[path] = self.offsets.get(path, 0) + len(complete)
            for line in complete.splitlines():
                event = json.loads(line)
                if event["event"] in ("unit_trained", "unit_reused"):
                    key = (path.parent.name, event["phase"], event.get("set_index"), event.get("ordering"))
                    (self.trained if event["event"] == "unit_trained" else self.reused)[key] += 1
        return len(self.trained)


def unit_seconds(root: Path) -> tuple[int, float]:
    """(unit files, the sum of their train_seconds): the units' own time, as the workers measured it."""
    files, seconds = 0, 0.0
    for path in root.glob("*/units/*/*.json"):
        files += 1
        seconds += float(json.loads(path.read_text()).get("train_seconds") or 0.0)
    return files, seconds


CELL_PARTS = {  # a cell's wall time, part by part in the order it passes; they add up to the cell's wall time
    "cell_start": "the cell's driver process: start, imports, Ray's client, the config (cell start -> phase_started)",
    "phase_setup": "a phase's start up to its first trial's worker process: Ray Tune's tuner, the first trial's "
                   "scheduling, and the wait for a free slot when cells share them (phase_started -> that "
                   "process's start; for runs older than trial_started, all of the phase's start)",
    "trial_process": "that worker process's own start: Python, Ray, torch and gtep imported, the trainable and the "
                     "phase's data unpickled (process start -> trial_started)",
    "trial_setup": "the first trial's setup up to its first unit (trial_started -> the phase's first unit_started)",
    "phase_units": "a phase's first unit's start -> its last unit's end (split below, in slot time)",
    "phase_tail": "a phase's last unit -> its trials done (Ray Tune's end of the phase)",
    "phase_writes": "the phase's MLflow writes drained (trials done -> phase_writes_done)",
    "phase_finish": "H*'s selection, the results files and the phase run closed (-> phase_finished)",
    "between_phases": "one phase's end -> the next phase's start",
    "cell_end": "the last phase's end -> the cell's end",
}
SLOT_PARTS = {  # phase_units in slot time (x the slots): what the trial processes did meanwhile
    "unit_train": "the units' own training (train_seconds)",
    "unit_other": "inside a unit but not training: the learner built, the data sliced, the unit file and checkpoint "
                  "written (unit_started -> unit_trained, less train_seconds)",
    "between_units": "between two units of one trial in one process: its report to Ray and the driver",
    "between_trials": "between a trial's last unit and the next trial's first in that process: Ray's scheduling "
                      "of the next trial and its setup",
    "slots_idle": "no unit in a slot: trial processes starting, or the phase's last sets running on fewer slots",
}


def overhead_breakdown(root: Path, slots: int) -> dict[str, Any]:
    """Where each cell's time went, from events.jsonl (the workers' unit events, the driver's phase events) and
    matrix.json (each cell's start and end): the cell's wall time part by part (CELL_PARTS, adding up to it), and
    the time its phases' units ran, in slot time, part by part (SLOT_PARTS); seconds summed over the cells and
    milliseconds per unit. Cells run side by side share the cluster's slots, so a cell's wall time is what it
    waited through, not what it cost the cluster. Cells whose driver wrote no phase events (older runs) count in
    the slot parts only."""
    cells = json.loads((root / "matrix.json").read_text())["cells"]
    wall: Counter = Counter()
    slot: Counter = Counter()
    units = timed_cells = 0
    for name, cell in cells.items():
        path = root / name / "events.jsonl"
        if not path.exists() or not cell.get("finished_at"):
            continue
        events = sorted((json.loads(line) for line in path.read_text().splitlines() if line.strip()),
                        key=lambda e: e["time"])
        events = [e for e in events if e["time"] >= cell["started_at"] - 1]  # this run's (a resumed cell's last)
        started: dict[tuple, dict] = {}
        spans: dict[int, list[tuple]] = {}
        marks: dict[tuple[str, str], float] = {}
        first_trial: dict[str, dict] = {}
        for e in events:
            key = (e["phase"], e.get("set_index"), e.get("ordering"))
            if e["event"] == "trial_started":
                first_trial.setdefault(e["phase"], e)
            elif e["event"] == "unit_started":
                started[key] = e
            elif e["event"] == "unit_trained" and key in started:
                begin = started.pop(key)
                units += 1
                slot["unit_train"] += e.get("train_seconds") or 0.0
                slot["unit_other"] += e["time"] - begin["time"] - (e.get("train_seconds") or 0.0)
                spans.setdefault(e["pid"], []).append((begin["time"], e["time"], e["phase"], e.get("set_index")))
            elif e["event"].startswith("phase_"):
                marks[(e["phase"], e["event"])] = e["time"]
        by_phase: dict[str, list[float]] = {}
        for process in spans.values():
            process.sort()
            for (_, end, phase, index), (begin, _, phase2, index2) in zip(process, process[1:]):
                if phase == phase2:
                    slot["between_units" if index == index2 else "between_trials"] += begin - end
            for begin, end, phase, _ in process:
                by_phase.setdefault(phase, []).extend((begin, end))
        for phase, times in by_phase.items():
            slot["phase_units"] += slots * (max(times) - min(times))
        order = sorted(by_phase, key=lambda p: min(by_phase[p]))
        names = ("phase_started", "phase_trials_done", "phase_writes_done", "phase_finished")
        if not order or any((phase, n) not in marks for phase in order for n in names):
            continue
        timed_cells += 1
        previous = cell["started_at"]
        for i, phase in enumerate(order):
            begun, done, drained, ended = (marks[(phase, n)] for n in names)
            first, last = min(by_phase[phase]), max(by_phase[phase])
            wall["cell_start" if i == 0 else "between_phases"] += begun - previous
            trial = first_trial.get(phase)
            if trial is None or not begun <= trial["time"] <= first:  # no trial events: the whole start
                wall["phase_setup"] += first - begun
            else:
                process = min(max(trial.get("process_started") or trial["time"], begun), trial["time"])
                wall["phase_setup"] += process - begun
                wall["trial_process"] += trial["time"] - process
                wall["trial_setup"] += first - trial["time"]
            wall["phase_units"] += last - first
            wall["phase_tail"] += done - last
            wall["phase_writes"] += drained - done
            wall["phase_finish"] += ended - drained
            previous = ended
        wall["cell_end"] += cell["finished_at"] - previous
        wall["cell_wall"] += cell["finished_at"] - cell["started_at"]
    slot["slots_idle"] = slot.pop("phase_units", 0.0) - sum(slot[k] for k in SLOT_PARTS if k != "slots_idle")
    per_unit = max(units, 1)

    def shown(counter: Counter, names: dict[str, str]) -> dict[str, dict[str, float]]:
        return {n: {"s": round(counter[n], 1), "ms_per_unit": round(1000 * counter[n] / per_unit, 1)} for n in names}

    cell_parts = shown(wall, CELL_PARTS)
    overhead = {n: v for n, v in cell_parts.items() if n != "phase_units"}
    return {"units": units, "cells_with_phase_events": timed_cells, "cells_wall_s": round(wall["cell_wall"], 1),
            "slots": slots, "cell_parts": cell_parts, "slot_parts": shown(slot, SLOT_PARTS),
            "largest_cell_part": max(overhead, key=lambda n: overhead[n]["s"]) if timed_cells else None}


def sql_engine(uri: str):
    import sqlalchemy

    if uri.startswith("postgresql://"):
        uri = "postgresql+psycopg://" + uri[len("postgresql://"):]
    return sqlalchemy.create_engine(uri)


def own_database(uri: str) -> str:
    """A new, empty database beside the one `uri` names, on the same PostgreSQL server: the figures count every
    run of the store, so the rehearsal must not share it with the other tests of tests/with-postgres.sh."""
    import sqlalchemy

    base, _, _ = uri.rpartition("/")
    name = f"paper_scale_{os.getpid()}_{int(time.time())}"
    engine = sql_engine(uri).execution_options(isolation_level="AUTOCOMMIT")
    with engine.connect() as db:
        db.execute(sqlalchemy.text(f'CREATE DATABASE "{name}"'))
    engine.dispose()
    return f"{base}/{name}"


def store_figures(backend: str) -> dict[str, Any]:
    """Rows of the MLflow backend store by table, its size, and the runs by level and status, by SQL."""
    from sqlalchemy import text

    engine = sql_engine(backend)
    out: dict[str, Any] = {"backend": backend.split("@")[-1] if backend.startswith("postgres") else backend}
    with engine.connect() as db:
        out["rows"] = {table: db.execute(text(f"SELECT COUNT(*) FROM {table}")).scalar()
                       for table in ("experiments", "runs", "metrics", "latest_metrics", "params", "tags")}
        if backend.startswith("postgres"):
            out["bytes"] = db.execute(text("SELECT pg_database_size(current_database())")).scalar()
        else:
            path = Path(backend[len("sqlite:///"):])
            out["bytes"] = sum(p.stat().st_size for p in path.parent.glob(path.name + "*"))
        rows = db.execute(text(
            "SELECT r.run_uuid, r.experiment_id, r.status, t.key, t.value FROM runs r JOIN tags t "
            "ON t.run_uuid = r.run_uuid WHERE r.lifecycle_stage = 'active' AND t.key IN "
            "('gtep.key', 'gtep.level', 'gtep.phase', 'gtep.set_index', 'gtep.ordering', 'gtep.matrix')")).all()
        # a metric point logged twice (same run, key and step, another timestamp): a history the report reads twice
        out["metric_points_logged_twice"] = db.execute(text(
            "SELECT COALESCE(SUM(n - 1), 0) FROM (SELECT COUNT(*) AS n FROM metrics "
            "GROUP BY run_uuid, key, step HAVING COUNT(*) > 1) AS twice")).scalar()
        # an ordering that diverged ends its run FAILED with metric diverged = 1, by design
        diverged = {run for (run,) in db.execute(text(
            "SELECT run_uuid FROM latest_metrics WHERE key = 'diverged' AND value = 1"))}
        out["metric_keys_logged_twice"] = dict(db.execute(text(
            "SELECT key, COUNT(*) FROM (SELECT run_uuid, key FROM metrics GROUP BY run_uuid, key, step "
            "HAVING COUNT(*) > 1) AS twice GROUP BY key")).all())
    engine.dispose()
    runs: dict[str, dict[str, str]] = {}
    for run_id, experiment, status, key, value in rows:
        runs.setdefault(run_id, {"experiment": str(experiment), "status": status})[key] = value
    gtep_runs = [r for r in runs.values() if "gtep.key" in r]
    by_key = Counter((r["experiment"], r["gtep.key"]) for r in gtep_runs)
    by_tags = Counter((r["experiment"], r.get("gtep.phase"), r.get("gtep.level"), r.get("gtep.set_index"),
                       r.get("gtep.ordering")) for r in gtep_runs if r.get("gtep.level") in ("trial", "ordering"))
    out["runs_by_level"] = dict(Counter(r.get("gtep.level", "?") for r in gtep_runs))
    out["runs_failed_as_diverged"] = sum(r["status"] == "FAILED" and run in diverged for run, r in runs.items()
                                         if "gtep.key" in r)
    out["runs_not_finished"] = sum(r["status"] != "FINISHED" for r in gtep_runs) - out["runs_failed_as_diverged"]
    out["duplicate_runs_by_key"] = sum(n - 1 for n in by_key.values() if n > 1)
    out["duplicate_runs_by_tags"] = sum(n - 1 for n in by_tags.values() if n > 1)
    return out


def journal_figures(root: Path) -> dict[str, Any]:
    """Each study's tracking folder (journal.jsonl, state.json, artifact snapshots) after its last compaction."""
    journals, folders, pending = [], [], 0
    for study in sorted(p for p in root.iterdir() if (p / "tracking").is_dir()):
        folder = study / "tracking"
        folders.append(sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()))
        journal = folder / "journal.jsonl"
        journals.append(journal.stat().st_size if journal.exists() else 0)
        state = json.loads((folder / "state.json").read_text()) if (folder / "state.json").exists() else {}
        if journal.exists():
            pending += sum(1 for line in journal.read_text().splitlines()
                           if line.strip() and json.loads(line)["seq"] > state.get("applied", 0))
    return {"studies": len(folders), "journal_bytes_total": sum(journals),
            "journal_bytes_max": max(journals, default=0),
            "tracking_folder_bytes_total": sum(folders), "tracking_folder_bytes_max": max(folders, default=0),
            "pending_writes": pending}


def timed_report(tracking_uri: str, out: Path, env: dict[str, str], log: Path,
                 threads: int | None = None, log_run: bool = False) -> dict[str, Any]:
    """`gtep report --matrix paper-scale` over the whole store under /usr/bin/time -v: wall time, peak RSS and the
    seconds of each stage as the report's last line says them."""
    command = gtep_command("report", "--matrix", "paper-scale", "--tracking-uri", tracking_uri, "--out", str(out),
                           "--format", "csv", "--format", "md", *([] if log_run else ["--no-log"]))
    if Path("/usr/bin/time").exists():
        command = ["/usr/bin/time", "-v", *command]
    start = time.perf_counter()
    extra = {"GTEP_REPORT_THREADS": str(threads)} if threads else {}
    done = subprocess.run(command, env={**env, "COLUMNS": "200", **extra}, capture_output=True, text=True)
    wall = time.perf_counter() - start
    log.write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        raise RuntimeError(f"gtep report failed ({log}):\n{(done.stdout + done.stderr)[-3000:]}")
    peak = re.search(r"Maximum resident set size \(kbytes\): (\d+)", done.stderr)
    return {"seconds": round(wall, 2), "peak_rss_mib": round(int(peak.group(1)) / 1024, 1) if peak else None,
            "stages_s": report_stages(done.stdout + done.stderr), "files": sorted(p.name for p in out.iterdir())}


def report_stages(output: str) -> dict[str, float]:
    """{stage: seconds} from the report's last progress line: 'report: done in 21.0 s (read 9.1 s, ...)'."""
    found = re.search(r"^report: done in [\d.]+ s \((.*)\)$", output, re.MULTILINE)
    if not found:
        return {}
    return {name: float(seconds) for name, seconds in re.findall(r"(\w+) ([\d.]+) s", found.group(1))}


VARYING_COLUMNS = ("run_id", "compute_seconds", "compute_ratio", "train_seconds")  # ids and measured times


def report_tables(folder: Path) -> dict[str, list[tuple[str, ...]]]:
    """The report's CSV tables, for comparing two reports of the same matrix: without the columns that differ
    between two runs of it whatever happens (MLflow run ids, the seconds measured), rows sorted (the order the
    runs were found in is not the matrix's)."""
    import csv

    tables = {}
    for path in sorted(folder.glob("*.csv")):
        with path.open(newline="") as stream:
            rows = list(csv.reader(stream))
        if not rows:
            tables[path.name] = []
            continue
        keep = [i for i, name in enumerate(rows[0]) if name not in VARYING_COLUMNS and not name.endswith("_seconds")]
        tables[path.name] = [tuple(rows[0][i] for i in keep),
                             *sorted(tuple(significant(row[i]) for i in keep) for row in rows[1:])]
    return tables


def significant(value: str) -> str:
    """A number to 9 significant digits (a mean summed in another order differs in its last bits), else as is."""
    try:
        return f"{float(value):.9g}"
    except ValueError:
        return value


def best_sets(root: Path) -> dict[str, dict[str, Any]]:
    out = {}
    for best in sorted(root.glob("*/best.yaml")):
        data = yaml.safe_load(best.read_text())
        out[best.parent.name] = {"set_index": data.get("set_index"), "hparams": data.get("hparams"),
                                 "score": data.get("score")}
    return out


def chromium(profile: Path):
    """Headless Chromium at 1920x1080 with a profile of its own (the UI figures' browser)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--window-size=1920,1080", f"--user-data-dir={profile}"):
        options.add_argument(flag)
    return webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)


def ui_figures(server_uri: str, root: Path, profile: Path, timeout: float = 180) -> dict[str, Any]:
    """Seconds from opening the page to the data shown, in headless Chromium: one study's runs table (its phase
    runs with their hmean), and the matrix's phase runs over all its studies (MLflow's compare-experiments view)."""
    from mlflow.tracking import MlflowClient
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    from gtep.orchestration.tracking import prepare_ui, ui_routes

    client = MlflowClient(tracking_uri=server_uri)
    studies = dict(prepare_ui(server_uri))
    cells = sorted(p.name for p in root.glob("*/best.yaml") for p in [p.parent])
    study = cells[0]
    experiment = studies[study]
    phases = client.search_runs([experiment], "tags.`gtep.level` = 'phase'")
    wanted = {f"{r.data.metrics['hmean']:.4f}".rstrip("0").rstrip(".") for r in phases}
    ids = [studies[c] for c in cells if c in studies]
    driver = chromium(profile)
    figures: dict[str, Any] = {"study": study, "study_phase_runs": len(phases), "matrix_experiments": len(ids)}

    def shown(url: str, predicate: Callable[[list[str]], bool]) -> float:
        start = time.perf_counter()
        driver.get(url)
        WebDriverWait(driver, timeout, poll_frequency=0.1).until(
            lambda d: predicate(d.find_element(By.TAG_NAME, "body").text.split("\n")))
        return round(time.perf_counter() - start, 2)

    try:
        driver.get(f"{server_uri}/")  # the app's bundle, once: what is timed below is the data, not the JS download
        WebDriverWait(driver, timeout).until(lambda d: d.find_element(By.TAG_NAME, "body").text.strip())
        figures["study_runs_table_s"] = shown(f"{server_uri}/{ui_routes(experiment)['runs']}",
                                              lambda lines: wanted <= set(lines) and "evaluate" in lines)
        driver.save_screenshot(str(profile.parent / "ui-study-runs.png"))
        search = urllib.parse.quote("tags.`gtep.level` = 'phase'")
        url = (f"{server_uri}/#/compare-experiments/s?experiments={urllib.parse.quote(json.dumps(ids))}"
               f"&searchFilter={search}&workflowType=machine_learning")
        matrix_phases = client.search_runs(ids, "tags.`gtep.level` = 'phase'", max_results=5000)
        figures["matrix_phase_runs"] = len(matrix_phases)
        expected = min(len(matrix_phases), 20)  # runs named tune / evaluate; the first rows of the table's first page
        figures["matrix_phase_runs_s"] = shown(url, lambda lines: any(x.endswith("matching runs") for x in lines)
                                               and sum(x in ("tune", "evaluate") for x in lines) >= expected)
        driver.save_screenshot(str(profile.parent / "ui-matrix-phase-runs.png"))
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)
    return figures


def ui_report_rows(server_uri: str, profile: Path, timeout: float = 180) -> dict[str, Any]:
    """Seconds from opening the page to the data shown, in headless Chromium: the newest report's run in
    gtep/reports, and the matrix's phases as one experiment's runs table (their phase rows, top-level runs in
    gtep/reports tagged gtep.level=phase_row and gtep.matrix: the filter the report run's description gives), the
    view a paper-scale matrix is compared in (MLflow's compare-experiments view asks N^2 requests over N studies).
    """
    from mlflow.tracking import MlflowClient
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    client = MlflowClient(tracking_uri=server_uri)
    experiment = client.get_experiment_by_name("gtep/reports")
    report = client.search_runs([experiment.experiment_id], "tags.`gtep.level` = 'report'", max_results=1,
                                order_by=["attributes.start_time DESC"])[0]
    where = "tags.`gtep.level` = 'phase_row' and tags.`gtep.matrix` = 'paper-scale'"
    rows = client.search_runs([experiment.experiment_id], where, max_results=50000)
    names = {r.info.run_name for r in rows}
    driver = chromium(profile)
    figures: dict[str, Any] = {"report_rows": len(rows)}

    def lines() -> set[str]:
        return set(driver.find_element(By.TAG_NAME, "body").text.split("\n"))

    def shown(search: str, ready: Callable[[set[str]], bool]) -> float:
        url = (f"{server_uri}/#/experiments/{experiment.experiment_id}/runs?searchFilter="
               f"{urllib.parse.quote(search)}&workflowType=machine_learning")
        start = time.perf_counter()
        driver.get(url)
        WebDriverWait(driver, timeout, poll_frequency=0.1).until(lambda d: ready(lines()))
        return round(time.perf_counter() - start, 2)

    try:
        driver.get(f"{server_uri}/")  # the app's bundle, once: what is timed below is the data, not the JS download
        WebDriverWait(driver, timeout).until(lambda d: d.find_element(By.TAG_NAME, "body").text.strip())
        figures["report_run_shown_s"] = shown("tags.`gtep.level` = 'report'",
                                              lambda seen: report.info.run_name in seen)
        wanted = min(len(names), 10)  # the first rows, named "<study> <phase>"
        tries = []
        for _ in range(3):  # the median of three visits, each from the report's view (what a person clicks)
            shown("tags.`gtep.level` = 'report'", lambda seen: report.info.run_name in seen)
            tries.append(shown(where, lambda seen: len(names & seen) >= wanted
                               and any(x.endswith("matching runs") for x in seen)))
        figures["report_rows_tries_s"] = tries
        figures["report_rows_s"] = sorted(tries)[1]
        driver.save_screenshot(str(profile.parent / "ui-report-rows.png"))
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)
    return figures


def measure_sizes(folder: Path, sizes: list[int], template: Path | None, ui: bool = True) -> dict[str, Any]:
    """The report and the UI at each size of store: a store written straight into MLflow's tables
    (paper_scale_store.py, copies of a real run's studies), `gtep server` over it, `gtep report --matrix` twice
    (the second into the same folder: figures reused), and the matrix's phases as one experiment's runs table in
    Chromium. How each grows with the units is the point: the ratios to the smallest size are in `growth`."""
    from paper_scale_store import studies_for, synthesize

    folder = folder.resolve()
    folder.mkdir(parents=True, exist_ok=True)
    env = plugin_environment()
    template_given = template is not None
    if template is None:  # a small real run of the paper's shape: 4 studies, R = 30, S = 5, into sqlite
        saved = {k: os.environ.pop(k) for k in ("GTEP_TEST_POSTGRES_URI", "PAPER_SCALE_POSTGRES_URI")
                 if k in os.environ}
        try:
            rehearse(Options(folder / "template", algorithms=2, cells=2, kill_at=None, restart_server_at=None,
                             reference=False, ui=False, report_sequential=False))
        finally:
            os.environ.update(saved)
        template = folder / "template" / "server" / "mlflow.db"
    postgres = os.environ.get("GTEP_TEST_POSTGRES_URI") or os.environ.get("PAPER_SCALE_POSTGRES_URI")
    given = " --template TEMPLATE" if template_given else ""  # the stored figures say what made them, no paths
    out: dict[str, Any] = {"command": "bash tests/with-postgres.sh .venv/bin/python benchmarks/paper_scale.py "
                                      f"--sizes FOLDER --units {' '.join(map(str, sizes))}{given}",
                           "store": "postgresql" if postgres else "sqlite", "template": template.name,
                           "machine": {"cpus": os.cpu_count(), "load_average_at_start": os.getloadavg()},
                           "sizes": {}}
    for units in sizes:
        where = folder / f"units-{units}"
        shutil.rmtree(where, ignore_errors=True)
        where.mkdir(parents=True)
        backend = own_database(postgres) if postgres else f"sqlite:///{where / 'mlflow.db'}"
        made = synthesize(template, backend, units, artifacts=where / "artifacts")
        print(f"{units} units: {made['studies']} studies written in {made['seconds']} s", flush=True)
        server = MlflowServer(where, backend, artifacts=where / "artifacts", env=env, workers=2)
        size: dict[str, Any] = {"studies": made["studies"], "units": made["units"], "groups": made["groups"],
                                "runs": made["rows"].get("runs")}
        try:
            server.start()
            size["report"] = timed_report(server.uri, where / "report", env, where / "report.log", log_run=True)
            size["report_again"] = timed_report(server.uri, where / "report", env, where / "report-again.log")
            if ui:
                try:
                    size["ui"] = ui_report_rows(server.uri, where / "chromium-profile")
                except Exception as err:  # noqa: BLE001 - a figure not measured is said
                    size["ui"] = {"error": f"{err.__class__.__name__}: {str(err)[:500]}"}
            size["store_bytes"] = store_figures(backend)["bytes"]
        finally:
            server.stop()
        for report in (size["report"], size["report_again"]):
            report.pop("files", None)
        out["sizes"][str(made["units"])] = size
        print(json.dumps(size), flush=True)
    base = out["sizes"][min(out["sizes"], key=int)]
    out["growth"] = {units: {"units": round(size["units"] / base["units"], 2),
                             "report_s": round(size["report"]["seconds"] / base["report"]["seconds"], 2),
                             "report_peak_rss": round(size["report"]["peak_rss_mib"] / base["report"]["peak_rss_mib"],
                                                      2)}
                     for units, size in out["sizes"].items()}
    out["machine"]["load_average_at_end"] = os.getloadavg()
    assert studies_for(max(sizes)) >= 1
    (folder / "sizes.json").write_text(json.dumps(out, indent=1))
    return out


def sizes_markdown(figures: dict[str, Any]) -> str:
    """The --sizes figures as docs/benchmarks.md shows them (tests/benchmarks/test_paper_scale_sizes.py keeps the
    two equal)."""
    rows = ["| units (studies) | runs | store | `gtep report --matrix` | again (figures reused) | read / summarise / "
            "figures / log | peak memory | UI: report run / the matrix's phase rows |",
            "|---|---|---|---|---|---|---|---|"]
    for units, size in sorted(figures["sizes"].items(), key=lambda item: int(item[0])):
        first, again, ui = size["report"], size["report_again"], size.get("ui", {})
        stages = first.get("stages_s", {})
        parts = " / ".join(f"{stages.get(name, 0.0):.1f}" for name in ("read", "summarise", "figures", "log"))
        shown = (f"{ui['report_run_shown_s']:.2f} s / {ui['report_rows_s']:.2f} s ({ui['report_rows']} rows)"
                 if "report_rows_s" in ui else "not measured")
        rows.append(f"| {int(units):,} ({size['studies']}) | {size['runs']:,} | {size['store_bytes'] / 1e6:,.0f} MB | "
                    f"{first['seconds']:.1f} s | {again['seconds']:.1f} s | {parts} s | "
                    f"{first['peak_rss_mib']:,.0f} MiB | {shown} |")
    return "\n".join(rows)


# ---- the rehearsal ------------------------------------------------------------------------------------------

@dataclass
class Options:
    folder: Path
    scale: float = 1.0
    algorithms: int = 15
    cells: int = 8
    parallel_cells: int = 2
    cpus_per_node: int = 1
    kill_at: float | None = 0.5  # fraction of the units trained when the driver is killed (None: no kill)
    restart_server_at: float | None = 0.25  # fraction of the units trained when the server is restarted
    reference: bool = True  # run the same matrix again, uninterrupted, into a sqlite store, and compare
    ui: bool = True
    server_workers: int = 2
    report_sequential: bool = True  # time the report a second time, reading the metric histories one by one


def matrix_run(command: list[str], env: dict[str, str], log: Path, events: UnitEvents, expected: int,
               kill_at: float | None = None, restart_at: float | None = None,
               server: MlflowServer | None = None) -> dict[str, Any]:
    """The matrix command as a subprocess in its own process group, its memory sampled every second; SIGKILL to the
    group once `kill_at` of the units are trained, an MLflow server restart at `restart_at`."""
    start = time.perf_counter()
    process = subprocess.Popen(command, env={**env, "COLUMNS": "160"}, stdout=log.open("w"), stderr=subprocess.STDOUT,
                               start_new_session=True)
    sampler = MemorySampler(process.pid)
    sampler.start()
    out: dict[str, Any] = {"units_before": events.poll()}
    cells_done: float | None = None
    first_unit: float | None = None  # seconds to this run's first unit: its drivers' start (a resume's cost)
    restarter: threading.Thread | None = None
    state = events.root / "matrix.json"
    try:
        while process.poll() is None:
            trained = events.poll()
            sampler.units = trained - out["units_before"]
            if first_unit is None and sampler.units > 0:
                first_unit = time.perf_counter() - start
            if cells_done is None and trained >= expected and state.exists():
                with contextlib.suppress(ValueError):  # the driver replaces it atomically; a torn read is retried
                    if all(c.get("status") in ("finished", "failed")
                           for c in json.loads(state.read_text())["cells"].values()):
                        cells_done = time.perf_counter() - start  # what follows is the report over the matrix
            if restart_at is not None and server is not None and restarter is None and trained >= restart_at * expected:
                out["server_restart"] = {"at_units": trained}
                restarter = threading.Thread(target=restart, args=(server, out["server_restart"]), daemon=True)
                restarter.start()
            if kill_at is not None and trained >= kill_at * expected:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
                out["killed_at_units"] = trained
                break
            time.sleep(0.25)
    finally:
        if restarter is not None:
            restarter.join()  # the server is back before anything reads the store
        sampler.done.set()
        sampler.join()
        if process.poll() is None:
            kill_group(process)
    done_s = None if cells_done is None else round(cells_done, 1)
    out.update(returncode=process.returncode, wall_s=round(time.perf_counter() - start, 1),
               units_after=events.poll(), memory=sampler.figures(done_s), memory_check=sampler.growth_check(),
               cells_done_s=done_s, first_unit_s=None if first_unit is None else round(first_unit, 1))
    if "killed_at_units" not in out and process.returncode != 0:
        print(f"{' '.join(command[2:5])} exited {process.returncode} ({log}):\n{log.read_text()[-2000:]}", flush=True)
    return out


def restart(server: MlflowServer, record: dict[str, Any]) -> None:
    """The MLflow server stopped, left down 5 s, started again on the same port and store."""
    down = time.perf_counter()
    server.stop()
    time.sleep(5)
    try:
        server.start()
    except Exception as err:  # noqa: BLE001 - said in the figures; the verdicts then fail
        record["error"] = f"{err.__class__.__name__}: {str(err)[:300]}"
    record["down_s"] = round(time.perf_counter() - down, 1)


def overhead(runs: list[dict[str, Any]], own: float, units_run: int, slots: int,
             server_down_s: float = 0.0) -> dict[str, Any]:
    """Slot time not spent in units, per unit: (slots x the time the cells ran - the units' own seconds) / units,
    with what is not the cells' work apart: the matrix's report after its cells (`report_s`), and the faults'
    cost (`faults_s`: a resumed run's drivers starting again until its first unit, and the server's outage,
    during which units go on training and their writes wait in the journal). `slot_time_lost_per_unit_ms` counts
    the cells' time without both; `..._with_faults_ms` with the faults. It is wall time on the cluster's slots,
    not the controller's CPU: benchmarks/cluster_sim.py measures that (driver CPU seconds per unit)."""
    wall = sum(r["wall_s"] for r in runs)
    report = sum(r["wall_s"] - r["cells_done_s"] for r in runs if r.get("cells_done_s") is not None)
    resume = sum(r.get("first_unit_s") or 0.0 for r in runs[1:])
    cells = wall - report
    per_unit = max(units_run, 1)

    def lost(seconds: float) -> float:
        return round(1000 * (slots * seconds - own) / per_unit, 1)

    return {"wall_s": round(wall, 1), "report_s": round(report, 1),
            "faults_s": {"resume_start_s": round(resume, 1), "server_down_s": round(server_down_s, 1)},
            "cells_s": round(cells, 1), "unit_seconds_sum": round(own, 1), "slots": slots, "units": units_run,
            "slot_time_lost_per_unit_ms": lost(cells - resume),
            "slot_time_lost_per_unit_with_faults_ms": lost(cells),
            "slot_busy_share": round(own / (slots * max(cells - resume, 1e-9)), 3)}


def rehearse(opt: Options) -> dict[str, Any]:
    folder = opt.folder.resolve()
    folder.mkdir(parents=True, exist_ok=True)
    path, document = write_matrix(folder, opt.scale, opt.algorithms, opt.cells)
    studies, expected = units(document)
    env = plugin_environment()
    postgres = os.environ.get("GTEP_TEST_POSTGRES_URI") or os.environ.get("PAPER_SCALE_POSTGRES_URI")
    backend = own_database(postgres) if postgres else f"sqlite:///{folder / 'server' / 'mlflow.db'}"
    if not postgres:
        print("no PostgreSQL (run under `bash tests/with-postgres.sh`): the MLflow server uses sqlite", flush=True)
    (folder / "server").mkdir(exist_ok=True)
    root = folder / "runs" / "paper-scale"
    figures: dict[str, Any] = {
        "matrix": {"studies": studies, "units": expected, "algorithms": opt.algorithms, "cells": opt.cells,
                   "R": document["base"]["search"]["trials"], "S": document["base"]["search"]["orderings"],
                   "parallel_cells": opt.parallel_cells, "ray_nodes": 2, "cpus_per_node": opt.cpus_per_node,
                   "store": "postgresql" if postgres else "sqlite (no PostgreSQL given)"},
        "machine": {"cpus": os.cpu_count(), "load_average_at_start": os.getloadavg()}}
    print(f"{path}: {studies} studies, {expected} units; Ray: 2 nodes x {opt.cpus_per_node} CPU; "
          f"MLflow store {figures['matrix']['store']}", flush=True)
    cluster = RayCluster(opt.cpus_per_node, env=env)
    server = MlflowServer(folder / "server", backend, artifacts=folder / "server" / "artifacts", env=env,
                          workers=opt.server_workers)
    try:
        started = time.perf_counter()
        cluster.start()
        server.start()
        figures["startup_s"] = round(time.perf_counter() - started, 1)
        command = gtep_command("matrix", "--config", str(path), "--address", cluster.address, "--tracking-uri",
                               server.uri, "--parallel-cells", str(opt.parallel_cells))
        events = UnitEvents(root) if root.exists() else None
        root.mkdir(parents=True, exist_ok=True)
        events = events or UnitEvents(root)
        first = matrix_run(command, env, folder / "matrix-1.log", events, expected, opt.kill_at,
                           opt.restart_server_at, server)
        figures["first_run"] = first
        runs = [first]
        if "killed_at_units" in first:
            time.sleep(3)  # what the killed drivers' trials finish on the workers lands before the resume
            trained_before = dict(events.trained)
            resumed = matrix_run(command, env, folder / "matrix-2.log", events, expected)
            figures["resumed_run"] = resumed
            runs.append(resumed)
            rerun = {k: n for k, n in events.trained.items() if k in trained_before and n > trained_before[k]}
            figures["resume"] = {"units_trained_before_kill": len(trained_before),
                                 "units_trained_by_resume": len(events.trained) - len(trained_before),
                                 "finished_units_rerun": len(rerun), "units_reused": sum(events.reused.values())}
        files, own = unit_seconds(root)
        down = float(first.get("server_restart", {}).get("down_s") or 0.0)
        figures["time"] = overhead(runs, own, files, 2 * opt.cpus_per_node, down)
        figures["time"]["breakdown"] = overhead_breakdown(root, 2 * opt.cpus_per_node)
        figures["units"] = {"expected": expected, "unit_files": files, "trained_once": len(events.trained),
                            "trained_more_than_once": sum(n > 1 for n in events.trained.values())}
        figures["memory"] = {f"run_{i + 1}": r["memory"] for i, r in enumerate(runs)}
        figures["memory_check"] = {f"run_{i + 1}": r["memory_check"] for i, r in enumerate(runs)}
        state = json.loads((root / "matrix.json").read_text())["cells"]
        figures["cells"] = dict(Counter(c["status"] for c in state.values()))
        figures["journal"] = journal_figures(root)
        figures["store"] = store_figures(backend)
        figures["report"] = timed_report(server.uri, folder / "report", env, folder / "report.log")
        if opt.report_sequential:  # the metric histories one request at a time, as before issue 34
            figures["report_one_history_at_a_time"] = timed_report(
                server.uri, folder / "report-sequential", env, folder / "report-sequential.log", threads=1)
        if opt.ui:
            try:
                figures["ui"] = ui_figures(server.uri, root, folder / "chromium-profile")
            except Exception as err:  # noqa: BLE001 - a figure not measured is said, the rehearsal goes on
                figures["ui"] = {"error": f"{err.__class__.__name__}: {str(err)[:500]}"}
        if opt.reference:
            ref_output = folder / "reference"
            ref_root = ref_output / "paper-scale"
            ref_root.mkdir(parents=True, exist_ok=True)
            ref_events = UnitEvents(ref_root)
            reference = matrix_run(gtep_command("matrix", "--config", str(path), "--address", cluster.address,
                                                "--output", str(ref_output), "--parallel-cells",
                                                str(opt.parallel_cells)),
                                   env, folder / "reference.log", ref_events, expected)
            ref_files, ref_own = unit_seconds(ref_root)
            ref_report = timed_report(f"sqlite:///{ref_root / 'mlflow.db'}", folder / "reference-report", env,
                                      folder / "reference-report.log")
            ours, theirs = best_sets(root), best_sets(ref_root)
            tables, ref_tables = report_tables(folder / "report"), report_tables(folder / "reference-report")
            figures["reference"] = {
                "time": overhead([reference], ref_own, ref_files, 2 * opt.cpus_per_node),
                "memory": reference["memory"], "store": store_figures(f"sqlite:///{ref_root / 'mlflow.db'}"),
                "report": ref_report,
                "cells_compared": len(theirs), "cells_with_other_best_set": sorted(
                    c for c in theirs if ours.get(c) != theirs[c]),
                "report_files_compared": sorted(ref_tables),
                "report_files_differing": sorted(n for n in ref_tables if tables.get(n) != ref_tables[n])}
    finally:
        server.stop()
        cluster.stop()
    figures["machine"]["load_average_at_end"] = os.getloadavg()
    (folder / "figures.json").write_text(json.dumps(figures, indent=1, default=str))
    return figures


def verdicts(figures: dict[str, Any]) -> dict[str, bool]:
    """The invariants a rehearsal must hold (the cluster test asserts them)."""
    store, units_ = figures["store"], figures["units"]
    last = figures.get("resumed_run", figures["first_run"])
    out = {"the matrix command exited 0": last["returncode"] == 0,
           "every cell finished": figures["cells"] == {"finished": figures["matrix"]["studies"]},
           "every unit trained exactly once": units_["trained_once"] == units_["expected"]
           and units_["trained_more_than_once"] == 0,
           "one ordering run per unit": store["runs_by_level"].get("ordering") == units_["expected"],
           "no duplicate MLflow run": store["duplicate_runs_by_key"] == 0 and store["duplicate_runs_by_tags"] == 0,
           "every run finished (or failed as diverged)": store["runs_not_finished"] == 0,
           "no write left in a journal": figures["journal"]["pending_writes"] == 0,
           "the driver's memory grew < 100 MiB from its first unit to its end (report included), in every run": all(
               c["measured"] and c["growth_below_100_mib"] for c in figures["memory_check"].values())}
    if "resume" in figures:
        out["no finished unit re-run"] = figures["resume"]["finished_units_rerun"] == 0
    if "reference" in figures:
        out["same H* as the uninterrupted run"] = not figures["reference"]["cells_with_other_best_set"]
        out["same report as the uninterrupted run"] = not figures["reference"]["report_files_differing"] \
            and bool(figures["reference"]["report_files_compared"])
    return out


def print_table(figures: dict[str, Any]) -> None:
    rows: list[tuple[str, str]] = []

    def flat(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                flat(f"{prefix}.{k}" if prefix else str(k), v)
        else:
            rows.append((prefix, json.dumps(value, default=str) if isinstance(value, (list, tuple)) else str(value)))
    flat("", {k: v for k, v in figures.items() if k != "verdicts"})
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key:<{width}}  {value[:120]}")
    for name, ok in figures.get("verdicts", {}).items():
        print(f"{'PASS' if ok else 'FAIL'}  {name}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--markdown", type=Path, help="print the docs' table of a --sizes run's sizes.json")
    what.add_argument("--write", type=Path, help="folder for the matrix file, spaces and runs: write and check it")
    what.add_argument("--run", type=Path, help="folder: write the matrix and rehearse it (cluster, server, faults, "
                      "figures in FOLDER/figures.json)")
    what.add_argument("--sizes", type=Path, help="folder: the report and the UI over stores of --units each "
                      "(paper_scale_store.py; figures in FOLDER/sizes.json)")
    parser.add_argument("--units", type=int, nargs="+", default=[2480, 18600, 100000], help="with --sizes")
    parser.add_argument("--template", type=Path, help="with --sizes: the mlflow.db of an earlier --run into sqlite "
                        "(default: a 620-unit run first)")
    parser.add_argument("--scale", type=float, default=1.0, help="R = 30 x scale and S = 5 x scale (at least 2)")
    parser.add_argument("--algorithms", type=int, default=15, choices=range(1, 16), metavar="1-15")
    parser.add_argument("--cells", type=int, default=8, choices=range(1, 9), metavar="1-8")
    parser.add_argument("--parallel-cells", type=int, default=2)
    parser.add_argument("--cpus-per-node", type=int, default=1)
    parser.add_argument("--kill-at", type=float, default=0.5, help="SIGKILL the driver at this fraction of the "
                        "units (0: never)")
    parser.add_argument("--restart-server-at", type=float, default=0.25, help="restart the MLflow server at this "
                        "fraction of the units (0: never)")
    parser.add_argument("--no-reference", action="store_true", help="skip the uninterrupted run compared against")
    parser.add_argument("--no-ui", action="store_true", help="skip the MLflow UI timings in headless Chromium")
    parser.add_argument("--no-sequential-report", action="store_true", help="time the report once (not again "
                        "reading one metric history at a time)")
    args = parser.parse_args()
    if args.markdown:
        print(sizes_markdown(json.loads(args.markdown.read_text())))
        return
    if args.sizes:
        print(json.dumps(measure_sizes(args.sizes, args.units, args.template, not args.no_ui)["growth"], indent=1))
        return
    if args.run:
        figures = rehearse(Options(args.run, args.scale, args.algorithms, args.cells, args.parallel_cells,
                                   args.cpus_per_node, args.kill_at or None, args.restart_server_at or None,
                                   not args.no_reference, not args.no_ui,
                                   report_sequential=not args.no_sequential_report))
        figures["verdicts"] = verdicts(figures)
        (args.run.resolve() / "figures.json").write_text(json.dumps(figures, indent=1, default=str))
        print_table(figures)
        raise SystemExit(0 if all(figures["verdicts"].values()) else 1)
    folder = args.write.resolve()
    path, document = write_matrix(folder, args.scale, args.algorithms, args.cells)
    studies, total = units(document)
    print(f"{path}: {studies} studies, {total} units (R = {document['base']['search']['trials']}, "
          f"S = {document['base']['search']['orderings']})", flush=True)
    check = subprocess.run(gtep_command("matrix", "--config", str(path), "--check"), env=plugin_environment(),
                           capture_output=True, text=True)
    print(check.stdout[-2000:] + check.stderr[-2000:])
    if check.returncode != 0:
        raise SystemExit(check.returncode)


if __name__ == "__main__":
    main()
