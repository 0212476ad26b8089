"""The MLflow store as pandas frames (read only), and the report run that logs a report's files.

This is the report's only MLflow importer. It reads the lineage `gtep.orchestration.tracking` writes:

    phase run (gtep.level=phase)  >  trial run (gtep.level=trial)  >  ordering run (gtep.level=ordering, acc_t steps)

and keeps, per (study, matrix cell, phase label), the latest phase run that ended: FINISHED, or FAILED because
its orderings diverged (the paper shows those as NaN, Tables 7-13 for BEEF). Nothing is re-run.
"""
from __future__ import annotations

import fnmatch
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import pandas as pd
from mlflow.entities import Run, ViewType
from mlflow.tracking import MlflowClient

from gtep.config import ConfigError

PREFIX = "gtep/"
REPORTS_EXPERIMENT = "gtep/reports"
EVALUATE_LIKE = ("evaluate", "original", "conventional")  # phases that train one set over S orderings
PHASE_METRICS = ("acc", "acc_std", "avg_acc", "avg_acc_std", "hmean", "diverged", "best_hmean", "best_acc",
                 "best_avg_acc", "best_acc_std", "best_avg_acc_std", "best_set_index")
TRIAL_METRICS = ("acc", "acc_std", "avg_acc", "avg_acc_std", "hmean", "mean_of_hmeans", "diverged_orderings",
                 "orderings")
ORDERING_METRICS = ("acc", "avg_acc", "hmean", "forgetting", "old_acc", "new_acc", "params_total",
                    "params_trainable", "train_seconds", "diverged")


@dataclass
class StoreData:
    """What a report reads. `phases`: one row per selected phase run; `trials`: the tuning trials of the selected
    tune phases; `hparams`: their hyperparameter sets, long (trial run, name, value); `orderings`: the ordering runs
    under the selected phases; `steps`: acc_t of the evaluation-like orderings, long (run, t, acc)."""
    phases: pd.DataFrame
    trials: pd.DataFrame
    hparams: pd.DataFrame
    orderings: pd.DataFrame
    steps: pd.DataFrame


# ---------------------------------------------------------------- the store and its experiments

def sqlite_path(tracking_uri: str) -> Path | None:
    return Path(tracking_uri[len("sqlite:///"):]) if tracking_uri.startswith("sqlite:///") else None


def open_store(tracking_uri: str, option: str = "--tracking-uri") -> MlflowClient:
    """A client on an existing store. A missing sqlite file is an error, not a new empty store."""
    path = sqlite_path(tracking_uri)
    if path is not None and not path.exists():
        raise ConfigError(option, f"there is no MLflow store at {path}; pass the --output folder of the runs "
                          "(gtep run wrote <output>/mlflow.db) or their --tracking-uri")
    client = MlflowClient(tracking_uri=tracking_uri)
    try:
        client.search_experiments(max_results=1)
    except Exception as err:  # noqa: BLE001 - a server that is away surfaces as several MLflow/requests types
        raise ConfigError(option, f"the MLflow store at {tracking_uri} does not answer "
                          f"({err.__class__.__name__}); start it or give another --tracking-uri") from None
    return client


def _all_pages(fetch) -> list[Any]:
    items, token = [], None
    while True:
        page = fetch(token)
        items.extend(page)
        token = page.token
        if not token:
            return items


def study_experiments(client: MlflowClient) -> dict[str, str]:
    """Every gtep study experiment (name -> id); the reports' own experiment is not a study."""
    found = _all_pages(lambda token: client.search_experiments(view_type=ViewType.ACTIVE_ONLY, max_results=1000,
                                                               page_token=token))
    return {e.name: e.experiment_id for e in found if e.name.startswith(PREFIX) and e.name != REPORTS_EXPERIMENT}


def match_experiments(client: MlflowClient, selectors: list[str], matrix: str | None) -> dict[str, str]:
    """Selectors are study names (`tiny`), experiment names (`gtep/tiny`) or shell globs over either (`gtep/mx-*`).
    Every selector must match something, so a typo is an error rather than a silently smaller report."""
    known = study_experiments(client)
    if not selectors:
        if matrix is None:
            raise ConfigError("SELECTORS", "name at least one study or experiment (e.g. tiny, gtep/tiny, "
                              "'gtep/mx-*'), or --matrix NAME")
        return known
    chosen: dict[str, str] = {}
    for selector in selectors:
        pattern = selector if selector.startswith(PREFIX) else PREFIX + selector
        hits = [name for name in known if fnmatch.fnmatchcase(name, pattern)]
        if not hits:
            listing = ", ".join(sorted(known)[:12]) or "none"
            raise ConfigError("SELECTORS", f"{selector!r} matches no experiment in the store (gtep experiments: "
                              f"{listing}); give a study name, gtep/<study> or a glob such as 'gtep/tiny-*'")
        chosen.update({name: known[name] for name in hits})
    return chosen


def search_level(client: MlflowClient, experiment_ids: list[str], level: str, extra: str = "") -> list[Run]:
    query = f"tags.`gtep.level` = '{level}'" + (f" and {extra}" if extra else "")
    return _all_pages(lambda token: client.search_runs(experiment_ids, query, ViewType.ACTIVE_ONLY, 1000,
                                                       page_token=token))


# ---------------------------------------------------------------- runs as rows

def _metrics(run: Run, names: Iterable[str]) -> dict[str, float]:
    return {name: float(run.data.metrics.get(name, math.nan)) for name in names}


def phase_label(run: Run) -> str:
    """tune | evaluate | original | conventional. An evaluation with the `original` preset is still written as an
    `evaluate` phase run with gtep.hparams_source=preset:original; both spellings mean the paper's "Original"."""
    tags = run.data.tags
    phase = tags.get("gtep.phase", "")
    source = tags.get("gtep.hparams_source", "")
    if phase == "evaluate" and source.startswith("preset:"):
        return source[len("preset:"):]
    return phase


def phase_row(run: Run, experiment: str) -> dict[str, Any]:
    tags, params = run.data.tags, run.data.params
    tag = {column: tags.get(f"gtep.{name}", "") for column, name in (
        ("attempt", "attempt"), ("matrix", "matrix"), ("cell", "cell"), ("scenario_tag", "scenario"),
        ("pairing_tag", "pairing"), ("similarity_tag", "similarity"), ("hparams_source", "hparams_source"),
        ("tuning_run_id", "tuning_run_id"), ("best_trial_run_id", "best_trial_run_id"),
        ("best_set_index_tag", "best_set_index"))}
    param = {name: params.get(f"gtep.{name}", "") for name in ("algorithm", "backbone", "dataset", "increments",
                                                                 "selection")}
    return {"run_id": run.info.run_id, "experiment": experiment,
            "study": tags.get("gtep.study", experiment[len(PREFIX):]), "phase": phase_label(run),
            "status": run.info.status, "start_time": run.info.start_time or 0, **tag, **param,
            **_metrics(run, PHASE_METRICS)}


def trial_row(run: Run) -> dict[str, Any]:
    return {"run_id": run.info.run_id, "phase_run_id": run.data.tags.get("mlflow.parentRunId", ""),
            "set_index": int(run.data.tags.get("gtep.set_index", -1)), "status": run.info.status,
            "start_time": run.info.start_time or 0, **_metrics(run, TRIAL_METRICS)}


def ordering_row(run: Run) -> dict[str, Any]:
    tags = run.data.tags
    diverged = tags.get("gtep.status") == "diverged" or run.data.metrics.get("diverged", 0) > 0
    return {"run_id": run.info.run_id, "trial_run_id": tags.get("mlflow.parentRunId", ""),
            "set_index": int(tags.get("gtep.set_index", -1)), "ordering": int(tags.get("gtep.ordering", -1)),
            "status": "diverged" if diverged else tags.get("gtep.status", "finished"), "run_status": run.info.status,
            "end_time": run.info.end_time or 0, **_metrics(run, ORDERING_METRICS)}


# ---------------------------------------------------------------- choosing the phase runs

def usable(phase: pd.Series, trials: pd.DataFrame) -> bool:
    """FINISHED, or FAILED because of divergence: an evaluation with diverged orderings, or a tuning phase whose
    every set diverged (no H* could be selected). A crashed or still running phase is not reported."""
    if phase["status"] == "FINISHED":
        return True
    if phase["status"] != "FAILED":
        return False
    if phase["phase"] == "tune":
        own = trials[trials["phase_run_id"] == phase["run_id"]]
        return bool(len(own)) and bool((own["diverged_orderings"].fillna(0) > 0).all())
    return bool(phase["diverged"] > 0)


def latest_phases(phases: pd.DataFrame, trials: pd.DataFrame) -> pd.DataFrame:
    """The latest usable phase run per (study, cell, phase label): a re-run replaces the earlier attempt."""
    if phases.empty:
        return phases
    ok = phases[[usable(row, trials) for _, row in phases.iterrows()]]
    ok = ok.sort_values("start_time", kind="stable")
    latest = ok.groupby(["experiment", "study", "cell", "phase"], as_index=False, sort=False).tail(1)
    return latest.reset_index(drop=True)


def label_groups(phases: pd.DataFrame) -> pd.DataFrame:
    """Scenario, dataset pairing and similarity of every phase run, taken per (study, cell) so all phases of one
    study land in one paper table: the matrix tags when present; otherwise the increments and
    "<D^HT> → <D^E>" from the tune and evaluate phases' datasets (same dataset split = high similarity)."""
    out = phases.copy()
    scenario, pairing, similarity = [], [], []
    for _, row in out.iterrows():
        mates = out[(out["experiment"] == row["experiment"]) & (out["cell"] == row["cell"])]
        tuned = _first(mates, ("tune", "conventional"), "dataset")
        evaluated = _first(mates, EVALUATE_LIKE[:2], "dataset")
        scenario.append(row["scenario_tag"] or row["increments"])
        pairing.append(row["pairing_tag"] or f"{tuned or '?'} → {evaluated or '?'}")
        derived = "" if not (tuned and evaluated) else "high" if tuned == evaluated else "low"
        similarity.append(row["similarity_tag"] or derived)
    out["scenario"], out["pairing"], out["similarity"] = scenario, pairing, similarity
    return out


def _first(mates: pd.DataFrame, labels: tuple[str, ...], column: str) -> str:
    for label in labels:
        values = mates.loc[mates["phase"] == label, column]
        if len(values):
            return str(values.iloc[0])
    return ""


# ---------------------------------------------------------------- everything a report needs

def collect(client: MlflowClient, selectors: list[str], matrix: str | None = None) -> StoreData:
    """Read the selected studies: phase runs (latest usable per label), their trials, orderings and acc_t steps."""
    if matrix is not None and not matrix.replace("-", "").replace("_", "").replace(".", "").isalnum():
        raise ConfigError("--matrix", f"{matrix!r} is not a matrix name (letters, digits, '-', '_', '.')")
    experiments = match_experiments(client, selectors, matrix)
    ids = sorted(experiments.values())
    name_of = {v: k for k, v in experiments.items()}
    where = f"tags.`gtep.matrix` = '{matrix}'" if matrix else ""
    phase_runs = search_level(client, ids, "phase", where) if ids else []
    if not phase_runs:
        scope = f" tagged gtep.matrix={matrix}" if matrix else ""
        raise ConfigError("SELECTORS", f"no phase runs{scope} in {', '.join(sorted(experiments)) or 'the store'}; "
                          "run gtep run (or gtep matrix) first, or name other studies")
    phases = pd.DataFrame([phase_row(r, name_of[r.info.experiment_id]) for r in phase_runs])
    trial_runs = search_level(client, ids, "trial")
    trials = _frame([trial_row(r) for r in trial_runs],
                    ["run_id", "phase_run_id", "set_index", "status", "start_time", *TRIAL_METRICS])
    phases = label_groups(latest_phases(phases, trials))
    if phases.empty:
        raise ConfigError("SELECTORS", "the selected studies have no finished phase run yet (only running or "
                          "crashed ones); wait for them or resume them (gtep run --resume)")
    trials = trials[trials["phase_run_id"].isin(phases["run_id"])].reset_index(drop=True)
    orderings = _frame([ordering_row(r) for r in search_level(client, ids, "ordering")],
                       ["run_id", "trial_run_id", "set_index", "ordering", "status", "run_status", "end_time",
                        *ORDERING_METRICS])
    orderings = orderings.merge(trials[["run_id", "phase_run_id"]].rename(columns={"run_id": "trial_run_id"}),
                                on="trial_run_id", how="inner")
    # a unit logged twice (should not happen: writes are idempotent) counts once, the latest
    orderings = orderings.sort_values("end_time", kind="stable").drop_duplicates(
        ["trial_run_id", "ordering"], keep="last").reset_index(drop=True)
    trials_tuned = trials[trials["phase_run_id"].isin(phases.loc[phases["phase"] == "tune", "run_id"])]
    tuned_ids = set(trials_tuned["run_id"])
    hparams = trial_hparams([r for r in trial_runs if r.info.run_id in tuned_ids])
    evaluated = phases.loc[phases["phase"].isin(EVALUATE_LIKE), "run_id"]
    steps = accuracy_steps(client, orderings.loc[orderings["phase_run_id"].isin(evaluated), "run_id"].tolist())
    return StoreData(phases, trials_tuned.reset_index(drop=True), hparams, orderings, steps)


def _frame(rows: list[dict[str, Any]], columns: list[str]) -> pd.DataFrame:
    """Rows as a frame that keeps its columns when there are no rows (an empty study still joins cleanly)."""
    return pd.DataFrame(rows) if rows else pd.DataFrame(columns=columns)


def trial_hparams(trial_runs: list[Run]) -> pd.DataFrame:
    """Each tuning trial's hyperparameter set: its params without the gtep.* ones common to the study."""
    rows = [{"trial_run_id": run.info.run_id, "name": k, "value": v} for run in trial_runs
            for k, v in sorted(run.data.params.items()) if not k.startswith("gtep.")]
    return pd.DataFrame(rows, columns=["trial_run_id", "name", "value"])


def accuracy_steps(client: MlflowClient, ordering_ids: list[str]) -> pd.DataFrame:
    """acc_t per ordering run: accuracy on all classes seen after task t (step t = 1..T)."""
    rows = []
    for run_id in ordering_ids:
        for point in client.get_metric_history(run_id, "acc_t"):
            rows.append({"run_id": run_id, "t": int(point.step), "acc": float(point.value)})
    frame = pd.DataFrame(rows, columns=["run_id", "t", "acc"])
    return frame.drop_duplicates(["run_id", "t"], keep="last").sort_values(["run_id", "t"]).reset_index(drop=True)


# ---------------------------------------------------------------- the report run

def reports_experiment(client: MlflowClient, tracking_uri: str) -> str:
    """gtep/reports, created once. Beside a sqlite store its artifacts go to <store folder>/mlartifacts/reports,
    as the studies' do, rather than into whatever folder the command runs in."""
    existing = client.get_experiment_by_name(REPORTS_EXPERIMENT)
    if existing is not None:
        return existing.experiment_id
    path = sqlite_path(tracking_uri)
    location = (path.resolve().parent / "mlartifacts" / "reports").as_uri() if path is not None else None
    return client.create_experiment(REPORTS_EXPERIMENT, artifact_location=location)


def log_report_run(client: MlflowClient, tracking_uri: str, folder: Path, selectors: list[str],
                   matrix: str | None, metrics: dict[str, float]) -> str:
    """One run in gtep/reports with every file of the report as an artifact, so the MLflow UI shows the tables
    and plots beside the studies' runs."""
    experiment_id = reports_experiment(client, tracking_uri)
    tags = {"gtep.level": "report", "gtep.sources": ",".join(selectors) or "*"}
    if matrix:
        tags["gtep.matrix"] = matrix
    run = client.create_run(experiment_id, run_name=f"report-{time.strftime('%Y%m%d-%H%M%S')}", tags=tags)
    run_id = run.info.run_id
    try:
        for key, value in metrics.items():
            if math.isfinite(value):
                client.log_metric(run_id, key, value)
        client.log_artifacts(run_id, str(folder))
    except Exception:
        client.set_terminated(run_id, "FAILED")
        raise
    client.set_terminated(run_id, "FINISHED")
    return run_id
