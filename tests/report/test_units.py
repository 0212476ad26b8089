"""gtep report over hand-written MLflow stores (no training): the same runs logged as fractions (stores written
before gtep.units) and in percent (gtep.units=percent, the tuning phase's H* as acc/avg_acc/hmean rather than
best_*) give the same report; incomplete sets and an incomplete evaluation are shown as such; the report run in
MLflow holds a report.html that embeds its figures."""
import math
import re

import pandas as pd
import pytest
from mlflow.tracking import MlflowClient

from gtep.reporting import run_report

ALGORITHMS = ("replay", "icarl")
S = 2
# per algorithm: tuning sets (set index -> orderings' (acc, avg_acc); set 2 lost an ordering), H* = set 1,
# evaluation orderings on D^E
PLAN = {
    "replay": ({0: [(0.412, 0.523), (0.398, 0.541)], 1: [(0.503, 0.617), (0.489, 0.602)], 2: [(0.61, 0.7)]},
               [(0.3713, 0.4821), (0.3502, 0.4688)]),
    "icarl": ({0: [(0.451, 0.566), (0.433, 0.571)], 1: [(0.472, 0.593), (0.468, 0.588)], 2: [(0.2, 0.3)]},
              [(0.4017, 0.5123), (0.3921, 0.5011)]),
}
ACC = {"acc", "avg_acc", "hmean", "acc_std", "avg_acc_std", "mean_of_hmeans", "forgetting", "best_acc",
       "best_avg_acc", "best_hmean", "best_acc_std", "best_avg_acc_std"}


def hm(a, b):
    return 2 * a * b / (a + b)


def stats(units):
    acc, avg = [u[0] for u in units], [u[1] for u in units]
    mean = lambda v: sum(v) / len(v)  # noqa: E731
    std = lambda v: math.sqrt(sum((x - mean(v)) ** 2 for x in v) / len(v))  # noqa: E731
    return {"acc": mean(acc), "avg_acc": mean(avg), "acc_std": std(acc), "avg_acc_std": std(avg),
            "hmean": hm(mean(acc), mean(avg)), "mean_of_hmeans": mean([hm(a, b) for a, b in units])}


class Writer:
    def __init__(self, uri, percent):
        self.client, self.percent, self.clock = MlflowClient(tracking_uri=uri), percent, 1_700_000_000_000

    def run(self, experiment_id, level, tags, metrics, parent=None, params=None, status="FINISHED", steps=()):
        self.clock += 1000
        tags = {"gtep.level": level, **tags, **({"mlflow.parentRunId": parent} if parent else {})}
        if self.percent:
            tags["gtep.units"] = "percent"
        run_id = self.client.create_run(experiment_id, start_time=self.clock, tags=tags).info.run_id
        # as gtep.orchestration.tracking logs percent: rounded to 4 decimals (57.1234 for 0.571234)
        scaled = (lambda v: round(100.0 * v, 4)) if self.percent else (lambda v: v)
        for key, value in metrics.items():
            self.client.log_metric(run_id, key, scaled(value) if key in ACC else value)
        for t, value in steps:
            self.client.log_metric(run_id, "acc_t", scaled(value), step=t)
        for key, value in (params or {}).items():
            self.client.log_param(run_id, key, value)
        self.client.set_terminated(run_id, status, end_time=self.clock + 500)
        return run_id

    def orderings(self, experiment_id, trial_id, set_index, units):
        for s, (acc, avg) in enumerate(units):
            self.run(experiment_id, "ordering", {"gtep.set_index": str(set_index), "gtep.ordering": str(s),
                                                 "gtep.status": "finished"},
                     {"acc": acc, "avg_acc": avg, "hmean": hm(acc, avg), "forgetting": 0.1, "params_total": 5e4,
                      "params_trainable": 5e4, "train_seconds": 12.0 + s}, parent=trial_id,
                     steps=[(1, avg + 0.05), (2, acc)])


def write_store(uri, percent):
    w = Writer(uri, percent)
    for algorithm, (sets, evaluation) in PLAN.items():
        study = f"u-{algorithm}"
        exp = w.client.create_experiment(f"gtep/{study}")
        params = {"gtep.algorithm": algorithm, "gtep.backbone": "resnet8", "gtep.increments": "2x2",
                  "gtep.selection": "hmean_of_means"}
        best = stats(sets[1])
        names = ("acc", "avg_acc", "hmean", "acc_std", "avg_acc_std")
        h_star = {(n if percent else f"best_{n}"): best[n] for n in names}
        tune = w.run(exp, "phase", {"gtep.phase": "tune", "gtep.study": study, "gtep.best_set_index": "1",
                                    "gtep.status": "finished"},
                     {**h_star, "best_set_index": 1, "sets_complete": 2, "sets_incomplete": 1, "sets_diverged": 0},
                     params={**params, "gtep.dataset": "D1"})
        for index, units in sets.items():
            complete = len(units) == S
            tags = {"gtep.set_index": str(index), "gtep.status": "complete" if complete else "incomplete",
                    "gtep.orderings": f"{len(units)}/{S}"}
            trial = w.run(exp, "trial", tags, {**stats(units), "diverged_orderings": 0, "orderings": len(units)},
                          parent=tune, params={"lr": str(0.01 * (index + 1)), "epochs": str(10 + index)},
                          status="FINISHED" if complete else "FAILED")
            w.orderings(exp, trial, index, units)
            if index == 1:
                w.client.set_tag(tune, "gtep.best_trial_run_id", trial)
        ev = stats(evaluation)
        evaluate = w.run(exp, "phase", {"gtep.phase": "evaluate", "gtep.study": study, "gtep.status": "finished",
                                        "gtep.orderings": f"{S}/{S}", "gtep.hparams_source": "tuning"},
                         {**{n: ev[n] for n in names}, "diverged": 0, "orderings": S},
                         params={**params, "gtep.dataset": "D2"})
        trial = w.run(exp, "trial", {"gtep.set_index": "1", "gtep.status": "complete"}, ev, parent=evaluate)
        w.orderings(exp, trial, 1, evaluation)
        if algorithm == "replay":  # a later evaluation that lost an ordering (and one diverged): not a result
            bad = w.run(exp, "phase", {"gtep.phase": "evaluate", "gtep.study": study, "gtep.status": "incomplete",
                                       "gtep.orderings": f"1/{S}", "gtep.hparams_source": "tuning"},
                        {"diverged": 1, "orderings": 1}, params={**params, "gtep.dataset": "D2"}, status="FAILED")
            trial = w.run(exp, "trial", {"gtep.set_index": "1", "gtep.status": "incomplete"}, {}, parent=bad)
            w.orderings(exp, trial, 1, [(0.9, 0.9)])


def stored_report(root, name, percent, log_to_mlflow=False, prepare=None):
    """write_store into root/name/mlflow.db (then `prepare(uri)`, when given), and the report of its studies in md,
    csv and LaTeX under root/name/report: (the store's URI, the report)."""
    uri = f"sqlite:///{root / name / 'mlflow.db'}"
    (root / name).mkdir()
    write_store(uri, percent)
    if prepare is not None:
        prepare(uri)
    return uri, run_report(uri, ["u-*"], out=root / name / "report", formats=("md", "csv", "latex"),
                           log_to_mlflow=log_to_mlflow)


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    root = tmp_path_factory.mktemp("units")
    return {name: stored_report(root, name, percent, log_to_mlflow=(name == "percent"))
            for name, percent in (("fraction", False), ("percent", True))}


def test_percent_and_fraction_stores_give_the_same_report(reports):
    fraction, percent = reports["fraction"][1], reports["percent"][1]
    assert list(fraction.tables) == list(percent.tables)
    for group, table in fraction.tables.items():
        pd.testing.assert_frame_equal(table, percent.tables[group])
    columns = ["acc", "acc_std", "avg_acc", "avg_acc_std", "hmean", "forgetting"]
    pd.testing.assert_frame_equal(fraction.summary[columns], percent.summary[columns], rtol=0, atol=1e-6)
    for frame in ("curves", "convergence", "gaps"):
        a, b = getattr(fraction, frame), getattr(percent, frame)
        numeric = a.select_dtypes("number").columns
        pd.testing.assert_frame_equal(a[numeric], b[numeric], rtol=0, atol=1e-6)
    md = lambda r: re.sub(r"\S+-[0-9a-f]{6}/", "", (r.out / "report.md").read_text())  # noqa: E731
    assert md(fraction) == md(percent)


def test_numbers_are_the_store_s_fractions_printed_in_percent(reports):
    report = reports["percent"][1]
    (_, table), = report.tables.items()
    best, ev = stats(PLAN["icarl"][0][1]), stats(PLAN["icarl"][1])
    assert table.at["icarl", "tuning (D^HT)"] == (f"{100 * best['acc']:.2f} ({100 * best['acc_std']:.2f}) / "
                                                  f"{100 * best['avg_acc']:.2f} ({100 * best['avg_acc_std']:.2f})")
    assert table.at["icarl", "HM tuning (D^HT)"] == f"{100 * best['hmean']:.2f}"
    assert table.at["icarl", "HM evaluation (D^E)"] == f"{100 * ev['hmean']:.2f}"
    row = report.summary[(report.summary["label"] == "icarl") & (report.summary["phase"] == "evaluate")].iloc[0]
    assert row["acc"] == pytest.approx(ev["acc"]) and row["hmean"] == pytest.approx(ev["hmean"])
    tune_curve = report.curves[(report.curves["label"] == "icarl") & (report.curves["phase"] == "tune")]
    assert tune_curve.set_index("t")["mean"].to_dict() == pytest.approx({1: best["avg_acc"] + 0.05, 2: best["acc"]})


def test_incomplete_sets_and_phase_runs_are_shown_as_such(reports):
    report = reports["percent"][1]
    sets = report.sets.set_index("label")
    assert sets.loc["replay", ["complete", "incomplete", "diverged"]].tolist() == [2, 1, 0]
    # set 2 (one ordering, the best-looking score) is not eligible: the best so far is H*'s, set 1
    conv = report.convergence[report.convergence["label"] == "replay"].sort_values("trial")
    assert math.isnan(conv["score"].iloc[2]) and conv["best_so_far"].iloc[2] == pytest.approx(
        stats(PLAN["replay"][0][1])["hmean"])
    # the later incomplete evaluation is left out: the earlier complete one is reported, and the report says so
    replay = report.summary[(report.summary["label"] == "replay") & (report.summary["phase"] == "evaluate")].iloc[0]
    assert replay["acc"] == pytest.approx(stats(PLAN["replay"][1])["acc"])
    md = (report.out / "report.md").read_text()
    assert "Left out: evaluate of study u-replay: incomplete (1/2 orderings)." in md
    assert "| algorithm | trials | complete | incomplete | diverged |" in md


def test_report_run_holds_an_html_report_with_its_figures(reports):
    uri, report = reports["percent"]
    client = MlflowClient(tracking_uri=uri)
    top = {a.path for a in client.list_artifacts(report.run_id)}
    assert "report.html" in top
    page = (report.out / "report.html").read_text()
    folder = next(p.parent for p in report.paths if p.suffix == ".png")
    pngs = sorted(folder.glob("*.png"))
    assert pngs and page.count('src="data:image/png;base64,') == len(pngs)
    assert "![" not in page and "Left out: evaluate of study u-replay: incomplete (1/2 orderings)." in page
    for png in pngs:
        assert png.with_suffix(".pdf").read_bytes()[:5] == b"%PDF-"
