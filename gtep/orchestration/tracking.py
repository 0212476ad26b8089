"""MLflow lineage, written by one writer on the driver through an explicit MlflowClient.

experiment gtep/<study>
  phase run     (gtep.level=phase, gtep.phase=tune|evaluate; artifacts manifest.json, best.yaml, results CSV)
    trial run   (gtep.level=trial: one hyperparameter set; params = the set; aggregate metrics)
      ordering run (gtep.level=ordering: params = the set + ordering; acc, avg_acc, hmean; acc_t per step)

Workers only report to Ray Tune; this callback turns the reports into runs, which avoids SQLite locking
and the experiment-creation race of per-worker MLflow clients (ray-project/ray#19909, mlflow/mlflow#10334).
"""
from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any, Callable

from mlflow.entities import Metric, Param
from mlflow.tracking import MlflowClient
from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID, MLFLOW_RUN_NAME
from ray import tune

from gtep.orchestration.study import Manifest
from gtep.protocol.metrics import harmonic_mean
from gtep.protocol.selection import OrderingResult, score_set

ORDERING_METRICS = ("acc", "avg_acc", "hmean", "forgetting", "old_acc", "new_acc",
                    "params_total", "params_trainable", "train_seconds")


def experiment_name(study: str) -> str:
    return f"gtep/{study}"


def ensure_experiment(client: MlflowClient, study: str, artifact_root: Path | None) -> str:
    """Create or find the study's experiment once, on the driver (no race between trials)."""
    name = experiment_name(study)
    existing = client.get_experiment_by_name(name)
    if existing is not None:
        return existing.experiment_id
    location = (artifact_root / study).resolve().as_uri() if artifact_root else None
    return client.create_experiment(name, artifact_location=location)


def _params(values: dict[str, Any]) -> list[Param]:
    """MLflow params are strings of bounded length; lists are stringified (ray-project/ray#30649 notes)."""
    return [Param(str(k), str(v)[:6000]) for k, v in sorted(values.items())]


def log_json(client: MlflowClient, run_id: str, name: str, payload: Any) -> None:
    client.log_text(run_id, json.dumps(payload, indent=2, default=str), name)


def log_file(client: MlflowClient, run_id: str, path: Path) -> None:
    client.log_artifact(run_id, str(path))


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(float(value))


class MlflowWriter(tune.Callback):
    """Turns Ray Tune reports into trial and ordering runs under the phase run, and into manifest units."""

    def __init__(self, client: MlflowClient, experiment_id: str, phase_run_id: str, phase: str, orderings: int,
                 manifest: Manifest, set_index_of: Callable[[Any], int], hparams_of: Callable[[int], dict[str, Any]],
                 common_params: dict[str, Any],
                 on_unit: Callable[[dict[str, Any]], None] | None = None) -> None:
        self.client, self.experiment_id, self.phase_run_id = client, experiment_id, phase_run_id
        self.phase, self.orderings, self.manifest = phase, orderings, manifest
        self.set_index_of, self.hparams_of = set_index_of, hparams_of
        self.common_params, self.on_unit = common_params, on_unit
        self.trial_runs: dict[int, str] = {}
        self.results: dict[int, list[OrderingResult]] = {}

    def __getstate__(self) -> dict[str, Any]:
        """Ray pickles its run config (tuner.pkl); live clients and callbacks stay on the driver."""
        return {"phase": self.phase, "orderings": self.orderings}

    # ---- runs -----------------------------------------------------------------------------------
    def _tags(self, level: str, parent: str, name: str, **extra: str) -> dict[str, str]:
        return {"gtep.phase": self.phase, "gtep.level": level, MLFLOW_PARENT_RUN_ID: parent,
                MLFLOW_RUN_NAME: name, **extra}

    def trial_run(self, set_index: int) -> str:
        if set_index not in self.trial_runs:
            hparams = self.hparams_of(set_index)
            run = self.client.create_run(self.experiment_id, run_name=f"{self.phase}-set{set_index:03d}",
                                         tags=self._tags("trial", self.phase_run_id, f"{self.phase}-set{set_index:03d}",
                                                         **{"gtep.set_index": str(set_index)}))
            self.client.log_batch(run.info.run_id, params=_params({**self.common_params, **hparams}))
            self.trial_runs[set_index] = run.info.run_id
            self.manifest.set_phase(self.phase, trial_runs={str(k): v for k, v in self.trial_runs.items()})
        return self.trial_runs[set_index]

    def log_ordering(self, set_index: int, result: dict[str, Any]) -> None:
        parent = self.trial_run(set_index)
        s = int(result["ordering"])
        diverged = result["status"] == "diverged"
        run = self.client.create_run(
            self.experiment_id, run_name=f"set{set_index:03d}-ordering{s}",
            tags=self._tags("ordering", parent, f"set{set_index:03d}-ordering{s}",
                            **{"gtep.set_index": str(set_index), "gtep.ordering": str(s), "gtep.status": result["status"]}))
        run_id = run.info.run_id
        now = int(time.time() * 1000)
        metrics = [Metric(k, float(result[k]), now, 0) for k in ORDERING_METRICS if _finite(result.get(k))]
        metrics += [Metric("acc_t", float(v), now, t + 1) for t, v in enumerate(result.get("acc_t") or [])]
        if diverged:
            metrics.append(Metric("diverged", 1.0, now, 0))
        params = {**self.common_params, **self.hparams_of(set_index), "ordering": s}
        self.client.log_batch(run_id, metrics=metrics, params=_params(params))
        log_json(self.client, run_id, "accuracy.json", {k: result.get(k) for k in
                 ("class_order", "acc_matrix", "test_counts", "task_seconds", "message")})
        self.client.set_terminated(run_id, "FAILED" if diverged else "FINISHED")
        unit = {k: result.get(k) for k in ("status", "acc", "avg_acc", "hmean", "forgetting", "old_acc", "new_acc",
                                           "acc_t", "params_total", "params_trainable", "train_seconds", "message")}
        unit.update(set_index=set_index, ordering=s, mlflow_run_id=run_id)
        self.manifest.record_unit(self.phase, set_index, s, unit)
        self.results.setdefault(set_index, []).append(
            OrderingResult(set_index, s, float(result.get("acc") or 0.0), float(result.get("avg_acc") or 0.0), diverged))
        if self.on_unit:
            self.on_unit(unit)
        if len(self.results[set_index]) >= self.orderings:
            self.finish_trial(set_index, "FINISHED")

    def finish_trial(self, set_index: int, status: str) -> None:
        run_id = self.trial_run(set_index)
        score = score_set(set_index, self.results.get(set_index, []))
        now = int(time.time() * 1000)
        values = {"acc": score.acc_mean, "acc_std": score.acc_std, "avg_acc": score.avg_acc_mean,
                  "avg_acc_std": score.avg_acc_std, "hmean": score.hmean_of_means,
                  "mean_of_hmeans": score.mean_of_hmeans, "diverged_orderings": score.diverged_orderings,
                  "orderings": score.orderings}
        self.client.log_batch(run_id, metrics=[Metric(k, float(v), now, 0) for k, v in values.items() if _finite(v)])
        self.client.set_tag(run_id, "gtep.status", "diverged" if score.diverged_orderings else status.lower())
        self.client.set_terminated(run_id, status)

    # ---- Ray Tune hooks ---------------------------------------------------------------------------
    def on_trial_start(self, iteration, trials, trial, **info) -> None:
        self.trial_run(self.set_index_of(trial))

    def on_trial_result(self, iteration, trials, trial, result, **info) -> None:
        if "ordering" in result:
            self.log_ordering(self.set_index_of(trial), result)

    def on_trial_error(self, iteration, trials, trial, **info) -> None:
        set_index = self.set_index_of(trial)
        self.client.set_tag(self.trial_run(set_index), "gtep.error", str(getattr(trial, "error_file", ""))[:500])
        self.finish_trial(set_index, "FAILED")


def summarize_units(units: list[dict[str, Any]]) -> dict[str, float]:
    """Mean and std over the orderings of one set's units (the numbers the phase table prints)."""
    import numpy as np

    finished = [u for u in units if u["status"] != "diverged"]
    out: dict[str, float] = {"orderings": len(units), "diverged": len(units) - len(finished)}
    for key in ("acc", "avg_acc"):
        values = [float(u[key]) for u in finished]
        out[key] = float(np.mean(values)) if values and len(finished) == len(units) else float("nan")
        out[f"{key}_std"] = float(np.std(values)) if values else float("nan")
    out["hmean"] = harmonic_mean(out["acc"], out["avg_acc"])
    return out

