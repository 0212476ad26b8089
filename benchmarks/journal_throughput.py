"""How fast a study's tracking journal reaches a tracking server: units per second, one writer against several.

A unit (one ordering of one hyperparameter set) is four MLflow writes: its run created under the set's run, its
metrics and params, its accuracy.json, its end. At paper scale a matrix finishes units faster than one writer
thread applies them through a server (issue 34), so the journal applies different runs' writes with several
threads (`GTEP_TRACKING_WRITERS`). This measures exactly that part: `gtep server` on the given store (PostgreSQL
under tests/with-postgres.sh, sqlite otherwise), N units journaled as a phase journals them, then applied by a
forced flush with 1 writer and with W writers, alternately, each into an experiment of its own; it prints
units/s of each and their ratio (same run, same server).

    bash tests/with-postgres.sh .venv/bin/python benchmarks/journal_throughput.py --units 300 --writers 4
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from gtep.orchestration.journal import TrackingJournal, quiet_http_client
from gtep.testing import MlflowServer


def journal_units(journal: TrackingJournal, units: int, metrics_per_task: int = 10) -> None:
    """What tracking.py journals for a set with `units` orderings (same shapes: ~10 tasks of metrics, params)."""
    with journal.batch():
        journal.create_run("phase", "tune")
        journal.create_run("phase/set000", "set000", parent="phase")
        for u in range(units):
            key = f"phase/set000/o{u}"
            journal.create_run(key, f"ordering{u}", parent="phase/set000", tags={"gtep.ordering": str(u)})
            steps = [(f"acc_task{t}", 0.5, s) for t in range(metrics_per_task) for s in range(t, metrics_per_task)]
            journal.log(key, {"acc": 0.5, "avg_acc": 0.6, "hm": 0.55}, steps,
                        params={**{f"p{i}": i for i in range(12)}, "ordering": u})
            journal.log_text(key, "accuracy.json", json.dumps({"matrix": [[0.5] * 10] * 10}))
            journal.terminate(key, "FINISHED")


def measure(uri: str, root: Path, units: int, writers: int, tag: str) -> float:
    client = quiet_http_client(uri)
    experiment = client.create_experiment(f"throughput-{tag}")
    journal = TrackingJournal.open(root / tag, uri, experiment)
    journal.writers = writers
    journal._kick = lambda: None  # journal everything first: the flush below is what is timed
    journal_units(journal, units)
    started = time.perf_counter()
    left = journal.flush(force=True)
    seconds = time.perf_counter() - started
    if left:
        raise RuntimeError(f"{left} writes were not applied: {journal.last_error}")
    runs = client.search_runs([experiment], max_results=units + 10)
    assert len(runs) == units + 2, f"{len(runs)} runs for {units} units"
    return units / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--units", type=int, default=300)
    parser.add_argument("--writers", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3, help="alternations of 1 writer and --writers writers")
    parser.add_argument("--server-workers", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        backend = os.environ.get("GTEP_TEST_POSTGRES_URI") or f"sqlite:///{root / 'mlflow.db'}"
        env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
        server = MlflowServer(root, backend, env=env, workers=args.server_workers).start()
        try:
            measure(server.uri, root, 20, args.writers, "warm-up")
            rates: dict[int, list[float]] = {1: [], args.writers: []}
            for r in range(args.rounds):
                for writers in (1, args.writers):
                    rates[writers].append(measure(server.uri, root, args.units, writers, f"r{r}-w{writers}"))
        finally:
            server.stop()
    store = "PostgreSQL" if "postgresql" in backend else "sqlite"
    one, many = statistics.median(rates[1]), statistics.median(rates[args.writers])
    print(f"gtep server ({args.server_workers} workers) on {store}, {args.units} units a flush, {args.rounds} rounds:")
    print(f"  1 writer:  {one:6.1f} units/s  (each round: {', '.join(f'{x:.1f}' for x in rates[1])})")
    print(f"  {args.writers} writers: {many:6.1f} units/s  (each round: "
          f"{', '.join(f'{x:.1f}' for x in rates[args.writers])})")
    print(f"  ratio {many / one:.2f}x")


if __name__ == "__main__":
    main()
