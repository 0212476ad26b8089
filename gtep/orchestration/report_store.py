"""The MLflow store as plain pandas frames for gtep report (read only), and the report run that logs a report.

It reads the lineage `gtep.orchestration.tracking` writes:

    phase run (gtep.level=phase)  >  trial run (gtep.level=trial)  >  ordering run (gtep.level=ordering, acc_t steps)

and turns every run into a row of its tags and metrics. Which runs a report keeps (the latest usable phase run per
label, its trials and orderings) is the report's own choice, made on these frames in `gtep.reporting.collect`; this
module is the only place the report's data touches MLflow.
"""
from __future__ import annotations

import math
import os
import time
from pathlib import Path
from typing import Any, Callable, Iterable

import pandas as pd
from mlflow.entities import Metric, Param, Run, ViewType
from mlflow.tracking import MlflowClient

from gtep.config import ConfigError
from gtep.config.private import private_folder
from gtep.config.uris import check_no_userinfo, is_server
from gtep.protocol.families import FAMILIES, known_metrics
from gtep.protocol.phases import EVALUATE, TUNE

PREFIX = "gtep/"  # a study's experiment is gtep/<study> (gtep.orchestration.tracking)
REPORTS_EXPERIMENT = "gtep/reports"
PHASE_METRICS = ("acc", "acc_std", "avg_acc", "avg_acc_std", "hmean", "diverged", "best_hmean", "best_acc",
                 "best_avg_acc", "best_acc_std", "best_avg_acc_std", "best_set_index", "sets_complete",
                 "sets_incomplete", "sets_diverged", "sets_stopped", "compute_seconds")
TRIAL_METRICS = ("acc", "acc_std", "avg_acc", "avg_acc_std", "hmean", "mean_of_hmeans", "diverged_orderings",
                 "orderings")
ORDERING_METRICS = ("acc", "avg_acc", "hmean", "forgetting", "old_acc", "new_acc", "params_total",
                    "params_trainable", "train_seconds", "diverged")
# Scenario families (tag gtep.family; runs written before the tag are class-incremental) and the criterion H* was
# selected by (tag gtep.criterion). An ordering run of a family logs the scalars of the family's metric table
# (gtep/protocol/families/ Metric); its phase and trial runs their mean over the orderings, <name>_std, and
# `score` (the criterion's value). Percent metrics are in percent in a gtep.units=percent run; ratios and counts
# as they are. Every list below is read from the registered families' tables, none is kept here.
FAMILY_TAG, CRITERION_TAG = "gtep.family", "gtep.criterion"
CLASS_INCREMENTAL = "class_incremental"
GACC_COLUMNS = ["run_id", "k", "alpha", "gacc"]
GACC_STEPS = 12  # gacc_alpha is logged at step k for alpha = k / 12
CURVE_COLUMNS = ["run_id", "metric", "step", "value"]
PHASE_ROW = "phase_row"  # gtep.level of a phase's row in gtep/reports (write_phase_rows)
PHASE_RUN_TAG = "gtep.phase_run"  # on a phase row: the phase run it copies
SNAPSHOT_FILE = "runs.json"  # a finished phase run's snapshot of the runs a report reads of it (write_snapshots)
SNAPSHOT_TAG = "gtep.snapshot"  # on that phase run, once the snapshot is written: its file name
SEARCH_GROUP = 15  # experiments a search covers when a report searches many through a server
HISTORY_THREADS = int(os.environ.get("GTEP_REPORT_THREADS", 8))  # bulk history requests at once to a server
BULK_RUNS = 100  # runs per bulk history read: the most MLflow's get-history-bulk route takes
BULK_POINTS = 25_000  # points per bulk read: the route's cap; a read that reaches it is redone run by run
# Accuracies are fractions inside the report. Runs tagged gtep.units=percent logged these metrics in percent (57.0
# for 0.57); older runs logged fractions. Both are read into fractions here, so a report prints the same either way.
UNITS_TAG = "gtep.units"
BASE_PERCENT = frozenset({"acc", "acc_std", "avg_acc", "avg_acc_std", "hmean", "hmean_std", "forgetting", "old_acc",
                          "new_acc", "mean_of_hmeans", "best_hmean", "best_acc", "best_avg_acc", "best_acc_std",
                          "best_avg_acc_std", "acc_t", "score", "gacc_alpha"})


def family_metrics() -> dict[str, tuple[str, ...]]:
    """Each registered family's scalar metrics beyond the ones every ordering run has (ORDERING_METRICS)."""
    return {name: tuple(m for m in FAMILIES.get(name).metric_names if m not in ORDERING_METRICS) for name in FAMILIES}


def all_family_metrics() -> tuple[str, ...]:
    return tuple(dict.fromkeys(n for names in family_metrics().values() for n in names))


def scored_metrics() -> tuple[str, ...]:
    """What phase and trial runs log of the families' metrics: the means, their stds, and the criterion's score."""
    names = all_family_metrics()
    return (*names, *(f"{n}_std" for n in names), "score")


def percent_metrics() -> frozenset[str]:
    """Metrics stored in percent in a gtep.units=percent run: BASE_PERCENT and the families' percent metrics."""
    shown = {m.name for m in known_metrics().values() if m.percent and not m.curve}
    return BASE_PERCENT | shown | {f"{n}_std" for n in shown}


def default_criterion(family: str) -> str:
    """H*'s criterion when a run has no gtep.criterion tag: its family's default ('' for an unknown family)."""
    return FAMILIES.get(family).default_criterion if family in FAMILIES else ""


def trial_columns() -> list[str]:
    return ["run_id", "phase_run_id", "set_index", "status", "set_status", "orderings_tag", "start_time",
            "family", "criterion", *TRIAL_METRICS, *scored_metrics()]


def ordering_columns() -> list[str]:
    return ["run_id", "trial_run_id", "set_index", "ordering", "status", "run_status", "end_time", "percent",
            "family", "criterion", *ORDERING_METRICS, *all_family_metrics()]


# a tuning phase run logs H*'s numbers as best_* (fraction stores) or as acc, avg_acc, hmean (percent stores)
BEST_ALIASES = (("best_acc", "acc"), ("best_avg_acc", "avg_acc"), ("best_hmean", "hmean"), ("best_acc_std", "acc_std"),
                ("best_avg_acc_std", "avg_acc_std"))
HPARAM_COLUMNS = ["trial_run_id", "name", "value"]
STEP_COLUMNS = ["run_id", "t", "acc"]


def sqlite_path(tracking_uri: str) -> Path | None:
    return Path(tracking_uri[len("sqlite:///"):]) if tracking_uri.startswith("sqlite:///") else None


def open_store(tracking_uri: str, option: str = "--tracking-uri") -> RunStore:
    """An existing store. A missing sqlite file is an error naming `option`, not a new empty store."""
    check_no_userinfo(tracking_uri, option)
    path = sqlite_path(tracking_uri)
    if path is not None and not path.exists():
        raise ConfigError(option, f"there is no MLflow store at {path}; pass the --output folder of the runs "
                          "(gtep run wrote <output>/mlflow.db) or their --tracking-uri")
    from gtep.orchestration.tracking_auth import check_credentials

    if is_server(tracking_uri):  # a server's 401 is one line naming the credentials, not "no answer"
        check_credentials(tracking_uri, option)
    # MLflow prints a "View run" line for every run a client ends through a server: a report's phase rows are 240
    os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
    client = MlflowClient(tracking_uri=tracking_uri)
    try:
        client.search_experiments(max_results=1)
    except Exception as err:  # noqa: BLE001 - a server that is away surfaces as several MLflow/requests types
        raise ConfigError(option, f"the MLflow store at {tracking_uri} does not answer "
                          f"({err.__class__.__name__}); start it or give another --tracking-uri") from None
    return RunStore(client, tracking_uri)


def create_store(tracking_uri: str) -> None:
    """Create a store's tables now (and put a local sqlite store in WAL mode): `gtep matrix --parallel-cells`
    does it before its cell drivers start, which would otherwise race to create a fresh sqlite store's tables."""
    from gtep.orchestration.quiet import NOISE, dropping
    from gtep.orchestration.tracking_store import sqlite_write_ahead_log  # here: the report's reads need no Ray

    path = sqlite_path(tracking_uri)
    if path is not None:
        sqlite_write_ahead_log(path)
    with dropping("mlflow.store.db.utils", *NOISE["mlflow.store.db.utils"]):  # the table-creation INFO lines
        MlflowClient(tracking_uri=tracking_uri).search_experiments(max_results=1)


class RunStore:
    """The runs of one store as frames, one row per run. Columns survive an empty result, so frames join cleanly."""

    def __init__(self, client: MlflowClient, tracking_uri: str) -> None:
        self.client, self.tracking_uri = client, tracking_uri
        self._phase_entities: dict[str, Run] = {}  # the phase runs read, for their rows (write_phase_rows)
        # what was read, for the snapshots (write_snapshots): trial runs by phase run, ordering runs by trial run
        self._trials_of: dict[str, list[Run]] = {}
        self._orderings_of: dict[str, list[Run]] = {}
        self._snapshots: dict[str, tuple[list[Run], list[Run]]] = {}  # phase run -> (trials, orderings) read
        self._covered: set[str] = set()  # studies (experiment ids) read from their phases' snapshots

    def study_experiments(self) -> dict[str, str]:
        """Every gtep study experiment (name -> id); the reports' own experiment is not a study."""
        found = _all_pages(lambda token: self.client.search_experiments(
            view_type=ViewType.ACTIVE_ONLY, max_results=1000, page_token=token))
        return {e.name: e.experiment_id for e in found if e.name.startswith(PREFIX) and e.name != REPORTS_EXPERIMENT}

    def phase_runs(self, experiments: dict[str, str], matrix: str | None = None) -> pd.DataFrame:
        """The phase runs of the experiments (name -> id); with `matrix`, only those tagged gtep.matrix=<matrix>."""
        name_of = {v: k for k, v in experiments.items()}
        where = f"tags.`gtep.matrix` = '{matrix}'" if matrix else ""
        runs = self._search(sorted(experiments.values()), "phase", where)
        self._phase_entities.update((run.info.run_id, run) for run in runs)
        return pd.DataFrame([phase_row(r, name_of[r.info.experiment_id]) for r in runs])

    def trial_runs(self, experiment_ids: list[str], phase_run_ids: Iterable[str] = ()
                   ) -> tuple[pd.DataFrame, pd.DataFrame]:
        """The trial runs (one row each) and their hyperparameter sets, long: (trial run, name, value). Of a study
        whose phase runs of `phase_run_ids` all have a snapshot (write_snapshots), from the snapshots: a file per
        phase instead of searches through its runs (a paper-scale matrix's 3,600 trial runs were half its report's
        reading: the store builds an object per tag, param and metric of each); the other studies' are searched.
        The runs come out in the search's order."""
        self._read_snapshots([run_id for run_id in phase_run_ids if run_id in self._phase_entities])
        searched = [i for i in experiment_ids if i not in self._covered]
        runs = self._search(searched, "trial") + [run for phase, (trials, _) in self._snapshots.items()
                                                  if self._experiment_of(phase) in experiment_ids for run in trials]
        runs.sort(key=lambda run: (-(run.info.start_time or 0), run.info.run_id))
        for run in runs:
            self._trials_of.setdefault(run.data.tags.get("mlflow.parentRunId", ""), []).append(run)
        trials = _frame([trial_row(r) for r in runs], trial_columns())
        return trials, trial_hparams(runs)

    def ordering_runs(self, experiment_ids: list[str], trials: dict[str, tuple[str, int]] | None = None
                      ) -> pd.DataFrame:
        """The ordering runs of the experiments. With `trials` (tuning trial run id -> its experiment id and set
        index), only those a report reads: every ordering of the phases other than tune, and of the tuning phases
        only the given trials' (H*'s): 1,200 of a paper-scale matrix's 18,600; of a study whose phases all have a
        snapshot, these are in the snapshots. Otherwise a trial's orderings are found by their run names
        (tune/set015/o0, as MlflowWriter names them: the runs table, where a tag filter would scan every tag of the
        store once per trial), checked against their parent tag, else by that tag."""
        if trials is None:  # every ordering: more than the snapshots hold
            runs = self._search(experiment_ids, "ordering")
        else:
            searched = [i for i in experiment_ids if i not in self._covered]
            runs = self._search(searched, "ordering", f"tags.`gtep.phase` != '{TUNE.name}'")
            runs += [run for phase, (_, orderings) in self._snapshots.items()
                     if self._experiment_of(phase) in experiment_ids for run in orderings]
            wanted = {trial: where for trial, where in trials.items() if where[0] in searched}
            named = [([experiment], f"attributes.run_name LIKE '{TUNE.name}/set{index:03d}/o%'")
                     for experiment, index in wanted.values()]
            missing = []
            for trial, found in zip(wanted, self._each(named)):
                own = [r for r in found if r.data.tags.get("mlflow.parentRunId") == trial]
                runs += own
                if not own:
                    missing.append(([wanted[trial][0]], f"tags.`mlflow.parentRunId` = '{trial}'"))
            for found in self._each(missing):
                runs += found
        for run in runs:
            self._orderings_of.setdefault(run.data.tags.get("mlflow.parentRunId", ""), []).append(run)
        return _frame([ordering_row(r) for r in runs], ordering_columns())

    def _experiment_of(self, phase_run_id: str) -> str:
        return str(self._phase_entities[phase_run_id].info.experiment_id)

    def _read_snapshots(self, phase_run_ids: list[str]) -> None:
        """The snapshots of the phases that have one; a study is covered when every one of its phase runs read
        here has a readable snapshot (then none of its runs is searched)."""
        tagged = [self._phase_entities[i] for i in phase_run_ids
                  if self._phase_entities[i].data.tags.get(SNAPSHOT_TAG) == SNAPSHOT_FILE]
        for phase, found in zip(tagged, self._map(self._read_snapshot, tagged)):
            if found is not None:
                self._snapshots[phase.info.run_id] = found
        studies: dict[str, list[str]] = {}
        for run_id in phase_run_ids:
            studies.setdefault(self._experiment_of(run_id), []).append(run_id)
        self._covered = {study for study, phases in studies.items() if all(p in self._snapshots for p in phases)}

    def _map(self, function: Callable[[Any], Any], items: list[Any]) -> list[Any]:
        """function over the items: at once through a server (each a round trip), one by one otherwise."""
        if is_server(self.tracking_uri) and len(items) > 1:
            from concurrent.futures import ThreadPoolExecutor

            with ThreadPoolExecutor(HISTORY_THREADS) as pool:
                return list(pool.map(function, items))
        return [function(item) for item in items]

    def _read_snapshot(self, phase: Run) -> tuple[list[Run], list[Run]] | None:
        """A phase's snapshot: (its trial runs, the ordering runs a report reads of it); None when it cannot be
        read or is not the phase's own."""
        import json
        import tempfile

        from mlflow.artifacts import download_artifacts

        os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
        with tempfile.TemporaryDirectory() as scratch:
            try:
                local = download_artifacts(artifact_uri=f"{phase.info.artifact_uri}/{SNAPSHOT_FILE}",
                                           dst_path=scratch, tracking_uri=self.tracking_uri)
                data = json.loads(Path(local).read_text())
                trials = [run_from_record(record) for record in data["trials"]]
                orderings = [run_from_record(record) for record in data["orderings"]]
            except Exception:  # noqa: BLE001 - an unreadable snapshot: the study's runs are searched instead
                return None
        ids = {run.info.run_id for run in trials}
        if not trials or any(run.data.tags.get("mlflow.parentRunId") != phase.info.run_id for run in trials) \
                or any(run.data.tags.get("mlflow.parentRunId") not in ids for run in orderings):
            return None
        return trials, orderings

    def write_snapshots(self, phase_run_ids: Iterable[str]) -> int:
        """For each finished phase run of `phase_run_ids` without one, a snapshot of the runs a report reads of it
        as the store holds them: its trial runs, and the ordering runs of H* (a tuning phase) or of every trial
        (the other phases). An artifact of the phase run (SNAPSHOT_FILE; the tag SNAPSHOT_TAG says it is there),
        so that a report reads one file per phase instead of searching (trial_runs, ordering_runs). Written by
        `gtep matrix` as each cell ends and by a report for the phases it searched. Returns how many it wrote."""
        import json
        import tempfile

        def children(experiment: str, parent: str, known: dict[str, list[Run]]) -> list[Run]:
            if parent in known:
                return known[parent]
            return _all_pages(lambda token: self.client.search_runs(
                [experiment], f"tags.`mlflow.parentRunId` = '{parent}'", ViewType.ACTIVE_ONLY, 1000,
                page_token=token))

        def settled(runs: list[Run], expected: str) -> bool:
            return bool(runs) and all(run.info.status != "RUNNING" for run in runs) and \
                (not expected.isdigit() or len(runs) == int(expected))

        def write(run_id: str) -> bool:
            phase = self._phase_entities.get(run_id) or self.client.get_run(run_id)
            tags, params, experiment = phase.data.tags, phase.data.params, phase.info.experiment_id
            if phase.info.status != "FINISHED" or tags.get("gtep.level") != "phase" or tags.get(SNAPSHOT_TAG):
                return False
            trials = [run for run in children(experiment, run_id, self._trials_of)
                      if run.data.tags.get("gtep.level") == "trial"]
            if tags.get("gtep.phase") == TUNE.name:
                shown = [tags.get("gtep.best_trial_run_id", "")]
                if shown[0] not in {run.info.run_id for run in trials}:
                    return False
            else:
                shown = [run.info.run_id for run in trials]
            orderings = {trial: [run for run in children(experiment, trial, self._orderings_of)
                                 if run.data.tags.get("gtep.level") == "ordering"] for trial in shown}
            # only a whole, settled phase: every trial it drew and every ordering of those shown, each ended (a
            # journal still catching up after a server outage would otherwise be frozen into it half-written)
            if not settled(trials, params.get("gtep.trials", "")) or not all(
                    settled(found, params.get("gtep.orderings", "")) for found in orderings.values()):
                return False
            with tempfile.TemporaryDirectory() as scratch:
                path = Path(scratch) / SNAPSHOT_FILE
                path.write_text(json.dumps({"trials": [run_record(run) for run in trials],
                                            "orderings": [run_record(run) for found in orderings.values()
                                                          for run in found]}))
                self.client.log_artifact(run_id, str(path))
            self.client.set_tag(run_id, SNAPSHOT_TAG, SNAPSHOT_FILE)  # after the file: the tag says it can be read
            return True
        return sum(self._map(write, list(dict.fromkeys(str(run_id) for run_id in phase_run_ids))))

    def _each(self, queries: list[tuple[list[str], str]]) -> list[list[Run]]:
        """Several small searches: at once from a server (each is a round trip), one by one from a local store."""
        def search(query: tuple[list[str], str]) -> list[Run]:
            return _all_pages(lambda token: self.client.search_runs(query[0], query[1], ViewType.ACTIVE_ONLY, 1000,
                                                                    page_token=token))
        return self._map(search, queries)

    def accuracy_steps(self, ordering_ids: list[str], percent: Iterable[str] = ()) -> pd.DataFrame:
        """acc_t per ordering run, as a fraction: accuracy on all classes seen after task t (step t = 1..T).
        `percent`: the runs (of ordering_ids) tagged gtep.units=percent, whose acc_t is in percent."""
        in_percent = set(percent)
        histories = self.histories(ordering_ids, "acc_t")
        rows = [{"run_id": run_id, "t": step, "acc": value / (100.0 if run_id in in_percent else 1.0)}
                for run_id in ordering_ids for step, value in histories.get(run_id, [])]
        frame = pd.DataFrame(rows, columns=STEP_COLUMNS)
        return frame.drop_duplicates(["run_id", "t"], keep="last").sort_values(["run_id", "t"]).reset_index(drop=True)

    def gacc_alpha(self, phase_ids: Iterable[str], percent: Iterable[str] = ()) -> pd.DataFrame:
        """gAcc(alpha) per (FSCIL) phase run, as a fraction: the step metric gacc_alpha at step k is gAcc at
        alpha = k / 12, averaged over sessions and the phase's orderings. `percent`: the runs tagged gtep.units=percent.
        One row per (run_id, k, alpha, gacc); a run that logged no curve has no rows."""
        in_percent, ids = set(percent), list(phase_ids)
        histories = self.histories(ids, "gacc_alpha")
        rows = [{"run_id": run_id, "k": step, "alpha": step / GACC_STEPS,
                 "gacc": value / (100.0 if run_id in in_percent else 1.0)}
                for run_id in ids for step, value in histories.get(run_id, [])]
        frame = pd.DataFrame(rows, columns=GACC_COLUMNS)
        return frame.drop_duplicates(["run_id", "k"], keep="last").sort_values(["run_id", "k"]).reset_index(drop=True)

    def family_curves(self, phases: pd.DataFrame) -> pd.DataFrame:
        """Every curve of each phase run's family table (but acc_t, drawn from the orderings, and gacc_alpha, read
        by gacc_alpha): the mean over the phase's orderings at each step, a fraction where the metric is a percent
        one. One row per (run_id, metric, step, value)."""
        wanted: dict[str, list[tuple[str, float]]] = {}  # metric -> (phase run, its scale)
        for _, phase in phases.iterrows():
            family = str(phase.get("family") or CLASS_INCREMENTAL)
            if family not in FAMILIES:
                continue
            for metric in FAMILIES.get(family).metrics:
                if not metric.curve or metric.name in ("acc_t", "gacc_alpha"):
                    continue
                scale = 100.0 if metric.percent and bool(phase.get("percent")) else 1.0
                wanted.setdefault(metric.name, []).append((str(phase["run_id"]), scale))
        rows = []
        for name, runs in wanted.items():
            histories = self.histories([run_id for run_id, _ in runs], name)
            rows += [{"run_id": run_id, "metric": name, "step": step, "value": value / scale}
                     for run_id, scale in runs for step, value in histories.get(run_id, [])]
        frame = pd.DataFrame(rows, columns=CURVE_COLUMNS)
        return frame.drop_duplicates(["run_id", "metric", "step"], keep="last").sort_values(
            ["run_id", "metric", "step"]).reset_index(drop=True)

    def log_report(self, folder: Path, selectors: list[str], matrix: str | None, metrics: dict[str, float]) -> str:
        """One run in gtep/reports with every file of the report as an artifact, so the MLflow UI shows the tables
        and plots beside the studies' runs; its description says where the phases it compares are side by side
        (their phase rows: write_phase_rows)."""
        experiment_id = self._reports_experiment()
        tags = {"gtep.level": "report", "gtep.sources": ",".join(selectors) or "*",
                "mlflow.note.content": rows_note(matrix)}
        if matrix:
            tags["gtep.matrix"] = matrix
        run = self.client.create_run(experiment_id, run_name=f"report-{time.strftime('%Y%m%d-%H%M%S')}", tags=tags)
        run_id = run.info.run_id
        try:
            now = int(time.time() * 1000)
            finite = [Metric(key, value, now, 0) for key, value in metrics.items() if math.isfinite(value)]
            for start in range(0, len(finite), 1000):  # MLflow's log_batch takes 1,000 metrics
                self.client.log_batch(run_id, metrics=finite[start:start + 1000])
            self._upload(run_id, folder)
        except BaseException:
            self.client.set_terminated(run_id, "FAILED")
            raise
        self.client.set_terminated(run_id, "FINISHED")
        return run_id

    def _upload(self, run_id: str, folder: Path) -> None:
        """The folder as the run's artifacts. Through a server each file is a request of its own: a matrix's
        report (8 groups of tables and figures) uploads its folders at once."""
        if not is_server(self.tracking_uri):
            self.client.log_artifacts(run_id, str(folder))
            return
        items = sorted(folder.iterdir())

        def upload(path: Path) -> None:
            if path.is_dir():
                self.client.log_artifacts(run_id, str(path), artifact_path=path.name)
            else:
                self.client.log_artifact(run_id, str(path))
        self._map(upload, items)

    def write_phase_rows(self, phase_run_ids: Iterable[str], matrix: str | None = None) -> int:
        """A run in gtep/reports for each finished phase run of `phase_run_ids` that has none yet (its phase row:
        phase_row_record), so that a matrix's phases are one experiment's runs table in the MLflow UI: MLflow's
        compare-experiments view asks for every experiment once per experiment it shows (N^2 requests: 6 minutes
        over a paper-scale matrix's 120 studies; benchmarks/ui_compare_requests.py). `gtep matrix` writes a
        cell's rows when the cell ends; a report writes those still missing (studies run alone, older stores).
        Returns how many it wrote."""
        wanted = list(dict.fromkeys(str(run_id) for run_id in phase_run_ids))
        if not wanted:
            return 0
        experiment_id = self._reports_experiment()
        existing = _all_pages(lambda token: self.client.search_runs(
            [experiment_id], phase_rows_filter(matrix), ViewType.ACTIVE_ONLY, 1000, page_token=token))
        have = {run.data.tags.get(PHASE_RUN_TAG) for run in existing}
        missing = [run_id for run_id in wanted if run_id not in have]
        names: dict[str, str] = {}

        def write(run_id: str) -> bool:
            run = self._phase_entities.get(run_id) or self.client.get_run(run_id)
            if run.info.status != "FINISHED":  # its numbers may still change: written once it has finished
                return False
            experiment = names.get(run.info.experiment_id) or self.client.get_experiment(run.info.experiment_id).name
            names[run.info.experiment_id] = experiment
            name, tags, params, metrics = phase_row_record(run, experiment)
            row = self.client.create_run(experiment_id, run_name=name, tags=tags, start_time=run.info.start_time)
            self.client.log_batch(row.info.run_id, metrics=metrics, params=params)
            self.client.set_terminated(row.info.run_id, "FINISHED", end_time=run.info.end_time)
            return True
        return sum(self._map(write, missing))  # three round trips a row: 240 rows of a matrix, at once

    def json_artifact(self, run_id: str, name: str) -> dict[str, Any] | None:
        """A JSON artifact of a run (an evaluate_sets phase's protocol_regret.json); None when it has none."""
        import json
        import tempfile

        # MLflow draws a progress bar per download on stderr; a report reads one small file per study
        os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
        with tempfile.TemporaryDirectory() as scratch:
            try:
                local = self.client.download_artifacts(run_id, name, scratch)
                data = json.loads(Path(local).read_text())
            except Exception:  # noqa: BLE001 - a missing or unreadable artifact: the report says the table is absent
                return None
        return data if isinstance(data, dict) else None

    def histories(self, run_ids: list[str], key: str) -> dict[str, list[tuple[int, float]]]:
        """Each run's history of `key` as (step, value) points in logging order, read in bulk: through a server,
        MLflow's get-history-bulk route (100 runs a request, one SQL query each); from a local store, its one
        query over all the runs. A paper-scale report reads 1,200 histories: one request per run cost a round
        trip each. A store without the bulk read (another backend) is read run by run."""
        ids = list(dict.fromkeys(run_ids))
        if not ids:
            return {}
        store = getattr(self.client, "_tracking_client", None)
        store = getattr(store, "store", None)
        chunks = [ids[i:i + BULK_RUNS] for i in range(0, len(ids), BULK_RUNS)]
        if is_server(self.tracking_uri) and callable(getattr(store, "get_host_creds", None)):
            read = self._bulk_from_server(store, key)
        elif callable(bulk := getattr(store, "get_metric_history_bulk", None)):
            def read(chunk: list[str]) -> dict[str, list[tuple[int, float]]]:
                found = bulk(chunk, key, max_results=BULK_POINTS)
                if len(found) >= BULK_POINTS:  # cut short: read these runs one by one
                    return self._one_by_one(chunk, key)
                points: dict[str, list[tuple[int, float]]] = {}
                for item in found:
                    points.setdefault(item.run_id, []).append((int(item.step), float(item.value)))
                return points
        else:
            read = lambda chunk: self._one_by_one(chunk, key)  # noqa: E731
        out: dict[str, list[tuple[int, float]]] = {}
        for part in self._map(read, chunks):
            out.update(part)
        return out

    def _bulk_from_server(self, store: Any, key: str) -> Callable[[list[str]], dict[str, list[tuple[int, float]]]]:
        from mlflow.utils.rest_utils import http_request, verify_rest_response

        endpoint = "/ajax-api/2.0/mlflow/metrics/get-history-bulk"

        def read(chunk: list[str]) -> dict[str, list[tuple[int, float]]]:
            response = http_request(store.get_host_creds(), endpoint, "GET",
                                    params={"run_id": chunk, "metric_key": key, "max_results": BULK_POINTS})
            if response.status_code == 404:  # a server older than the route
                return self._one_by_one(chunk, key)
            found = verify_rest_response(response, endpoint).json().get("metrics", [])
            if len(found) >= BULK_POINTS:
                return self._one_by_one(chunk, key)
            points: dict[str, list[tuple[int, float]]] = {}
            for item in sorted(found, key=lambda m: (m["run_id"], int(m.get("timestamp", 0)), int(m.get("step", 0)))):
                points.setdefault(item["run_id"], []).append((int(item.get("step", 0)), float(item["value"])))
            return points
        return read

    def _one_by_one(self, run_ids: list[str], key: str) -> dict[str, list[tuple[int, float]]]:
        return {run_id: [(int(m.step), float(m.value)) for m in self.client.get_metric_history(run_id, key)]
                for run_id in run_ids}

    def _search(self, experiment_ids: list[str], level: str, extra: str = "") -> list[Run]:
        """The runs of a level in the experiments, in MLflow's order (newest first). Through a server, many
        experiments are searched in groups at once: one search pages through them 1,000 runs a round trip
        (a paper-scale matrix's 3,720 trial runs: four in a row)."""
        if not experiment_ids:
            return []
        query = f"tags.`gtep.level` = '{level}'" + (f" and {extra}" if extra else "")
        if not is_server(self.tracking_uri) or len(experiment_ids) <= SEARCH_GROUP:
            return self._each([(experiment_ids, query)])[0]
        groups = [experiment_ids[i:i + SEARCH_GROUP] for i in range(0, len(experiment_ids), SEARCH_GROUP)]
        found = [run for part in self._each([(group, query) for group in groups]) for run in part]
        return sorted(found, key=lambda run: (-(run.info.start_time or 0), run.info.run_id))

    def _reports_experiment(self) -> str:
        """gtep/reports, created once. Beside a sqlite store its artifacts go to <store folder>/mlartifacts/reports,
        as the studies' do, rather than into whatever folder the command runs in."""
        existing = self.client.get_experiment_by_name(REPORTS_EXPERIMENT)
        if existing is not None:
            return str(existing.experiment_id)
        path = sqlite_path(self.tracking_uri)
        root = None if path is None else private_folder(path.resolve().parent / "mlartifacts")
        location = None if root is None else (root / "reports").as_uri()
        return str(self.client.create_experiment(REPORTS_EXPERIMENT, artifact_location=location))


def phase_rows_filter(matrix: str | None = None) -> str:
    """The gtep/reports runs-table filter that shows the phase rows (of one matrix)."""
    where = f"tags.`gtep.level` = '{PHASE_ROW}'"
    return where + (f" and tags.`gtep.matrix` = '{matrix}'" if matrix else "")


def rows_note(matrix: str | None) -> str:
    return ("The phases it compares, one row each: filter the runs table of this experiment by "
            f"`{phase_rows_filter(matrix)}`" + ("" if matrix else " (add `and params.study = '<study>'` to "
                                                "narrow it)") + ".")


def _all_pages(fetch: Callable[[str | None], Any]) -> list[Any]:
    items: list[Any] = []
    token = None
    while True:
        page = fetch(token)
        items.extend(page)
        token = page.token
        if not token:
            return items


def _frame(rows: list[dict[str, Any]], columns: list[str]) -> pd.DataFrame:
    """Rows as a frame that keeps its columns when there are no rows (an empty study still joins cleanly)."""
    return pd.DataFrame(rows) if rows else pd.DataFrame(columns=columns)


# ---------------------------------------------------------------- runs as rows

def in_percent(run: Run) -> bool:
    return run.data.tags.get(UNITS_TAG, "") == "percent"


def _metrics(run: Run, names: Iterable[str]) -> dict[str, float]:
    """The run's metrics, accuracies as fractions whatever unit the run was logged in (gtep.units)."""
    scale = 100.0 if in_percent(run) else 1.0
    shown = percent_metrics()
    return {name: float(run.data.metrics.get(name, math.nan)) / (scale if name in shown else 1.0)
            for name in names}


def family_tags(run: Run) -> dict[str, str]:
    """The run's scenario family and H*'s selection criterion; a run older than the tags is class-incremental."""
    family = run.data.tags.get(FAMILY_TAG) or CLASS_INCREMENTAL
    return {"family": family, "criterion": run.data.tags.get(CRITERION_TAG) or default_criterion(family)}


def phase_label(run: Run) -> str:
    """tune | evaluate | original | conventional. An evaluation with the `original` preset is still written as an
    `evaluate` phase run with gtep.hparams_source=preset:original; both spellings mean the paper's "Original"."""
    tags = run.data.tags
    phase = tags.get("gtep.phase", "")
    source = tags.get("gtep.hparams_source", "")
    if phase == EVALUATE.name and source.startswith("preset:"):
        return str(source[len("preset:"):])
    return str(phase)


def phase_row(run: Run, experiment: str) -> dict[str, Any]:
    tags, params = run.data.tags, run.data.params
    tag = {column: tags.get(f"gtep.{name}", "") for column, name in (
        ("attempt", "attempt"), ("matrix", "matrix"), ("cell", "cell"), ("scenario_tag", "scenario"),
        ("pairing_tag", "pairing"), ("similarity_tag", "similarity"), ("hparams_source", "hparams_source"),
        ("tuning_run_id", "tuning_run_id"), ("best_trial_run_id", "best_trial_run_id"),
        ("best_set_index_tag", "best_set_index"), ("status_tag", "status"), ("orderings_tag", "orderings"),
        ("reason_tag", "reason"), ("importance_tag", "importance"))}
    metrics = _metrics(run, (*PHASE_METRICS, *scored_metrics()))
    if phase_label(run) == TUNE.name:  # H*'s numbers under either name
        for best, plain in BEST_ALIASES:
            value = metrics[best] if not math.isnan(metrics[best]) else metrics[plain]
            metrics[best] = metrics[plain] = value
    param = {name: params.get(f"gtep.{name}", "") for name in ("algorithm", "backbone", "dataset", "increments",
                                                                 "selection", "protocol", "protocol_tasks",
                                                                 "scheduler")}
    return {"run_id": run.info.run_id, "experiment": experiment,
            "study": tags.get("gtep.study", experiment[len(PREFIX):]), "phase": phase_label(run),
            "status": run.info.status, "start_time": run.info.start_time or 0, "percent": in_percent(run),
            **family_tags(run), **tag, **param, **metrics}


def phase_row_record(run: Run, experiment: str) -> tuple[str, dict[str, str], list[Param], list[Metric]]:
    """A finished phase run as its row in gtep/reports: (run name, tags, params, metrics). Its study, algorithm,
    backbone, phase, scenario and pairing as params; its metrics as the phase run logged them (the same units: its
    gtep.units tag comes along), so the row and the phase run read the same in the UI; the tag gtep.phase_run
    names the phase run."""
    row = phase_row(run, experiment)
    tags = {"gtep.level": PHASE_ROW, PHASE_RUN_TAG: run.info.run_id, "gtep.study": str(row["study"])}
    tags.update({f"gtep.{name}": run.data.tags[f"gtep.{name}"] for name in ("matrix", "cell", "units", "attempt")
                 if run.data.tags.get(f"gtep.{name}")})
    params = {"study": row["study"], "algorithm": row["algorithm"], "backbone": row["backbone"],
              "phase": row["phase"], "scenario": row["scenario_tag"] or row["increments"],
              "pairing": row["pairing_tag"] or row["dataset"]}
    stamp = run.info.end_time or run.info.start_time or 0
    metrics = [Metric(key, float(value), stamp, 0) for key, value in sorted(run.data.metrics.items())
               if math.isfinite(float(value))]
    return (f"{row['study']} {row['phase']}", tags, [Param(k, str(v)) for k, v in params.items() if v != ""],
            metrics)


def trial_row(run: Run) -> dict[str, Any]:
    return {"run_id": run.info.run_id, "phase_run_id": run.data.tags.get("mlflow.parentRunId", ""),
            "set_index": int(run.data.tags.get("gtep.set_index", -1)), "status": run.info.status,
            "set_status": run.data.tags.get("gtep.status", ""),
            "orderings_tag": run.data.tags.get("gtep.orderings", ""),
            "start_time": run.info.start_time or 0, **family_tags(run),
            **_metrics(run, (*TRIAL_METRICS, *scored_metrics()))}


def ordering_row(run: Run) -> dict[str, Any]:
    tags = run.data.tags
    diverged = tags.get("gtep.status") == "diverged" or run.data.metrics.get("diverged", 0) > 0
    return {"run_id": run.info.run_id, "trial_run_id": tags.get("mlflow.parentRunId", ""),
            "set_index": int(tags.get("gtep.set_index", -1)), "ordering": int(tags.get("gtep.ordering", -1)),
            "status": "diverged" if diverged else tags.get("gtep.status", "finished"), "run_status": run.info.status,
            "end_time": run.info.end_time or 0, "percent": in_percent(run), **family_tags(run),
            **_metrics(run, (*ORDERING_METRICS, *all_family_metrics()))}


def run_record(run: Run) -> dict[str, Any]:
    """A run as a trial snapshot keeps it: what trial_row and trial_hparams read (latest metric values)."""
    info = run.info
    return {"run_id": info.run_id, "experiment_id": info.experiment_id, "run_name": info.run_name,
            "status": info.status, "start_time": info.start_time, "end_time": info.end_time,
            "artifact_uri": info.artifact_uri, "metrics": dict(run.data.metrics), "params": dict(run.data.params),
            "tags": dict(run.data.tags)}


def run_from_record(record: dict[str, Any]) -> Run:
    from mlflow.entities import RunData, RunInfo, RunTag

    info = RunInfo(run_id=record["run_id"], experiment_id=record["experiment_id"], user_id="",
                   status=record["status"], start_time=record["start_time"], end_time=record["end_time"],
                   lifecycle_stage="active", artifact_uri=record.get("artifact_uri"), run_name=record["run_name"])
    data = RunData(metrics=[Metric(k, float(v), 0, 0) for k, v in record["metrics"].items()],
                   params=[Param(k, str(v)) for k, v in record["params"].items()],
                   tags=[RunTag(k, str(v)) for k, v in record["tags"].items()])
    return Run(info, data)


def trial_hparams(trial_runs: list[Run]) -> pd.DataFrame:
    """Each trial's hyperparameter set: its params without the gtep.* ones common to the study."""
    rows = [{"trial_run_id": run.info.run_id, "name": k, "value": v} for run in trial_runs
            for k, v in sorted(run.data.params.items()) if not k.startswith("gtep.")]
    return pd.DataFrame(rows, columns=HPARAM_COLUMNS)
