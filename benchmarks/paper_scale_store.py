"""A paper-scale MLflow store of any size, written straight into MLflow's tables (no training, no server).

What `gtep report --matrix` and the MLflow UI cost grows with the store's runs, not with how they were trained; a
store of 100,000 units would take hours to train even with the cost-free learners of paper_scale.py. So this copies
the studies of a small real matrix run (a *template*: paper_scale.py --run into sqlite, every run, tag, param and
metric row that gtep wrote) as many times as asked, each copy a study of its own with new run ids, its lineage
(mlflow.parentRunId) remapped, and the matrix's tags set so that the copies form groups of 15 algorithms per
(scenario, pairing), as the paper's matrix does:

    study k: template study (k % 15) % len(templates of its scenario), algorithm label <template algorithm>-<k % 15>,
             group g = k // 15: scenario = the template's (10tasks / 6tasks alternating by g), pairing split-<g // 2>

At 120 studies (18,600 units) that is the paper's 8 groups x 15 algorithms; at 646 studies, 100,130 units in 44
groups. The numbers are the template's, so the report's tables are the template's repeated; what is measured is
reading, summarising, drawing and logging them.

    .venv/bin/python benchmarks/paper_scale_store.py --template /tmp/ps/server/mlflow.db \
        --store sqlite:////tmp/synth/mlflow.db --units 100000
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from gtep.orchestration.report_store import SNAPSHOT_FILE, SNAPSHOT_TAG

UNITS_PER_STUDY = 155  # R = 30 sets x S = 5 orderings, and H*'s 5 orderings on D^E
ALGORITHMS = 15
MATRIX = "paper-scale"
RUN_TABLES = ("tags", "params", "metrics", "latest_metrics")
CHUNK = 20_000


def engine_of(uri: str) -> sa.Engine:
    if uri.startswith("postgresql://"):
        uri = "postgresql+psycopg://" + uri[len("postgresql://"):]
    return sa.create_engine(uri)


def studies_for(units: int) -> int:
    return max(1, math.ceil(units / UNITS_PER_STUDY))


def new_id(study: int, old: str) -> str:
    return hashlib.md5(f"{study}:{old}".encode()).hexdigest()


class Template:
    """The template store's gtep studies: per experiment its row, tags, runs and their rows in RUN_TABLES."""

    def __init__(self, path: Path) -> None:
        engine = engine_of(f"sqlite:///{path}")
        meta = sa.MetaData()
        meta.reflect(engine, only=["experiments", "experiment_tags", "runs", *RUN_TABLES])
        with engine.connect() as db:
            experiments = [dict(r._mapping) for r in db.execute(sa.select(meta.tables["experiments"]))
                           if r.name.startswith("gtep/") and r.name != "gtep/reports"]
            self.experiment_tags = defaultdict(list)
            for r in db.execute(sa.select(meta.tables["experiment_tags"])):
                self.experiment_tags[r.experiment_id].append(dict(r._mapping))
            ids = [e["experiment_id"] for e in experiments]
            runs = [dict(r._mapping) for r in db.execute(
                sa.select(meta.tables["runs"]).where(meta.tables["runs"].c.experiment_id.in_(ids)))]
            self.rows: dict[str, dict[str, list[dict[str, Any]]]] = {t: defaultdict(list) for t in RUN_TABLES}
            for table in RUN_TABLES:
                for r in db.execute(sa.select(meta.tables[table])):
                    self.rows[table][r.run_uuid].append(dict(r._mapping))
            # the phase rows in gtep/reports that `gtep matrix` wrote as each cell ended, by the phase run they copy
            reports = [r.experiment_id for r in db.execute(sa.select(meta.tables["experiments"]))
                       if r.name == "gtep/reports"]
            self.phase_rows: dict[str, dict[str, Any]] = {}
            for run in db.execute(sa.select(meta.tables["runs"]).where(
                    meta.tables["runs"].c.experiment_id.in_(reports))):
                tags = {t.key: t.value for t in db.execute(sa.select(meta.tables["tags"]).where(
                    meta.tables["tags"].c.run_uuid == run.run_uuid))}
                if tags.get("gtep.level") == "phase_row":
                    self.phase_rows[tags["gtep.phase_run"]] = dict(run._mapping)
        engine.dispose()
        self.runs_of: dict[int, list[dict[str, Any]]] = defaultdict(list)
        for run in runs:
            self.runs_of[run["experiment_id"]].append(run)
        self.experiments = experiments
        self.by_scenario: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for experiment in experiments:
            self.by_scenario[self.tag(experiment, "gtep.scenario")].append(experiment)
        if not self.by_scenario:
            raise SystemExit(f"{path}: no gtep study in this store; give the mlflow.db of a paper_scale.py --run")

    def tag(self, experiment: dict[str, Any], key: str) -> str:
        for run in self.runs_of[experiment["experiment_id"]]:
            for row in self.rows["tags"][run["run_uuid"]]:
                if row["key"] == key:
                    return str(row["value"])
        return ""


def copy_phase_row(template: Template, row: dict[str, Any], k: int, phase_run_id: str, reports_id: int,
                   pending: dict[str, list[dict[str, Any]]], tags: dict[str, str], params: dict[str, str]) -> None:
    """A copy of a template phase row for study k's copy of its phase run."""
    old = row["run_uuid"]
    run_id = new_id(k, old)
    name = f"{params['study']} {str(row['name']).rsplit(' ', 1)[-1]}"  # "<study> <phase>"
    pending["runs"].append({**row, "run_uuid": run_id, "experiment_id": reports_id, "name": name,
                            "artifact_uri": f"mlflow-artifacts:/{reports_id}/{run_id}/artifacts"})
    for tag in template.rows["tags"][old]:
        value = name if tag["key"] == "mlflow.runName" else tags.get(tag["key"], tag["value"])
        pending["tags"].append({**tag, "run_uuid": run_id, "value": value})
    for param in template.rows["params"][old]:
        pending["params"].append({**param, "run_uuid": run_id, "value": params.get(param["key"], param["value"])})
    for table in ("metrics", "latest_metrics"):
        pending[table] += [{**metric, "run_uuid": run_id} for metric in template.rows[table][old]]


def run_snapshots(copied: list[dict[str, Any]], tags: dict[str, dict[str, str]],
                  params: dict[str, dict[str, str]], metrics: dict[str, dict[str, float]]) -> dict[str, dict]:
    """Per copied phase run that the template had snapshotted (gtep.snapshot), its copied runs as `gtep matrix`
    snapshots them at a cell's end (report_store.RunStore.write_snapshots): its trial runs, and the ordering runs
    of H* (a tuning phase) or of every trial (the others), each as report_store.run_record writes it."""
    def record(run: dict[str, Any]) -> dict[str, Any]:
        return {"run_id": run["run_uuid"], "experiment_id": str(run["experiment_id"]), "run_name": run["name"],
                "status": run["status"], "start_time": run["start_time"], "end_time": run["end_time"],
                "artifact_uri": run["artifact_uri"], "metrics": metrics[run["run_uuid"]],
                "params": params[run["run_uuid"]], "tags": tags[run["run_uuid"]]}

    def under(parents: set[str], level: str) -> list[dict[str, Any]]:
        return [record(run) for run in copied if tags[run["run_uuid"]].get("gtep.level") == level
                and tags[run["run_uuid"]].get("mlflow.parentRunId") in parents]

    found = {}
    for phase in copied:
        own = tags[phase["run_uuid"]]
        if own.get("gtep.level") != "phase" or not own.get(SNAPSHOT_TAG):
            continue
        trials = under({phase["run_uuid"]}, "trial")
        shown = {own.get("gtep.best_trial_run_id", "")} if own.get("gtep.phase") == "tune" else \
            {trial["run_id"] for trial in trials}
        found[phase["run_uuid"]] = {"trials": trials, "orderings": under(shown, "ordering")}
    return found


def synthesize(template_db: Path, store: str, units: int, matrix: str = MATRIX,
               artifacts: Path | None = None) -> dict[str, Any]:
    """Write studies_for(units) copies of the template's studies into `store` (created by MLflow's own schema
    first), and into `artifacts` (the server's --artifacts-destination) the phases' snapshots of the runs a
    report reads that `gtep matrix` writes as a cell ends (without `artifacts`, the copies have none); returns what
    was written."""
    from mlflow.tracking import MlflowClient

    started = time.perf_counter()
    template = Template(template_db)
    client = MlflowClient(tracking_uri=store)  # MLflow creates its tables
    found = client.get_experiment_by_name("gtep/reports")
    # its artifacts under the server's --artifacts-destination, as an experiment the server creates has them
    reports_id = int(found.experiment_id if found else client.create_experiment(
        "gtep/reports", artifact_location="mlflow-artifacts:/reports"))
    engine = engine_of(store)
    meta = sa.MetaData()
    meta.reflect(engine, only=["experiments", "experiment_tags", "runs", *RUN_TABLES])
    scenarios = sorted(template.by_scenario)
    count = studies_for(units)
    written = defaultdict(int)
    pending: dict[str, list[dict[str, Any]]] = defaultdict(list)

    def flush(db: sa.Connection, force: bool = False) -> None:
        if not force and all(len(rows) < CHUNK for rows in pending.values()):
            return
        for table in ("runs", *RUN_TABLES):  # the runs first: the other tables' rows name them (foreign keys)
            if pending[table]:
                db.execute(meta.tables[table].insert(), pending[table])
                written[table] += len(pending[table])
                pending[table].clear()

    with engine.begin() as db:
        next_id = int(db.execute(sa.select(sa.func.max(meta.tables["experiments"].c.experiment_id))).scalar() or 0)
        for k in range(count):
            group, algorithm = divmod(k, ALGORITHMS)
            scenario = scenarios[group % len(scenarios)]
            source = template.by_scenario[scenario][algorithm % len(template.by_scenario[scenario])]
            study = f"{matrix}-syn{k:05d}"
            pairing = f"split-{group // len(scenarios):03d}"
            label = f"{template.tag(source, 'gtep.study').split('-')[2]}-{algorithm:02d}"
            next_id += 1
            experiment = {**source, "experiment_id": next_id, "name": f"gtep/{study}",
                          "artifact_location": f"mlflow-artifacts:/{next_id}"}
            db.execute(meta.tables["experiments"].insert(), [experiment])
            tags = [{**t, "experiment_id": next_id} for t in template.experiment_tags[source["experiment_id"]]]
            if tags:
                db.execute(meta.tables["experiment_tags"].insert(), tags)
            rewrite = {"gtep.study": study, "gtep.cell": study, "gtep.matrix": matrix, "gtep.scenario": scenario,
                       "gtep.pairing": pairing}
            copied, tags_of, params_of, metrics_of = [], {}, {}, {}
            for run in template.runs_of[source["experiment_id"]]:
                old = run["run_uuid"]
                run_id = new_id(k, old)
                copy = {**run, "run_uuid": run_id, "experiment_id": next_id,
                        "artifact_uri": f"mlflow-artifacts:/{next_id}/{run_id}/artifacts"}
                pending["runs"].append(copy)
                copied.append(copy)
                tags_of[run_id], params_of[run_id] = {}, {}
                for row in template.rows["tags"][old]:
                    value = row["value"]
                    if row["key"] == "mlflow.parentRunId" or row["key"].endswith("_run_id"):
                        value = new_id(k, value)
                    elif row["key"] in rewrite:
                        value = rewrite[row["key"]]
                    elif row["key"] == "gtep.key":
                        value = f"{value}:{k}"
                    elif row["key"] == SNAPSHOT_TAG and artifacts is None:
                        continue  # no snapshot file: the report searches this study's runs
                    pending["tags"].append({**row, "run_uuid": run_id, "value": value})
                    tags_of[run_id][row["key"]] = value
                for row in template.rows["params"][old]:
                    value = label if row["key"] == "gtep.algorithm" else row["value"]
                    pending["params"].append({**row, "run_uuid": run_id, "value": value})
                    params_of[run_id][row["key"]] = value
                for table in ("metrics", "latest_metrics"):
                    pending[table] += [{**row, "run_uuid": run_id} for row in template.rows[table][old]]
                metrics_of[run_id] = {row["key"]: math.nan if row["is_nan"] else row["value"]
                                      for row in template.rows["latest_metrics"][old]}
                if old in template.phase_rows:  # its row in gtep/reports, as `gtep matrix` writes it
                    copy_phase_row(template, template.phase_rows[old], k, run_id, reports_id, pending,
                                   {**rewrite, "gtep.phase_run": run_id}, {"study": study, "algorithm": label,
                                                                          "scenario": scenario, "pairing": pairing})
            if artifacts is not None:
                for phase, snapshot in run_snapshots(copied, tags_of, params_of, metrics_of).items():
                    folder = artifacts / str(next_id) / phase / "artifacts"
                    folder.mkdir(parents=True, exist_ok=True)
                    (folder / SNAPSHOT_FILE).write_text(json.dumps(snapshot))
                    written["run snapshots"] += 1
            flush(db)
        flush(db, force=True)
        if engine.dialect.name == "postgresql":  # ids were given, not drawn: the next experiment MLflow creates
            db.execute(sa.text("SELECT setval(pg_get_serial_sequence('experiments', 'experiment_id'), "
                               "(SELECT MAX(experiment_id) FROM experiments))"))
    engine.dispose()
    return {"studies": count, "units": count * UNITS_PER_STUDY, "groups": math.ceil(count / ALGORITHMS),
            "rows": dict(written), "seconds": round(time.perf_counter() - started, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--template", type=Path, required=True, help="mlflow.db of a paper_scale.py --run (sqlite)")
    parser.add_argument("--store", required=True, help="the store to write (sqlite:///... or postgresql://...)")
    parser.add_argument("--units", type=int, default=100_000)
    parser.add_argument("--artifacts", type=Path, help="the server's --artifacts-destination: the phases' run "
                        "snapshots go there (without it, the copies have none)")
    args = parser.parse_args()
    print(synthesize(args.template, args.store, args.units, artifacts=args.artifacts))


if __name__ == "__main__":
    main()
