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
import math
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import sqlalchemy as sa

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


def synthesize(template_db: Path, store: str, units: int, matrix: str = MATRIX) -> dict[str, Any]:
    """Write studies_for(units) copies of the template's studies into `store` (created by MLflow's own schema
    first); returns what was written."""
    from mlflow.tracking import MlflowClient

    started = time.perf_counter()
    template = Template(template_db)
    MlflowClient(tracking_uri=store).search_experiments(max_results=1)  # MLflow creates its tables
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
            for run in template.runs_of[source["experiment_id"]]:
                old = run["run_uuid"]
                run_id = new_id(k, old)
                pending["runs"].append({**run, "run_uuid": run_id, "experiment_id": next_id,
                                        "artifact_uri": f"mlflow-artifacts:/{next_id}/{run_id}/artifacts"})
                for row in template.rows["tags"][old]:
                    value = row["value"]
                    if row["key"] == "mlflow.parentRunId" or row["key"].endswith("_run_id"):
                        value = new_id(k, value)
                    elif row["key"] in rewrite:
                        value = rewrite[row["key"]]
                    elif row["key"] == "gtep.key":
                        value = f"{value}:{k}"
                    pending["tags"].append({**row, "run_uuid": run_id, "value": value})
                for row in template.rows["params"][old]:
                    value = label if row["key"] == "gtep.algorithm" else row["value"]
                    pending["params"].append({**row, "run_uuid": run_id, "value": value})
                for table in ("metrics", "latest_metrics"):
                    pending[table] += [{**row, "run_uuid": run_id} for row in template.rows[table][old]]
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
    args = parser.parse_args()
    print(synthesize(args.template, args.store, args.units))


if __name__ == "__main__":
    main()
