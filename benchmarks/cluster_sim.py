"""A GPU cluster rehearsed on this machine (issue 48): Ray nodes on 127.0.0.1 that declare GPUs they do not have.

`ray start --num-gpus 8` makes Ray place, pack and hand out CUDA_VISIBLE_DEVICES exactly as on a GPU cluster; the
trials run with `compute.simulate_gpus: true`, so each trains on the CPU and records the GPU ids Ray gave it. The
learner sleeps through its tasks (benchmarks/sleep_learner.py): units take a set time, as on a GPU, and leave the
CPU to gtep and Ray. Each study goes through the real CLI (`gtep tune --address`), one after another:

    .venv/bin/python benchmarks/cluster_sim.py --out /tmp/cluster-sim          # 4 nodes x 8 GPUs, 10-s units
    .venv/bin/python benchmarks/cluster_sim.py --out /tmp/cluster-sim --small  # 2 nodes x 4 GPUs, 1-s units

The matrix: gpus_per_trial 1, 0.5 and 0.25 with as many concurrent trials as the cluster has CPUs (32: one CPU a
trial), and gpus_per_trial 1 at 8 and 16 concurrent trials; each study has `--trials-per-slot` sets per slot and
`--orderings` units per set. From the events (events.jsonl: each unit's start and end, node, process and GPU ids)
it checks that no logical GPU (node, id) ever holds more trials at once than 1 / gpus_per_trial, that with 0.25
four trials share a GPU, and that every unit trained exactly once. It measures:

- slot busy share: the units' own seconds / (slots x the phase's span, from the driver's start to its last unit);
  the rest is slot time lost (Python start-ups, Ray's placement, reports, the driver);
- the controller's cost per unit: the driver process's CPU seconds (utime + stime, /proc) while units ran, per
  unit, in the first and second half of the units (how it grows with them), and in all, start-up included;
- a trial process's memory (Pss and Rss of the workers named by the events), hence how many this machine holds,
  and the CPU seconds a fresh Python takes to import what a trial imports;
- with `--tracking server`: the studies write to one `gtep server` on loopback (as a cluster's drivers do) instead
  of each driver's own sqlite store, and the server's CPU per unit is measured apart from the driver's.

Figures go to OUT/figures.json and the terminal; the exit status is 1 when a check fails.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gtep.testing import MlflowServer, RayCluster, end_processes, gtep_command, plugin_environment

HERE = Path(__file__).resolve().parent

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
SPACE = {"algorithm": "sleep", "space": {"lr": [0.01, 0.05, 0.1], "batch_size": [32, 64], "weight_decay": [0.0005]}}
TASKS = 2  # tasks per unit: each sleeps unit_seconds / TASKS


@dataclass(frozen=True)
class StudyPlan:
    gpus_per_trial: float
    slots: int  # compute.max_concurrent

    @property
    def name(self) -> str:
        return f"g{self.gpus_per_trial:g}-c{self.slots}".replace(".", "p")


@dataclass
class Options:
    out: Path
    nodes: int = 4
    gpus_per_node: int = 8
    cpus_per_node: int = 8
    unit_seconds: float = 10.0
    orderings: int = 3
    trials_per_slot: int = 2
    studies: list[StudyPlan] = field(default_factory=list)
    startup_repeats: int = 2  # fresh Pythons timed importing a trial's modules (0: not timed)
    # "local": each driver writes its own sqlite store, as on one machine; "server": every study writes to one
    # `gtep server` on loopback through --tracking-uri, as a cluster does, and the server's CPU is measured apart
    tracking: str = "local"

    @classmethod
    def full(cls, out: Path) -> "Options":
        return cls(out, studies=[StudyPlan(1, 32), StudyPlan(0.5, 32), StudyPlan(0.25, 32), StudyPlan(1, 8),
                                 StudyPlan(1, 16)])

    @classmethod
    def small(cls, out: Path) -> "Options":
        """The cluster test's size: 2 nodes x 4 GPUs x 4 CPUs, 1-s units, four trials on each GPU at 0.25."""
        return cls(out, nodes=2, gpus_per_node=4, cpus_per_node=4, unit_seconds=1.0, orderings=2, trials_per_slot=1,
                   studies=[StudyPlan(0.25, 8)], startup_repeats=0)


def environment(opt: Options) -> dict[str, str]:
    """The sleep learner for the driver and (through `ray start`) every node's workers, with its task time."""
    return plugin_environment("sleep_learner", HERE, GTEP_SLEEP_TASK_SECONDS=str(opt.unit_seconds / TASKS))


def study_config(opt: Options, plan: StudyPlan, folder: Path) -> Path:
    space = folder / "sleep.yaml"
    space.write_text(yaml.safe_dump(SPACE))
    config = {
        "study": plan.name, "algorithm": "sleep", "backbone": "resnet8",
        "scenario": {"increments": "2x2"},
        "datasets": {"split": {"dataset": "synthetic:classes=8,train=4,test=2,seed=3", "classes_per_phase": 4}},
        "search": {"trials": plan.slots * opt.trials_per_slot, "orderings": opt.orderings, "space": str(space)},
        "first_task": {"epochs": 1, "milestones": [], "batch_size": 16},
        "training": {"memory_size": 0, "reuse_first_task": False},
        "compute": {"cpus_per_trial": 1, "gpus_per_trial": plan.gpus_per_trial, "max_concurrent": plan.slots,
                    "simulate_gpus": True, "checkpoints": False},
        "seed": 0,
    }
    path = folder / f"{plan.name}.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


# ---- what is measured while a study runs --------------------------------------------------------------------

def cpu_seconds(pid: int) -> float | None:
    """utime + stime of one process (all its threads), None once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def tree_cpu_seconds(pid: int) -> float:
    """utime + stime of a live process and all its descendants (`gtep server` starts MLflow's server, which starts
    uvicorn's workers, each in a session of its own: neither the process group nor the session holds them all)."""
    children: dict[int, list[int]] = defaultdict(list)
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            children[int(stat.read_text().rsplit(")", 1)[1].split()[1])].append(int(stat.parent.name))
        except (OSError, ValueError):
            continue
    total, todo = 0.0, [pid]
    while todo:
        current = todo.pop()
        total += cpu_seconds(current) or 0.0
        todo.extend(children.get(current, []))
    return total


def memory_kib(pid: int) -> dict[str, int]:
    """Rss and Pss (shared pages counted once across processes) of one process, from smaps_rollup."""
    out: dict[str, int] = {}
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            key = line.split(":")[0]
            if key in ("Rss", "Pss", "Pss_Anon"):
                out[key] = int(line.split()[1])
    except OSError:
        pass
    return out


def created_at(pid: int) -> float | None:
    """When a live process was created (epoch seconds): its start time in clock ticks after boot (/proc)."""
    try:
        ticks = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
        boot = next(int(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                    if line.startswith("btime "))
    except (OSError, IndexError, ValueError, StopIteration):
        return None
    return boot + ticks / CLOCK_TICKS


def read_events(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    text = path.read_text()
    return [json.loads(line) for line in text[: text.rfind("\n") + 1].splitlines() if line.strip()]


class DriverSampler(threading.Thread):
    """Every half second: the driver's CPU seconds against the units trained so far (events.jsonl), and the
    memory of each trial process the events name."""

    def __init__(self, pid: int, events: Path, server: int | None = None) -> None:
        super().__init__(daemon=True)
        self.pid, self.events, self.done, self.server = pid, events, threading.Event(), server
        self.samples: list[tuple[float, float, int]] = []  # (time, driver CPU s, units trained)
        self.server_cpu: list[tuple[float, int]] = []  # (the tracking server's CPU s, units trained)
        self.trial_memory: dict[int, dict[str, int]] = {}  # pid -> its largest sample
        self.created: dict[int, float] = {}  # trial process -> when it was created (epoch seconds)

    def run(self) -> None:
        while not self.done.is_set():
            cpu = cpu_seconds(self.pid)
            if cpu is not None:
                events = read_events(self.events)
                trained = sum(e["event"] == "unit_trained" for e in events)
                self.samples.append((time.time(), cpu, trained))
                if self.server is not None:
                    self.server_cpu.append((tree_cpu_seconds(self.server), trained))
                for pid in {e["pid"] for e in events if e["event"].startswith("unit_")}:  # not the driver's
                    if pid not in self.created:
                        self.created[pid] = created_at(pid) or 0.0
                    memory = memory_kib(pid)
                    if memory.get("Pss", 0) > self.trial_memory.get(pid, {}).get("Pss", 0):
                        self.trial_memory[pid] = memory
            self.done.wait(0.5)


def run_study(opt: Options, plan: StudyPlan, address: str, env: dict[str, str],
              server: MlflowServer | None = None) -> dict[str, Any]:
    folder = opt.out / plan.name
    folder.mkdir(parents=True, exist_ok=True)
    config = study_config(opt, plan, folder)
    output = opt.out / "runs"
    events_path = output / plan.name / "events.jsonl"
    log = folder / "tune.log"
    started = time.time()
    tracking = ["--tracking-uri", server.uri] if server is not None else []
    process = subprocess.Popen(gtep_command("tune", "--config", str(config), "--output", str(output),
                                            "--address", address, *tracking),
                               env={**env, "COLUMNS": "160"}, stdout=log.open("w"), stderr=subprocess.STDOUT,
                               start_new_session=True)
    sampler = DriverSampler(process.pid, events_path, server.process.pid if server and server.process else None)
    sampler.start()
    try:
        process.wait(timeout=3600)
    finally:
        sampler.done.set()
        sampler.join()
        if process.poll() is None:
            end_processes([process.pid])
            process.wait()
    out: dict[str, Any] = {"gpus_per_trial": plan.gpus_per_trial, "slots": plan.slots,
                           "returncode": process.returncode, "wall_s": round(time.time() - started, 1)}
    if process.returncode != 0:
        out["log_tail"] = log.read_text()[-3000:]
    events = read_events(events_path)
    expected = plan.slots * opt.trials_per_slot * opt.orderings
    out.update(unit_figures(events, expected, opt.unit_seconds, plan, started))
    out["driver"] = driver_figures(sampler.samples, started)
    if sampler.server_cpu:
        out["tracking_server"] = server_figures(sampler.server_cpu)
    out["trial_processes"] = trial_memory_figures(sampler.trial_memory)
    out["start_up"].update(process_start_figures(sampler.created, events, started))
    return out


# ---- figures and checks from the events ----------------------------------------------------------------------

def unit_intervals(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each trained unit as (start, end, node, GPU ids, worker pid), its start and end events paired."""
    starts: dict[tuple, dict[str, Any]] = {}
    units = []
    for event in events:
        key = (event["phase"], event["attempt"], event.get("set_index"), event.get("ordering"))
        if event["event"] == "unit_started":
            starts[key] = event
        elif event["event"] == "unit_trained" and key in starts:
            begun = starts.pop(key)
            units.append({"key": key, "start": begun["time"], "end": event["time"], "node": event.get("node", ""),
                          "gpu_ids": tuple(event.get("gpu_ids") or ()), "pid": event["pid"]})
    return units


def peak_sharing(units: list[dict[str, Any]]) -> dict[tuple[str, str], int]:
    """For each logical GPU (node, id): the most units that ran on it at once (a sweep over starts and ends)."""
    edges: dict[tuple[str, str], list[tuple[float, int]]] = defaultdict(list)
    for unit in units:
        for gpu in unit["gpu_ids"]:
            edges[(unit["node"], gpu)] += [(unit["start"], 1), (unit["end"], -1)]
    peaks = {}
    for gpu, points in edges.items():
        running = peak = 0
        for _, step in sorted(points, key=lambda p: (p[0], p[1])):  # an end before a start at the same instant
            running += step
            peak = max(peak, running)
        peaks[gpu] = peak
    return peaks


def trials_by_gpu(units: list[dict[str, Any]]) -> dict[tuple[str, str], int]:
    """For each logical GPU (node, id): how many distinct trials Ray gave it over the study. Packing shows here and
    not in the overlap peaks: on a loaded machine trial processes start seconds apart, so four trials Ray placed on
    one GPU need not have a one-second unit running at the same instant."""
    trials: dict[tuple[str, str], set] = defaultdict(set)
    for unit in units:
        for gpu in unit["gpu_ids"]:
            trials[(unit["node"], gpu)].add(unit["key"][:3])  # phase, attempt, set index: one trial
    return {gpu: len(held) for gpu, held in trials.items()}


def unit_figures(events: list[dict[str, Any]], expected: int, unit_seconds: float, plan: StudyPlan,
                 driver_start: float) -> dict[str, Any]:
    units = unit_intervals(events)
    trained = Counter(u["key"] for u in units)
    peaks = peak_sharing(units)
    given = trials_by_gpu(units)
    limit = round(1 / plan.gpus_per_trial)
    own = sum(u["end"] - u["start"] for u in units)
    first = min((u["start"] for u in units), default=driver_start)
    last = max((u["end"] for u in units), default=driver_start)
    span, phase = last - driver_start, last - first
    return {"steady_state": steady_state(units, unit_seconds), "start_up": start_up(units, driver_start),
        "units": {"expected": expected, "trained": len(units), "trained_more_than_once": sum(n > 1 for n in
                                                                                          trained.values()),
                  "without_gpu_ids": sum(not u["gpu_ids"] for u in units),
                  "unit_seconds_median": round(sorted(u["end"] - u["start"] for u in units)[len(units) // 2], 3)
                  if units else None, "unit_seconds_set": unit_seconds},
        "placement": {"logical_gpus_used": len(peaks), "nodes_used": len({u["node"] for u in units}),
                      "trial_processes": len({u["pid"] for u in units}), "most_trials_on_one_gpu": max(peaks.values(),
                                                                                                   default=0),
                      "allowed_per_gpu": limit, "most_trials_given_one_gpu": max(given.values(), default=0),
                      "gpus_at_the_limit": sum(p == limit for p in peaks.values()),
                      "peak_by_gpu": {f"{node[:8]}/{gpu}": p for (node, gpu), p in sorted(peaks.items())}},
        "slots": {"unit_seconds_sum": round(own, 1), "span_from_driver_start_s": round(span, 1),
                  "span_from_first_unit_s": round(phase, 1),
                  "ideal_s": round(expected * unit_seconds / plan.slots, 1),
                  "busy_share": round(own / (plan.slots * span), 3) if span > 0 else None,
                  "busy_share_after_first_unit": round(own / (plan.slots * phase), 3) if phase > 0 else None,
                  "first_unit_after_driver_start_s": round(first - driver_start, 1),
                  "lost_per_unit_s": round((plan.slots * span - own) / max(len(units), 1), 3)},
    }


def steady_state(units: list[dict[str, Any]], unit_seconds: float) -> dict[str, Any]:
    """Slot time lost between units once a trial process runs: the gap from a unit's end to the next unit's start
    in the same process, within a set (the report's round trip, the next ordering) and across sets (Tune ending
    one trial and starting the next in the reused actor)."""
    within, across = [], []
    by_process: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for unit in units:
        by_process[unit["pid"]].append(unit)
    for chain in by_process.values():
        chain.sort(key=lambda u: u["start"])
        for before, after in zip(chain, chain[1:]):
            (within if before["key"][2] == after["key"][2] else across).append(after["start"] - before["end"])

    def summary(gaps: list[float]) -> dict[str, Any]:
        if not gaps:
            return {"gaps": 0}
        gaps = sorted(gaps)
        return {"gaps": len(gaps), "median_ms": round(1000 * gaps[len(gaps) // 2], 1),
                "mean_ms": round(1000 * sum(gaps) / len(gaps), 1), "max_ms": round(1000 * gaps[-1], 1)}

    every = within + across
    return {"within_a_set": summary(within), "between_sets": summary(across),
            "lost_share_of_a_unit": round(sum(every) / len(every) / unit_seconds, 4) if every else None}


def start_up(units: list[dict[str, Any]], driver_start: float) -> dict[str, Any]:
    """When each trial process began its first unit, counted from the driver's start: the fixed cost of a study
    (the driver's imports and Ray Tune's start, then Ray starting a Python process per concurrent trial, each
    importing torch, Ray Tune and gtep)."""
    firsts = sorted({u["pid"]: min(v["start"] for v in units if v["pid"] == u["pid"]) for u in units}.values())
    if not firsts:
        return {}
    return {"trial_processes": len(firsts), "first_process_first_unit_s": round(firsts[0] - driver_start, 1),
            "last_process_first_unit_s": round(firsts[-1] - driver_start, 1),
            "spread_s": round(firsts[-1] - firsts[0], 1)}


def process_start_figures(created: dict[int, float], events: list[dict[str, Any]],
                          driver_start: float) -> dict[str, Any]:
    """From the driver's start to Ray creating the first trial process (the driver's imports, joining Ray, Tune's
    start), and from a trial process's creation to its first unit (its Python start-up: imports, the trainable)."""
    born = {pid: t for pid, t in created.items() if t}
    if not born:
        return {}
    first_unit = {}
    for event in events:
        if event["event"] == "unit_started":
            first_unit.setdefault(event["pid"], event["time"])
    start_ups = sorted(first_unit[pid] - t for pid, t in born.items() if pid in first_unit)
    return {"first_process_created_s": round(min(born.values()) - driver_start, 1),
            "last_process_created_s": round(max(born.values()) - driver_start, 1),
            "process_to_first_unit_median_s": round(start_ups[len(start_ups) // 2], 1) if start_ups else None,
            "process_to_first_unit_max_s": round(start_ups[-1], 1) if start_ups else None}


def driver_figures(samples: list[tuple[float, float, int]], started: float) -> dict[str, Any]:
    """The driver's CPU: in all; while units ran (from its first trained unit to its last), per unit; and per unit
    in the first and the second half of the units, to see whether it grows with them."""
    if not samples:
        return {}
    total = samples[-1][1]
    trained = [s for s in samples if s[2] > 0]
    out: dict[str, Any] = {"cpu_s_total": round(total, 2), "samples": len(samples)}
    if len(trained) >= 2 and trained[-1][2] > trained[0][2]:
        first = trained[0]
        last = next(s for s in trained if s[2] == trained[-1][2])  # at its last unit: the phase's end comes after
        middle = min(trained, key=lambda s: abs(s[2] - (first[2] + last[2]) / 2))
        out.update(
            cpu_s_before_first_unit=round(first[1], 2),
            cpu_ms_per_unit=round(1000 * (last[1] - first[1]) / (last[2] - first[2]), 1),
            cpu_ms_per_unit_first_half=round(1000 * (middle[1] - first[1]) / max(middle[2] - first[2], 1), 1),
            cpu_ms_per_unit_second_half=round(1000 * (last[1] - middle[1]) / max(last[2] - middle[2], 1), 1),
            cpu_ms_per_unit_all_in=round(1000 * total / last[2], 1),
            cpu_s_after_last_unit=round(total - last[1], 2),  # selection, results, the store's last writes
            cpu_share_of_one_core_while_units_ran=round((last[1] - first[1]) / max(last[0] - first[0], 1e-9), 3))
    return out


def server_figures(samples: list[tuple[float, int]]) -> dict[str, Any]:
    """The tracking server's CPU per unit while units ran: where the store's writes go when a cluster's drivers
    write through --tracking-uri."""
    trained = [s for s in samples if s[1] > 0]
    if len(trained) < 2 or trained[-1][1] == trained[0][1]:
        return {}
    last = next(s for s in trained if s[1] == trained[-1][1])
    return {"cpu_ms_per_unit": round(1000 * (last[0] - trained[0][0]) / (last[1] - trained[0][1]), 1),
            "cpu_s_total": round(samples[-1][0] - samples[0][0], 2)}


def trial_memory_figures(memory: dict[int, dict[str, int]]) -> dict[str, Any]:
    pss = sorted(m.get("Pss", 0) for m in memory.values() if m.get("Pss"))
    rss = sorted(m.get("Rss", 0) for m in memory.values() if m.get("Rss"))
    if not pss:
        return {"processes": 0}
    total_kib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 1024
    median_pss = pss[len(pss) // 2]
    return {"processes": len(pss), "pss_median_mib": round(median_pss / 1024, 1),
            "rss_median_mib": round(rss[len(rss) // 2] / 1024, 1), "pss_sum_mib": round(sum(pss) / 1024, 1),
            "machine_memory_mib": round(total_kib / 1024), "trial_processes_it_holds": int(total_kib // median_pss)}


def python_startup(env: dict[str, str], repeats: int = 2) -> dict[str, Any]:
    """CPU and wall seconds of a fresh Python importing what a trial process imports (torch, Ray Tune, gtep's
    trainable and the learner), the least of `repeats`: what each new trial process costs before its first unit."""
    script = ("import resource, time, json; t = time.time(); import gtep.orchestration.trainable, sleep_learner; "
              "r = resource.getrusage(resource.RUSAGE_SELF); "
              "print(json.dumps([r.ru_utime + r.ru_stime, time.time() - t]))")
    runs = []
    for _ in range(repeats):
        started = time.time()
        done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
        cpu, imports = json.loads(done.stdout.strip().splitlines()[-1])
        runs.append((cpu, imports, time.time() - started))
    cpu, imports, wall = min(runs)
    return {"cpu_s": round(cpu, 2), "import_wall_s": round(imports, 2), "process_wall_s": round(wall, 2),
            "load_average": os.getloadavg()}


def verdicts(figures: dict[str, Any]) -> dict[str, bool]:
    out: dict[str, bool] = {}
    for name, study in figures["studies"].items():
        units, placement = study["units"], study["placement"]
        out[f"{name}: the study exited 0"] = study["returncode"] == 0
        out[f"{name}: every unit trained exactly once"] = (units["trained"] == units["expected"]
                                                           and units["trained_more_than_once"] == 0)
        out[f"{name}: every unit recorded its GPU ids"] = units["trained"] > 0 and units["without_gpu_ids"] == 0
        out[f"{name}: no GPU held more than 1/gpus_per_trial trials"] = (
            0 < placement["most_trials_on_one_gpu"] <= placement["allowed_per_gpu"])
        if study["gpus_per_trial"] == 0.25:
            out[f"{name}: four trials shared a GPU"] = placement["most_trials_given_one_gpu"] >= 4
    return out


def simulate(opt: Options) -> dict[str, Any]:
    opt.out = opt.out.resolve()
    opt.out.mkdir(parents=True, exist_ok=True)
    env = environment(opt)
    figures: dict[str, Any] = {
        "cluster": {"nodes": opt.nodes, "gpus_per_node": opt.gpus_per_node, "cpus_per_node": opt.cpus_per_node,
                    "unit_seconds": opt.unit_seconds, "orderings": opt.orderings,
                    "trials_per_slot": opt.trials_per_slot},
        "machine": {"cpus": os.cpu_count(), "load_average_at_start": os.getloadavg()},
        "python_startup": python_startup(env, opt.startup_repeats) if opt.startup_repeats else {}, "studies": {}}
    cluster = RayCluster(opt.cpus_per_node, nodes=opt.nodes, gpus_per_node=opt.gpus_per_node, env=env)
    server = None
    if opt.tracking == "server":
        figures["tracking"] = "server"
        server = MlflowServer(opt.out, f"sqlite:///{opt.out / 'server.db'}", artifacts=opt.out / "artifacts", env=env,
                              workers=2)
    try:
        if server is not None:
            server.start()
        begun = time.time()
        cluster.start()
        figures["cluster"]["start_s"] = round(time.time() - begun, 1)
        for plan in opt.studies:
            print(f"{plan.name}: gpus_per_trial {plan.gpus_per_trial:g}, {plan.slots} trials at once", flush=True)
            figures["studies"][plan.name] = run_study(opt, plan, cluster.address, env, server)
            (opt.out / "figures.json").write_text(json.dumps(figures, indent=1, default=str))
    finally:
        cluster.stop()
        if server is not None:
            server.stop()
    figures["machine"]["load_average_at_end"] = os.getloadavg()
    figures["verdicts"] = verdicts(figures)
    (opt.out / "figures.json").write_text(json.dumps(figures, indent=1, default=str))
    return figures


def print_summary(figures: dict[str, Any]) -> None:
    print(f"python start-up of a trial process: {figures['python_startup']}")
    header = ("study", "units", "wall s", "busy", "busy after 1st unit", "lost s/unit", "driver ms/unit",
              "1st/2nd half", "server ms/unit", "GPUs", "max/GPU", "trial Pss MiB")
    print(" | ".join(header))
    for name, s in figures["studies"].items():
        d, sl, p = s["driver"], s["slots"], s["placement"]
        print(" | ".join(str(v) for v in (
            name, s["units"]["trained"], s["wall_s"], sl["busy_share"], sl["busy_share_after_first_unit"],
            sl["lost_per_unit_s"], d.get("cpu_ms_per_unit"),
            f"{d.get('cpu_ms_per_unit_first_half')}/{d.get('cpu_ms_per_unit_second_half')}",
            s.get("tracking_server", {}).get("cpu_ms_per_unit", "-"),
            p["logical_gpus_used"], p["most_trials_on_one_gpu"], s["trial_processes"].get("pss_median_mib"))))
    for name, ok in figures["verdicts"].items():
        print(f"{'PASS' if ok else 'FAIL'}  {name}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for the studies and figures.json")
    parser.add_argument("--small", action="store_true", help="the cluster test's size: 2 nodes x 4 GPUs, 1-s units")
    parser.add_argument("--unit-seconds", type=float, help="seconds each unit sleeps (default 10; 1 with --small)")
    parser.add_argument("--orderings", type=int, help="units per set (default 3)")
    parser.add_argument("--trials-per-slot", type=int, help="sets per concurrent trial (default 2)")
    parser.add_argument("--tracking", choices=("local", "server"), default="local",
                        help="local: each driver's own sqlite store; server: one `gtep server` on loopback for all")
    parser.add_argument("--study", action="append", metavar="GPUS:SLOTS", help="only these studies, e.g. 1:32 "
                        "(gpus_per_trial 1, 32 trials at once); repeat for several")
    args = parser.parse_args()
    opt = Options.small(args.out) if args.small else Options.full(args.out)
    for name in ("unit_seconds", "orderings", "trials_per_slot"):
        if getattr(args, name) is not None:
            setattr(opt, name, getattr(args, name))
    opt.tracking = args.tracking
    if args.study:
        opt.studies = [StudyPlan(float(g), int(c)) for g, c in (text.split(":") for text in args.study)]
    figures = simulate(opt)
    print_summary(figures)
    raise SystemExit(0 if all(figures["verdicts"].values()) else 1)


if __name__ == "__main__":
    main()
