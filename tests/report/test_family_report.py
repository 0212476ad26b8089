"""gtep report over hand-written MLflow stores of scenario families (no training): an FSCIL study's tables carry
aAcc, gAcc AUC and H*'s criterion per phase, and its gAcc(alpha) curves are drawn (tuning dashed, evaluation solid);
a class-incremental store, tagged with its family or not, gives the same report as before and no gAcc plot."""
import math
import re

import numpy as np
import pandas as pd
import pytest
from mlflow.entities import Metric, RunTag
from mlflow.tracking import MlflowClient

from gtep.reporting import run_report
from tests.report.test_units import stored_report

S = 2
K = 12  # gacc_alpha steps k = 0..12, alpha = k / 12
PERCENT = {"acc", "avg_acc", "hmean", "mean_of_hmeans", "aacc", "aacc_sample", "lacc", "tacc", "gacc_auc",
           "gacc_auc_exact", "hacc", "pd", "novel_acc", "score"}
FSCIL_NAMES = ("aacc", "aacc_sample", "lacc", "tacc", "gacc_auc", "gacc_auc_exact", "hacc", "pd", "novel_acc", "rpd",
               "kr")
# per algorithm: tuning sets (set index -> orderings' (acc, avg_acc, base, novel)), H* = set 1 (the higher gAcc AUC),
# then the evaluation orderings on D^E. gAcc(alpha) of an ordering is the line base * (1 - alpha) + novel * alpha, so
# its AUC is (base + novel) / 2.
PLAN = {
    "topic": ({0: [(0.50, 0.60, 0.40, 0.10), (0.52, 0.61, 0.42, 0.12)],
               1: [(0.55, 0.66, 0.70, 0.30), (0.57, 0.64, 0.66, 0.26)]},
              [(0.45, 0.55, 0.60, 0.20), (0.41, 0.51, 0.56, 0.14)]),
    "cec": ({0: [(0.48, 0.58, 0.62, 0.22), (0.50, 0.60, 0.64, 0.24)],
             1: [(0.51, 0.61, 0.72, 0.40), (0.53, 0.63, 0.74, 0.36)]},
            [(0.47, 0.57, 0.68, 0.32), (0.49, 0.59, 0.66, 0.28)]),
}


def ordering_metrics(acc, avg, base, novel):
    """An ordering's scalar metrics (fractions; rpd and kr ratios) and its gAcc(alpha) curve."""
    auc = (base + novel) / 2
    scalars = {"acc": acc, "avg_acc": avg, "hmean": 2 * acc * avg / (acc + avg), "aacc": avg, "aacc_sample": avg - 0.01,
               "lacc": acc, "tacc": acc + 0.01, "gacc_auc": auc, "gacc_auc_exact": auc + 0.001,
               "hacc": 2 * base * novel / (base + novel), "pd": 0.3, "novel_acc": novel, "rpd": 0.3 / 0.9,
               "kr": acc / 0.9}
    curve = [base * (1 - k / K) + novel * (k / K) for k in range(K + 1)]
    return scalars, curve


def mean_std(values):
    return float(np.mean(values)), float(np.std(values))


def set_means(units):
    """A set's (or phase's) logged numbers: means over its orderings, <name>_std, score = mean gAcc AUC, and the
    mean gAcc(alpha) curve."""
    each = [ordering_metrics(*u) for u in units]
    out = {}
    for name in each[0][0]:
        out[name], out[f"{name}_std"] = mean_std([e[0][name] for e in each])
    out["mean_of_hmeans"] = out.pop("hmean")
    out["hmean"] = 2 * out["acc"] * out["avg_acc"] / (out["acc"] + out["avg_acc"])  # of the means, as the tracker
    out["score"] = out["gacc_auc"]
    return out, list(np.mean([e[1] for e in each], axis=0))


class FamilyWriter:
    """Runs logged as gtep.orchestration.tracking writes an FSCIL study: percent (4 decimals), family and criterion
    tags on every phase, trial and ordering run."""

    def __init__(self, uri):
        self.client, self.clock = MlflowClient(tracking_uri=uri), 1_700_000_000_000

    def run(self, experiment_id, level, tags, metrics, parent=None, params=None, curve=()):
        self.clock += 1000
        tags = {"gtep.level": level, "gtep.units": "percent", "gtep.family": "fscil", "gtep.criterion": "gacc_auc",
                **tags, **({"mlflow.parentRunId": parent} if parent else {})}
        run_id = self.client.create_run(experiment_id, start_time=self.clock, tags=tags).info.run_id
        scaled = {k: round(100.0 * v, 4) if k.removesuffix("_std") in PERCENT else v for k, v in metrics.items()}
        batch = [Metric(k, float(v), self.clock, 0) for k, v in scaled.items()]
        batch += [Metric("gacc_alpha", round(100.0 * v, 4), self.clock, k) for k, v in enumerate(curve)]
        self.client.log_batch(run_id, metrics=batch, params=[], tags=[])
        for key, value in (params or {}).items():
            self.client.log_param(run_id, key, value)
        self.client.set_terminated(run_id, "FINISHED", end_time=self.clock + 500)
        return run_id

    def orderings(self, experiment_id, trial_id, set_index, units):
        for s, unit in enumerate(units):
            scalars, curve = ordering_metrics(*unit)
            self.run(experiment_id, "ordering", {"gtep.set_index": str(set_index), "gtep.ordering": str(s),
                                                 "gtep.status": "finished"},
                     {**scalars, "params_total": 5e4, "params_trainable": 5e4, "train_seconds": 3.0},
                     parent=trial_id, curve=curve)


def write_fscil_store(uri):
    w = FamilyWriter(uri)
    for algorithm, (sets, evaluation) in PLAN.items():
        study = f"fs-{algorithm}"
        exp = w.client.create_experiment(f"gtep/{study}")
        params = {"gtep.algorithm": algorithm, "gtep.backbone": "resnet12", "gtep.increments": "60+5x8",
                  "gtep.selection": "gacc_auc"}
        best, best_curve = set_means(sets[1])
        tune = w.run(exp, "phase", {"gtep.phase": "tune", "gtep.study": study, "gtep.best_set_index": "1",
                                    "gtep.status": "finished"},
                     {**best, "best_set_index": 1, "sets_complete": 2}, params={**params, "gtep.dataset": "D1"},
                     curve=best_curve)
        for index, units in sets.items():
            means, _ = set_means(units)
            trial = w.run(exp, "trial", {"gtep.set_index": str(index), "gtep.status": "complete",
                                         "gtep.orderings": f"{S}/{S}"},
                          {**means, "diverged_orderings": 0, "orderings": S},
                          parent=tune, params={"lr": str(0.01 * (index + 1))})
            w.orderings(exp, trial, index, units)
            if index == 1:
                w.client.set_tag(tune, "gtep.best_trial_run_id", trial)
        ev, ev_curve = set_means(evaluation)
        evaluate = w.run(exp, "phase", {"gtep.phase": "evaluate", "gtep.study": study, "gtep.status": "finished",
                                        "gtep.orderings": f"{S}/{S}", "gtep.hparams_source": "tuning"},
                         {**ev, "diverged": 0, "orderings": S}, params={**params, "gtep.dataset": "D2"},
                         curve=ev_curve)
        trial = w.run(exp, "trial", {"gtep.set_index": "1", "gtep.status": "complete"}, ev, parent=evaluate)
        w.orderings(exp, trial, 1, evaluation)


@pytest.fixture(scope="module")
def fscil(tmp_path_factory):
    root = tmp_path_factory.mktemp("fscil")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    write_fscil_store(uri)
    return run_report(uri, ["fs-*"], out=root / "report", formats=("md", "csv", "latex"), log_to_mlflow=False)


def only(report):
    (group, table), = report.tables.items()
    return group, table


def cell(mean, std):
    return f"{100 * mean:.2f} ({100 * std:.2f})"


def test_fscil_table_has_aacc_gacc_auc_and_criterion_per_phase(fscil):
    _, table = only(fscil)
    for phase in ("tuning (D^HT)", "evaluation (D^E)"):  # the class-incremental columns stay, FSCIL's come after HM
        columns = list(table.columns)
        at = columns.index(f"HM {phase}")
        assert columns[at + 1: at + 5] == [f"aAcc {phase}", f"gAcc AUC {phase}", f"novel {phase}",
                                           f"criterion {phase}"]
    assert columns.index("criterion tuning (D^HT)") < columns.index("evaluation (D^E)")
    for algorithm, (sets, evaluation) in PLAN.items():
        for phase, units in (("tuning (D^HT)", sets[1]), ("evaluation (D^E)", evaluation)):
            means, _ = set_means(units)
            assert table.at[algorithm, f"aAcc {phase}"] == cell(means["aacc"], means["aacc_std"]), (algorithm, phase)
            assert table.at[algorithm, f"gAcc AUC {phase}"] == cell(means["gacc_auc"], means["gacc_auc_std"])
            assert table.at[algorithm, f"criterion {phase}"] == f"{100 * means['score']:.2f}"
            assert table.at[algorithm, f"HM {phase}"] == f"{100 * means['hmean']:.2f}"
    # hand-checked numbers: topic's H* (set 1) has base 0.70/0.66 and novel 0.30/0.26, AUC 0.50 and 0.46
    assert table.at["topic", "gAcc AUC tuning (D^HT)"] == "48.00 (2.00)"
    assert table.at["topic", "aAcc tuning (D^HT)"] == "65.00 (1.00)"
    assert table.at["cec", "gAcc AUC evaluation (D^E)"] == "48.50 (1.50)"


def test_fscil_summary_reads_family_metrics_as_fractions_and_ratios_as_they_are(fscil):
    summary = fscil.summary.set_index(["label", "phase"])
    assert set(summary["family"]) == {"fscil"} and set(summary["criterion"]) == {"gacc_auc"}
    for algorithm, (sets, evaluation) in PLAN.items():
        for phase, units in (("tune", sets[1]), ("evaluate", evaluation)):
            means, _ = set_means(units)
            row = summary.loc[(algorithm, phase)]
            for name in FSCIL_NAMES:
                assert row[name] == pytest.approx(means[name], abs=1e-6), (algorithm, phase, name)
                assert row[f"{name}_std"] == pytest.approx(means[f"{name}_std"], abs=1e-6)
            assert row["score"] == pytest.approx(means["gacc_auc"], abs=1e-6)
            assert row["rpd"] == pytest.approx(0.3 / 0.9) and 0 < row["kr"] < 1  # ratios: not divided by 100
    text = (fscil.out / "report.md").read_text()
    assert "gAcc AUC (area under gAcc(alpha)" in text and "(gacc_auc)." in text
    assert "![gacc_alpha](" in text


def test_fscil_gacc_alpha_frame_is_the_phase_runs_curve(fscil):
    curves = fscil.gacc
    assert list(curves.columns) == ["scenario", "pairing", "label", "phase", "k", "alpha", "gacc"]
    assert set(zip(curves["label"], curves["phase"])) == {(a, p) for a in PLAN for p in ("tune", "evaluate")}
    for algorithm, (sets, evaluation) in PLAN.items():
        for phase, units in (("tune", sets[1]), ("evaluate", evaluation)):
            own = curves[(curves["label"] == algorithm) & (curves["phase"] == phase)].sort_values("k")
            assert list(own["k"]) == list(range(K + 1))
            assert list(own["alpha"]) == pytest.approx([k / K for k in range(K + 1)])
            assert list(own["gacc"]) == pytest.approx(set_means(units)[1], abs=1e-6)
            # the trapezoid area under the (linear) curve is the phase's gAcc AUC
            assert np.trapezoid(own["gacc"], own["alpha"]) == pytest.approx(set_means(units)[0]["gacc_auc"], abs=1e-6)
    saved = pd.read_csv(fscil.out / "gacc_alpha.csv")
    assert len(saved) == len(curves)


def test_fscil_gacc_alpha_plot_as_a_person_sees_it(fscil):
    from matplotlib import image

    folder = next(p.parent for p in fscil.paths if p.name == "table.csv")
    png = folder / "gacc_alpha.png"
    assert png in fscil.paths and png.with_suffix(".pdf") in fscil.paths
    assert png.with_suffix(".pdf").read_bytes()[:5] == b"%PDF-"
    pixels = image.imread(png)[..., :3]
    height, width = pixels.shape[:2]
    assert (width, height) == (660, 484)  # 6.0 x 4.4 inches at 110 dpi
    # mostly white background, but clearly drawn on: two algorithms' colours (C0 blue, C1 orange) in many pixels
    white = (pixels > 0.97).all(axis=-1).mean()
    assert 0.5 < white < 0.99
    blue = np.abs(pixels - np.array([0x1F, 0x77, 0xB4]) / 255).max(axis=-1) < 0.08
    orange = np.abs(pixels - np.array([0xFF, 0x7F, 0x0E]) / 255).max(axis=-1) < 0.08
    assert blue.sum() > 300 and orange.sum() > 300
    assert len(np.unique((pixels * 255).astype(np.uint8).reshape(-1, 3), axis=0)) > 20
    html = (fscil.out / "report.html").read_text()
    assert html.count('alt="gacc_alpha"') == 1


def test_fscil_plot_draws_tuning_dashed_and_evaluation_solid(fscil, tmp_path, monkeypatch):
    from gtep.reporting import plots

    figure_lines = []
    original = plots._save

    def keep(figure, path):
        figure_lines.extend(figure.axes[0].get_lines())
        assert figure.axes[0].get_xlabel().startswith("alpha") and "gAcc" in figure.axes[0].get_ylabel()
        return original(figure, path)

    group, _ = only(fscil)
    monkeypatch.setattr(plots, "_save", keep)
    path = plots.gacc_alpha(fscil.gacc, tmp_path / "g.png", plots.title("gAcc", *group))
    assert path is not None and path.exists()
    styles = {line.get_label(): line.get_linestyle() for line in figure_lines}
    assert styles == {"cec, tuning": "--", "cec, evaluation": "-", "topic, tuning": "--", "topic, evaluation": "-"}
    for line in figure_lines:
        x = line.get_xdata()
        assert min(x) == 0 and max(x) == 1


# ---------------------------------------------------------------- class-incremental stores stay as they were

def tag_family(uri):
    """The interface's tags on every run of a class-incremental store, and `score` (HM) on its phase runs."""
    client = MlflowClient(tracking_uri=uri)
    ids = [e.experiment_id for e in client.search_experiments() if e.name.startswith("gtep/")]
    for run in client.search_runs(ids, max_results=1000):
        tags = [RunTag("gtep.family", "class_incremental"), RunTag("gtep.criterion", "hmean_acc_avgacc")]
        metrics = []
        if run.data.tags.get("gtep.level") == "phase" and "hmean" in run.data.metrics:
            metrics = [Metric("score", run.data.metrics["hmean"], 1, 0)]
        client.log_batch(run.info.run_id, metrics=metrics, params=[], tags=tags)


@pytest.fixture(scope="module")
def class_incremental(tmp_path_factory):
    root = tmp_path_factory.mktemp("ci")
    out = {}
    for name, tagged in (("untagged", False), ("tagged", True)):
        out[name] = stored_report(root, name, True, prepare=tag_family if tagged else None)[1]
    return out


def test_class_incremental_report_has_no_gacc_plot_and_the_same_table(class_incremental):
    untagged, tagged = class_incremental["untagged"], class_incremental["tagged"]
    for report in (untagged, tagged):
        assert report.gacc.empty and "family" not in report.summary
        assert not any(p.name.startswith("gacc_alpha") for p in report.paths)
        assert not list(report.out.rglob("gacc_alpha*"))
        (_, table), = report.tables.items()
        assert list(table.columns) == ["tuning (D^HT)", "HM tuning (D^HT)", "evaluation (D^E)", "HM evaluation (D^E)",
                                       "gap HM (pp)", "rank tune → eval"]
    for group, table in untagged.tables.items():
        pd.testing.assert_frame_equal(table, tagged.tables[group])
    pd.testing.assert_frame_equal(untagged.summary.drop(columns="run_id"), tagged.summary.drop(columns="run_id"))
    md = lambda r: re.sub(r"\S+-[0-9a-f]{6}/", "", (r.out / "report.md").read_text())  # noqa: E731
    assert md(untagged) == md(tagged) and "FSCIL" not in md(tagged)
    assert sorted(p.name for p in untagged.out.iterdir()) == sorted(p.name for p in tagged.out.iterdir())
    assert not math.isnan(tagged.summary["hmean"].iloc[0])
