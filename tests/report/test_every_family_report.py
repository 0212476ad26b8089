"""Every registered scenario family's metrics reach `gtep report` as its table defines them: a study of each family,
logged with tracking's own functions (as_logged, summarize_units, phase_metrics, step_points: what MlflowWriter
logs), is read back by the report with every scalar of the family's table per phase, percent metrics as fractions
and ratios and counts as they were. No family is named here: a new family is covered by registering it."""
import math
import zlib

import matplotlib
import pytest

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from mlflow.tracking import MlflowClient  # noqa: E402

from gtep.orchestration.tracking import as_logged, phase_metrics, step_points, summarize_units
from gtep.protocol.criteria import CRITERIA
from gtep.protocol.families import CLASS_INCREMENTAL, FAMILIES, metric_label
from gtep.reporting import run_report

S = 2  # orderings per set
SETS = 2  # sets tuned; H* = set 1


def value(name: str, percent: bool, set_index: int, ordering: int, phase: str) -> float:
    """A distinct, reproducible value per metric: a fraction for percent metrics, above 1 for the others (so a
    division by 100 that should not happen shows)."""
    base = (zlib.crc32(f"{name}/{phase}".encode()) % 1000) / 2000 + 0.1 * set_index + 0.05 * ordering
    return base if percent else 3.0 + 10 * base


def unit(family, set_index: int, ordering: int, phase: str) -> dict:
    """An ordering's record as trainable.py reports it: the family's scalars and curves, acc and avg_acc too."""
    record = {"status": "finished", "set_index": set_index, "ordering": ordering,
              "params_total": 5e4, "params_trainable": 5e4, "train_seconds": 3.0}
    for metric in family.metrics:
        if metric.curve:
            record[metric.name] = [value(metric.name, metric.percent, set_index, ordering + t, phase) for t in range(3)]
        else:
            record[metric.name] = value(metric.name, metric.percent, set_index, ordering, phase)
    return record


class StoreWriter:
    def __init__(self, uri: str, family):
        self.client, self.family, self.clock = MlflowClient(tracking_uri=uri), family, 1_700_000_000_000
        self.criterion = family.default_criterion

    def run(self, experiment_id, level, tags, metrics, parent=None, params=None, steps=()):
        self.clock += 1000
        tags = {"gtep.level": level, "gtep.units": "percent", "gtep.family": self.family.name,
                "gtep.criterion": self.criterion, **tags, **({"mlflow.parentRunId": parent} if parent else {})}
        run_id = self.client.create_run(experiment_id, start_time=self.clock, tags=tags).info.run_id
        for key, v in metrics.items():
            self.client.log_metric(run_id, key, v)
        for key, v, step in steps:
            self.client.log_metric(run_id, key, v, step=step)
        for key, v in (params or {}).items():
            self.client.log_param(run_id, key, v)
        self.client.set_terminated(run_id, "FINISHED", end_time=self.clock + 500)
        return run_id

    def orderings(self, experiment_id, trial_id, units):
        names = ("acc", "avg_acc", "params_total", "params_trainable", "train_seconds", *self.family.metric_names)
        for u in units:
            self.run(experiment_id, "ordering", {"gtep.set_index": str(u["set_index"]),
                                                 "gtep.ordering": str(u["ordering"]), "gtep.status": "finished"},
                     as_logged({k: u[k] for k in names}), parent=trial_id, steps=step_points(u))

    def phase(self, experiment_id, study, phase, units, tags, params):
        summary = summarize_units(units, S, self.family, CRITERIA.get(self.criterion))
        run_id = self.run(experiment_id, "phase", {"gtep.phase": phase, "gtep.study": study, "gtep.status": "finished",
                                                   "gtep.orderings": f"{S}/{S}", **tags},
                          {**phase_metrics(units, summary), "diverged": 0, "orderings": S}, params=params,
                          steps=step_points(summary))  # the mean curves, as phases.py logs them
        # what the phase run logs beside the summary: the std of the orderings' own HMs (percent in MLflow)
        return run_id, {**summary, "hmean_std": phase_metrics(units, summary)["hmean_std"] / 100}


def write_study(uri: str, family) -> dict:
    """One study of the family: SETS tuned sets x S orderings, H* = set 1, then its evaluation. Returns the
    summaries tracking computed for the tuning (H*) and evaluation phases."""
    w = StoreWriter(uri, family)
    study = f"every-{family.name}"
    exp = w.client.create_experiment(f"gtep/{study}")
    params = {"gtep.algorithm": "learner", "gtep.backbone": "resnet8", "gtep.increments": "2x2",
              "gtep.selection": "hmean_of_means"}
    tuned = {i: [unit(family, i, s, "tune") for s in range(S)] for i in range(SETS)}
    tune, tune_summary = w.phase(exp, study, "tune", tuned[1], {"gtep.best_set_index": "1"},
                                 {**params, "gtep.dataset": "D1"})
    for index, units in tuned.items():
        trial_summary = summarize_units(units, S, family, CRITERIA.get(w.criterion))
        trial = w.run(exp, "trial", {"gtep.set_index": str(index), "gtep.status": "complete",
                                     "gtep.orderings": f"{S}/{S}"},
                      {**phase_metrics(units, trial_summary), "diverged_orderings": 0, "orderings": S},
                      parent=tune, params={"lr": str(0.01 * (index + 1))})
        w.orderings(exp, trial, units)
        if index == 1:
            w.client.set_tag(tune, "gtep.best_trial_run_id", trial)
    evaluated = [unit(family, 1, s, "evaluate") for s in range(S)]
    evaluate, evaluate_summary = w.phase(exp, study, "evaluate", evaluated, {"gtep.hparams_source": "tuning"},
                                         {**params, "gtep.dataset": "D2"})
    trial = w.run(exp, "trial", {"gtep.set_index": "1", "gtep.status": "complete"},
                  phase_metrics(evaluated, evaluate_summary), parent=evaluate)
    w.orderings(exp, trial, evaluated)
    return {"tune": tune_summary, "evaluate": evaluate_summary}


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_the_report_reads_every_metric_of_the_family_table(tmp_path, name):
    family = FAMILIES.get(name)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    expected = write_study(uri, family)
    report = run_report(uri, [f"every-{name}"], out=tmp_path / "report", formats=("md",), log_to_mlflow=False)
    summary = report.summary.set_index("phase")
    for phase in ("tune", "evaluate"):
        row = summary.loc[phase]
        # a report of class-incremental studies alone has no family columns (as before families existed)
        assert row.get("family", CLASS_INCREMENTAL) == name
        assert row.get("criterion", family.default_criterion) == family.default_criterion
        for metric in family.metric_names:
            want = expected[phase][metric]
            assert not math.isnan(want)
            # logged rounded to 4 decimals of percent: within 1e-6 of the fraction; ratios and counts exactly
            assert row[metric] == pytest.approx(want, abs=1e-6), (phase, metric)
            assert row[f"{metric}_std"] == pytest.approx(expected[phase][f"{metric}_std"], abs=1e-6), (phase, metric)
    assert (report.out / "report.md").exists()
    # the paper table's family columns: each table metric in its unit (percent x100, ratios and counts as they are)
    table = next(iter(report.tables.values())) if family.table_metrics else None
    units = {m.name: m.unit for m in family.metrics}
    for metric in family.table_metrics:
        cell = table.iloc[0][f"{metric_label(metric)} evaluation (D^E)"]
        value = expected["evaluate"][metric] * (100 if units[metric] == "percent" else 1)
        assert float(cell.split(" ")[0]) == pytest.approx(value, rel=5e-3, abs=5e-3), (metric, cell)
    # every curve of the table but acc_t (drawn per task from the orderings) and gAcc(alpha) (its own figure): the
    # phase's mean over its orderings, step by step, as a frame and as a figure a person opens
    drawn = [m for m in family.metrics if m.curve and m.name not in ("acc_t", "gacc_alpha")]
    curves = report.family_curves
    for metric in drawn:
        for phase, units in (("tune", expected["tune"]), ("evaluate", expected["evaluate"])):
            rows = curves[(curves["metric"] == metric.name) & (curves["phase"] == phase)].sort_values("step")
            assert list(rows["step"]) == [metric.first_step + i for i in range(3)], (metric.name, phase)
            assert list(rows["value"]) == pytest.approx(units[metric.name], abs=1e-6), (metric.name, phase)
        [figure] = list(report.out.rglob(f"{metric.name}.png"))
        image = plt.imread(figure)
        assert image.shape[0] > 200 and image.shape[1] > 200 and image[..., :3].std() > 0.01  # not blank
    assert set(curves["metric"]) == {m.name for m in drawn}


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_every_curve_of_the_family_table_reaches_mlflow_as_steps(name):
    family = FAMILIES.get(name)
    record = unit(family, 0, 0, "tune")
    points = step_points(record)
    for metric in family.metrics:
        if metric.curve:
            steps = [step for key, _, step in points if key == metric.name]
            assert steps == [metric.first_step + t for t in range(3)], metric.name
            logged = [v for key, v, _ in points if key == metric.name]
            assert logged == [round(100 * v, 4) if metric.percent else v for v in record[metric.name]]
