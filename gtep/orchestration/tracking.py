"""MLflow lineage, written by one writer on the driver through the study's tracking journal.

experiment gtep/<study>
  phase run     `tune`, `evaluate`, ... (gtep.level=phase; params = the set it ran or selected; acc, avg_acc,
                hmean and their _std; a Markdown note with its table; artifacts manifest.json, best.yaml, CSV)
    trial run   `tune/set003`, `evaluate/H*` (gtep.level=trial: one hyperparameter set; aggregate metrics)
      ordering run `tune/set003/o1`, `evaluate/o0` (gtep.level=ordering: params = the set + ordering; acc,
                avg_acc, hmean; acc_t per step; started and ended when the ordering trained)

Metrics that are accuracies go to MLflow in percent, rounded to 4 decimals (percent_metrics(); every run is tagged
gtep.units=percent), so the UI shows what the terminal and the report print; the study's files keep fractions.

Workers only report to Ray Tune; this callback turns the reports into runs, which avoids SQLite locking
and the experiment-creation race of per-worker MLflow clients (ray-project/ray#19909, mlflow/mlflow#10334).
Writes go through `TrackingJournal`, so a tracking server that is away costs no metric, and a resumed
study writes into the runs it started instead of duplicating them.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Callable, Iterable

from mlflow.tracking import MlflowClient
from ray import tune

from gtep.orchestration.journal import TrackingJournal, now_ms
from gtep.orchestration.study import Manifest
from gtep.protocol.criteria import DEFAULT_CRITERION, Criterion
from gtep.protocol.families import CLASS_INCREMENTAL, FAMILIES, ScenarioFamily, known_metrics, metric_label
from gtep.protocol.metrics import harmonic_mean
from gtep.protocol.phases import Phase
from gtep.protocol.selection import OrderingResult, score_set
from gtep.protocol.summary import ordering_statistics

ORDERING_METRICS = ("acc", "avg_acc", "hmean", "forgetting", "old_acc", "new_acc",
                    "params_total", "params_trainable", "train_seconds")
# Besides the families' own metrics (their tables: gtep/protocol/families/ Metric), what every phase and trial
# run logs in percent: the HM of the orderings, the criterion's score.
PERCENT_SUMMARIES = frozenset({"hmean_std", "mean_of_hmeans", "score", "score_std", "score_mean_of_orderings"})
UNITS_TAG = {"gtep.units": "percent"}


def percent_metrics() -> frozenset[str]:
    """The metrics MLflow gets in percent: every registered family's percent metrics, scalars with their `_std`,
    curves, and PERCENT_SUMMARIES (read from the registry each time: a plugin's family counts once loaded)."""
    names = set(PERCENT_SUMMARIES)
    for metric in known_metrics().values():
        if metric.percent:
            names.update((metric.name,) if metric.curve else (metric.name, f"{metric.name}_std"))
    return frozenset(names)


def step_metrics() -> dict[str, int]:
    """Per-ordering lists logged as step metrics, with the step of their first point: one value per task (step t =
    task t, from 1), or a curve over its points (gacc_alpha: step k = alpha k/12, from 0). Every family's curves."""
    return {m.name: m.first_step for m in known_metrics().values() if m.curve}


def family_extra_metrics(family: ScenarioFamily) -> tuple[str, ...]:
    """A family's scalar metrics beyond the ones every study logs (ORDERING_METRICS)."""
    return tuple(m for m in family.metric_names if m not in ORDERING_METRICS)


def scenario_tags(family: ScenarioFamily, criterion: Criterion) -> dict[str, str]:
    """On every run of a study: its scenario family and H*'s criterion (what `gtep report` groups and shows by)."""
    return {"gtep.family": family.name, "gtep.criterion": criterion.name}


def step_points(result: dict[str, Any]) -> list[tuple[str, float, int]]:
    """The (name, percent value, step) points of an ordering's (or a phase's) step metrics."""
    shown = percent_metrics()
    return [(name, percent(v) if name in shown else float(v), first + i) for name, first in step_metrics().items()
            for i, v in enumerate(result.get(name) or []) if _finite(v)]


def percent(value: float) -> float:
    """A fraction as the percent MLflow shows (0.5700000058859587 -> 57.0)."""
    return round(100.0 * float(value), 4)


def as_logged(values: dict[str, Any]) -> dict[str, float]:
    """Metrics as they go to MLflow: accuracies in percent, counts and seconds as they are."""
    shown = percent_metrics()
    return {k: percent(v) if k in shown else float(v) for k, v in values.items()}


def experiment_name(study: str) -> str:
    return f"gtep/{study}"


def ensure_experiment(client: MlflowClient, study: str, artifact_root: Path | None) -> str:
    """Create or find the study's experiment once, on the driver (no race between trials)."""
    name = experiment_name(study)
    existing = client.get_experiment_by_name(name)
    if existing is not None:
        experiment_id = existing.experiment_id
        if any(existing.tags.get(k) != v for k, v in experiment_tags().items()):
            set_experiment_tags(client, experiment_id)
        return experiment_id
    location = (artifact_root / study).resolve().as_uri() if artifact_root else None
    experiment_id = client.create_experiment(name, artifact_location=location, tags=experiment_tags())
    return experiment_id


# ---- the MLflow UI ---------------------------------------------------------------------------------
# MLflow 3 opens an experiment by its kind (tag mlflow.experimentKind): without one, a new experiment opens on
# the GenAI overview (traces, token usage). A gtep study is model development: it opens on its runs. The views
# are MLflow's shared view states (experiment tag mlflow.sharedViewState.<key>, opened by ?viewStateShareKey=
# <key>): the runs table with the columns that compare the phases, and the orderings charted by phase.
EXPERIMENT_KIND = "custom_model_development"
RUNS_VIEW, ORDERINGS_VIEW = "gtep-runs", "gtep-orderings"
SHARED_VIEW_TAG = "mlflow.sharedViewState."
VIEW_COLUMNS = ["tags.`gtep.phase`", "metrics.`acc`", "metrics.`avg_acc`", "metrics.`hmean`", "metrics.`acc_std`",
                "metrics.`avg_acc_std`", "tags.`gtep.dataset`", "tags.`gtep.status`", "tags.`gtep.orderings`"]
GROUP_BY_PHASE = {"aggregateFunction": "average", "groupByKeys": [{"mode": "tag", "groupByData": "gtep.phase"}]}


def experiment_tags() -> dict[str, str]:
    runs = {"searchFilter": "tags.`gtep.level` = 'phase'", "orderByKey": "attributes.start_time",
            "orderByAsc": True, "selectedColumns": VIEW_COLUMNS}
    orderings = {"searchFilter": "tags.`gtep.level` = 'ordering'", "orderByKey": "attributes.start_time",
                 "orderByAsc": True, "selectedColumns": VIEW_COLUMNS, "groupBy": GROUP_BY_PHASE,
                 "useGroupedValuesInCharts": True, "hideEmptyCharts": True}
    return {"mlflow.experimentKind": EXPERIMENT_KIND, SHARED_VIEW_TAG + RUNS_VIEW: json.dumps(runs),
            SHARED_VIEW_TAG + ORDERINGS_VIEW: json.dumps(orderings)}


def set_experiment_tags(client: MlflowClient, experiment_id: str) -> None:
    for key, value in experiment_tags().items():
        client.set_experiment_tag(experiment_id, key, value)


def ui_routes(experiment_id: str) -> dict[str, str]:
    """The UI's addresses (after the server's root) of a study's two views."""
    runs = f"#/experiments/{experiment_id}/runs?workflowType=machine_learning&viewStateShareKey="
    return {"runs": runs + RUNS_VIEW, "orderings": runs + ORDERINGS_VIEW + "&compareRunsMode=CHART"}


def prepare_ui(tracking_uri: str, study: str | None = None) -> list[tuple[str, str]]:
    """(study, experiment id) of the store's gtep studies, newest first (only `study` if given); each gets the
    experiment kind and views above (studies written before them included)."""
    client = MlflowClient(tracking_uri=tracking_uri)
    found = client.search_experiments(filter_string="name LIKE 'gtep/%'", order_by=["creation_time DESC"])
    out = []
    for experiment in found:
        name = experiment.name[len("gtep/"):]
        if study is not None and name != study:
            continue
        if any(experiment.tags.get(k) != v for k, v in experiment_tags().items()):
            try:
                set_experiment_tags(client, experiment.experiment_id)
            except Exception as err:  # noqa: BLE001 - a READ user (403) sees the study without its saved views
                from gtep.orchestration.tracking_auth import refusal

                if refusal(err) != 403:
                    raise
        out.append((name, experiment.experiment_id))
    return out


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(float(value))


def trial_key(phase_key: str, set_index: int) -> str:
    return f"{phase_key}/set{set_index:03d}"


def unit_key(phase_key: str, set_index: int, ordering: int) -> str:
    return f"{trial_key(phase_key, set_index)}/o{ordering}"


class MlflowWriter(tune.Callback):
    """Turns Ray Tune reports into trial and ordering runs under the phase run, and into manifest units.

    A unit already in the manifest (a resumed study, or a trial retried after its worker died re-reporting
    the orderings it had finished) is counted once and never logged twice."""

    def __init__(self, journal: TrackingJournal, phase_key: str, phase: Phase, orderings: int, manifest: Manifest,
                 set_index_of: Callable[[Any], int], hparams_of: Callable[[int], dict[str, Any]],
                 common_params: dict[str, Any], trial_label: Callable[[int], str] | None = None,
                 family: ScenarioFamily | None = None, criterion: Criterion = DEFAULT_CRITERION) -> None:
        """`trial_label`: how a set's runs are named after the phase (`set003` by default; `H*` for the set a
        fixed-set phase runs). A phase with one set names its orderings `<phase>/o<s>`, the tuning phase
        `tune/set003/o<s>`."""
        self.journal, self.phase_key, self.phase = journal, phase_key, phase
        self.trial_label = trial_label or (lambda i: f"set{i:03d}")
        self.orderings, self.manifest = orderings, manifest
        self.set_index_of, self.hparams_of, self.common_params = set_index_of, hparams_of, common_params
        self.family = family or FAMILIES.get(CLASS_INCREMENTAL)
        self.criterion = criterion
        self.extra_metrics = family_extra_metrics(self.family)
        self.opened: set[int] = set()
        self.finished: set[int] = set()
        self.errors: dict[int, str] = {}  # set index -> the error file of its last failed trial
        self.stopped: set[int] = set()  # sets the scheduler stopped early
        # training seconds of each set's unfinished ordering (its tasks so far), from its interim reports
        self.partial_seconds: dict[int, float] = {}
        self.results: dict[int, dict[int, OrderingResult]] = {}
        for unit in manifest.units(phase.name):
            self._count(unit)

    def __getstate__(self) -> dict[str, Any]:
        """Ray pickles its run config (tuner.pkl); the journal and callbacks stay on the driver."""
        return {"phase": self.phase, "orderings": self.orderings}

    def _count(self, unit: dict[str, Any]) -> None:
        self.results.setdefault(int(unit["set_index"]), {})[int(unit["ordering"])] = ordering_result(unit)

    # ---- runs -----------------------------------------------------------------------------------
    def _tags(self, level: str, **extra: str) -> dict[str, str]:
        return {"gtep.phase": self.phase.name, "gtep.level": level, **UNITS_TAG,
                **scenario_tags(self.family, self.criterion), **extra}

    def trial_name(self, set_index: int) -> str:
        return f"{self.phase.name}/{self.trial_label(set_index)}"

    def ordering_name(self, set_index: int, ordering: int) -> str:
        # a phase of several sets names their orderings apart
        many_sets = self.phase.many_sets
        return f"{self.trial_name(set_index) if many_sets else self.phase.name}/o{ordering}"

    def trial_run(self, set_index: int, start_time: int | None = None) -> str:
        key = trial_key(self.phase_key, set_index)
        if set_index not in self.opened:
            self.opened.add(set_index)
            self.journal.create_run(key, self.trial_name(set_index), parent=self.phase_key, start_time=start_time,
                                    tags=self._tags("trial", **{"gtep.set_index": str(set_index)}))
            self.journal.log(key, params={**self.common_params, **self.hparams_of(set_index)})
            runs = self.manifest.data["phases"].get(self.phase.name, {}).get("trial_keys", {})
            self.manifest.set_phase(self.phase.name, deferred=True, trial_keys={**runs, str(set_index): key})
        return key

    def log_ordering(self, set_index: int, result: dict[str, Any]) -> None:
        s = int(result["ordering"])
        if f"{self.phase.name}/{set_index}/{s}" in self.manifest.data["units"]:
            self._maybe_finish(set_index)  # already logged by an earlier attempt
            return
        # a reused unit's points carry the time it was trained, not the time it was reused: a unit logged before a
        # driver was killed and again by the resume (its manifest entry not saved yet) writes the same points,
        # which the store keeps once, instead of a second point per metric
        finished_at = int(result.get("trained_at") or result.get("finished_at") or now_ms())
        started_at = int(result.get("started_at") or finished_at - int(1000 * float(result.get("train_seconds") or 0)))
        parent = self.trial_run(set_index, start_time=started_at)  # (opened by on_trial_start, as a rule)
        key = unit_key(self.phase_key, set_index, s)
        diverged = result["status"] == "diverged"
        self.journal.create_run(key, self.ordering_name(set_index, s), parent=parent, start_time=started_at,
                                tags=self._tags(
            "ordering", **{"gtep.set_index": str(set_index), "gtep.ordering": str(s), "gtep.status": result["status"],
                           "gtep.node": str(result.get("node", "")), "gtep.device": str(result.get("device", "")),
                           "gtep.gpu_ids": str(result.get("gpu_ids", "")),  # the GPUs Ray gave the unit's trial
                           "gtep.resumed_tasks": str(result.get("resumed_tasks", 0)),
                           "gtep.first_task": str(result.get("first_task", ""))}))
        values = as_logged({k: result[k] for k in ORDERING_METRICS + self.extra_metrics if _finite(result.get(k))})
        if diverged:
            values["diverged"] = 1.0
        steps = step_points(result)
        self.journal.log(key, values, steps, params={**self.common_params, **self.hparams_of(set_index), "ordering": s},
                         timestamp=finished_at)
        self.journal.log_text(key, "accuracy.json", json.dumps({k: result.get(k) for k in (
            "class_order", "acc_matrix", "test_counts", "task_seconds", "message")}, indent=2, default=str))
        self.journal.terminate(key, "FAILED" if diverged else "FINISHED", end_time=finished_at)
        unit = {k: result.get(k) for k in ("status", "acc", "avg_acc", "hmean", "forgetting", "old_acc", "new_acc",
                                           "acc_t", "params_total", "params_trainable", "train_seconds", "message",
                                           "node", "device", "started_at", "finished_at", "first_task",
                                           "unit_file", *self.extra_metrics, *step_metrics())}
        unit.update(set_index=set_index, ordering=s, mlflow_key=key)
        self.manifest.record_unit(self.phase.name, set_index, s, unit, deferred=True)  # saved by on_step_end
        self._count(unit)
        self._maybe_finish(set_index)

    def _maybe_finish(self, set_index: int) -> None:
        if set_index not in self.finished and len(self.results.get(set_index, {})) >= self.orderings:
            self.finish_trial(set_index, "FINISHED")

    def set_score(self, set_index: int):
        return score_set(set_index, list(self.results.get(set_index, {}).values()), self.orderings, self.criterion,
                         set_index in self.stopped)

    def finish_trial(self, set_index: int, status: str, reason: str = "") -> None:
        """Close a set's trial run. Its gtep.status says whether it can be H*: complete, or diverged or
        incomplete (fewer than S orderings finished; `reason` says why), or interrupted (the study stopped)."""
        key = self.trial_run(set_index)
        self.finished.add(set_index)
        score = self.set_score(set_index)
        # hmean and mean_of_hmeans keep their meaning (Acc and AvgAcc) whatever H*'s criterion; `score` is that
        # criterion (the same number as hmean for the paper's)
        hm = score_set(set_index, list(self.results.get(set_index, {}).values()), self.orderings)
        values = {"acc": score.acc_mean, "acc_std": score.acc_std, "avg_acc": score.avg_acc_mean,
                  "avg_acc_std": score.avg_acc_std, "hmean": hm.hmean_of_means,
                  "mean_of_hmeans": hm.mean_of_hmeans, "diverged_orderings": score.diverged_orderings,
                  "orderings": score.orderings, "orderings_finished": score.finished_orderings,
                  "score": score.hmean_of_means, "score_mean_of_orderings": score.mean_of_hmeans}
        units = [u for u in self.manifest.units(self.phase.name) if u["set_index"] == set_index]
        values.update(ordering_statistics(units, self.extra_metrics))
        # the time of its last unit: finishing the same trial again (a resumed study) writes the same points
        stamps = [u.get("finished_at") or 0 for u in self.manifest.units(self.phase.name)
                  if u["set_index"] == set_index]
        state = "interrupted" if status == "KILLED" and score.status == "incomplete" else score.status
        tags = {"gtep.status": state, "gtep.orderings": f"{score.finished_orderings}/{self.orderings}"}
        if reason:
            tags["gtep.reason"] = reason[:500]
        self.journal.log(key, as_logged({k: v for k, v in values.items() if _finite(v)}), tags=tags,
                         timestamp=int(max(stamps, default=0)) or None)
        self.journal.terminate(key, status, end_time=(int(max(stamps, default=0)) or None) if status == "FINISHED"
                               else None)

    def close_unfinished(self, set_indices, interrupted: bool, stopped: Iterable[int] = ()) -> None:
        """After Tune returns: every set's trial run that is still open is incomplete (its trial ran out of
        retries, or never ran) or, when the study was stopped, interrupted (KILLED; a resume reopens it).
        `stopped`: sets the scheduler stopped early (gtep.status stopped, with what they cost)."""
        self.stopped.update(int(i) for i in stopped)
        for set_index in set_indices:
            if set_index in self.stopped and set_index not in self.finished and not interrupted:
                score = self.set_score(set_index)
                self.finish_trial(set_index, "FINISHED", f"stopped early by the scheduler after "
                                  f"{score.finished_orderings} of {self.orderings} orderings")
                continue
            if set_index in self.finished or (interrupted and set_index not in self.opened):
                continue  # closed already; or never started in a stopped study (a resume will run it)
            score = self.set_score(set_index)
            failure = f"a trial failed after its retries ({self.errors[set_index]})" if set_index in self.errors \
                else "its trial never ran"
            reason = ("the study was interrupted" if interrupted else
                      f"{score.finished_orderings} of {self.orderings} orderings finished: {failure}")
            self.finish_trial(set_index, "KILLED" if interrupted else "FAILED", reason)

    # ---- Ray Tune hooks ---------------------------------------------------------------------------
    def on_trial_start(self, iteration, trials, trial, **info) -> None:
        self.trial_run(self.set_index_of(trial))

    def on_trial_result(self, iteration, trials, trial, result, **info) -> None:
        if "ordering" in result:
            with self.journal.batch():  # a unit's writes reach the store in one flush
                for unit in [*result.get("earlier_units", ()), result]:  # units a trial held (HeldUnits)
                    self.log_ordering(self.set_index_of(trial), unit)
            self.partial_seconds.pop(self.set_index_of(trial), None)
        elif result.get("interim"):  # a score inside an ordering (search.fidelity: tasks): what it cost so far
            self.partial_seconds[self.set_index_of(trial)] = float(result.get("partial_seconds") or 0.0)

    def on_step_end(self, iteration, trials, **info) -> None:
        self.manifest.save_units()

    def on_experiment_end(self, trials, **info) -> None:
        self.manifest.save_units(force=True)

    def on_trial_error(self, iteration, trials, trial, **info) -> None:
        """A trial out of retries. Its set is closed when the phase ends (`close_unfinished`): in a fixed-set
        phase the set's other orderings are other trials, which may still finish."""
        set_index = self.set_index_of(trial)
        error = str(getattr(trial, "error_file", ""))[:500]
        self.errors[set_index] = error
        self.journal.log(self.trial_run(set_index), tags={"gtep.error": error,
                                                          "gtep.error_message": error_message(trial)[:500]})


def error_message(trial: Any) -> str:
    """A failed trial's error as one line (its exception's last line, e.g. a GPU torch cannot see), '' if none."""
    try:
        text = trial.get_error() or ""
    except Exception:  # noqa: BLE001 - the error file is a courtesy; its path is logged anyway
        return ""
    lines = [line.strip() for line in str(text).splitlines() if line.strip()]
    return lines[-1] if lines else ""


def ordering_result(unit: dict[str, Any]) -> OrderingResult:
    """A unit (an ordering's record) as selection reads it: Acc, AvgAcc and every other scalar metric it has."""
    scalars = {k: float(v) for k, v in unit.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    return OrderingResult(int(unit["set_index"]), int(unit["ordering"]), float(unit.get("acc") or 0.0),
                          float(unit.get("avg_acc") or 0.0), unit["status"] == "diverged", scalars)


def summarize_units(units: list[dict[str, Any]], expected: int | None = None, family: ScenarioFamily | None = None,
                    criterion: Criterion = DEFAULT_CRITERION) -> dict[str, Any]:
    """Mean and std over the orderings of one set's units (the numbers the phase table prints). `expected` (S)
    records how many there should be: the tables print finished/expected, so a phase that lost an ordering
    shows it. A family's own metrics (and H*'s criterion, `score`) come with their means and stds."""

    family = family or FAMILIES.get(CLASS_INCREMENTAL)

    finished = [u for u in units if u["status"] != "diverged"]
    out: dict[str, Any] = {"orderings": len(units), "diverged": len(units) - len(finished),
                             "expected": expected if expected is not None else len(units)}
    out.update(ordering_statistics(units, ("acc", "avg_acc")))
    out["hmean"] = harmonic_mean(out["acc"], out["avg_acc"])
    # every other scalar of the family's table (HM is that of the means)
    others = tuple(m for m in family.metric_names if m not in ("acc", "avg_acc", "hmean"))
    out.update(ordering_statistics(units, others))
    results = [ordering_result({**u, "set_index": 0}) for u in units]
    out["score"] = score_set(0, results, expected, criterion).hmean_of_means
    # the family's curves but acc_t, which the orderings carry (a phase run that logged it too would crowd the
    # MLflow compare view's metric names past what it shows)
    out.update(mean_curves(units, tuple(m for m in family.curve_metrics if m != "acc_t")))
    out["family"], out["criterion"] = family.name, criterion.name
    return out


def mean_curves(units: list[dict[str, Any]], names: Iterable[str]) -> dict[str, list[float]]:
    """The mean over the orderings of each curve all of them have at one length (a phase's gAcc(alpha), its
    pw-JS after each task, ...); none once an ordering diverged or lacks it."""
    import numpy as np

    out = {}
    for name in names:
        curves = [list(u[name]) for u in units if u["status"] != "diverged" and u.get(name)]
        if curves and len(curves) == len(units) and len({len(c) for c in curves}) == 1:
            out[name] = [float(v) for v in np.mean(np.asarray(curves, dtype=float), axis=0)]
    return out


def phase_metrics(units: list[dict[str, Any]], summary: dict[str, float]) -> dict[str, float]:
    """What every phase run logs, with one meaning whatever the phase: the set's (H*'s, in the tuning phase)
    acc, avg_acc, hmean over its orderings and their std (hmean_std over the orderings' own HMs), in percent."""
    import numpy as np

    hmeans = [harmonic_mean(float(u["acc"]), float(u["avg_acc"])) for u in units if u["status"] != "diverged"]
    values = {k: summary.get(k) for k in ("acc", "acc_std", "avg_acc", "avg_acc_std", "hmean", "score")}
    family = FAMILIES.get(str(summary.get("family", CLASS_INCREMENTAL)))
    for name in family_extra_metrics(family):
        values[name], values[f"{name}_std"] = summary.get(name), summary.get(f"{name}_std")
    values["hmean_std"] = float(np.std(hmeans)) if hmeans else float("nan")
    return as_logged({k: v for k, v in values.items() if _finite(v)})


def _pct(value: Any) -> str:
    return f"{100 * float(value):.2f}" if _finite(value) else "–"


def _as_shown(metric: str, value: Any) -> str:
    """An accuracy in percent; a ratio or count of a family's table (AUROC, cross-entropy, ATM, MACs) as it is."""
    if metric.removesuffix("_std") in percent_metrics() or metric in percent_metrics():
        return _pct(value)
    return f"{float(value):.3g}" if _finite(value) else "–"


def phase_note(phase: str, dataset: str, summary: dict[str, float], hparams: dict[str, Any], set_label: str,
               extra: list[str] | None = None) -> str:
    """The phase run's Markdown description (MLflow's mlflow.note.content): its result as the terminal prints it."""
    finished = int(summary.get("orderings", 0)) - int(summary.get("diverged", 0))
    lines = [f"**{phase}** on {dataset}: {set_label} over {finished}/{int(summary.get('expected', finished))} "
             "orderings (mean ± std, %)", "",
             "| Acc | AvgAcc | HM |", "|---:|---:|---:|",
             f"| {_pct(summary.get('acc'))} ± {_pct(summary.get('acc_std'))} "
             f"| {_pct(summary.get('avg_acc'))} ± {_pct(summary.get('avg_acc_std'))} | {_pct(summary.get('hmean'))} |"]
    family = FAMILIES.get(str(summary.get("family") or CLASS_INCREMENTAL))
    if family.headline:
        lines += ["", "| " + " | ".join(metric_label(m) for m in family.headline) + " | H* criterion |",
                  "|" + "---:|" * (len(family.headline) + 1),
                  "| " + " | ".join(f"{_as_shown(m, summary.get(m))} ± {_as_shown(m, summary.get(f'{m}_std'))}"
                                    for m in family.headline)
                  + f" | {summary.get('criterion', '')} = {_pct(summary.get('score'))} |"]
    if hparams:
        lines += ["", "| hyperparameter | value |", "|---|---|"]
        lines += [f"| {k} | {v} |" for k, v in hparams.items()]
    return "\n".join(lines + ([""] + extra if extra else [])) + "\n"
