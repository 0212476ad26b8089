"""gtep report over a real tracked study: replay and icarl, each `gtep run` plus `gtep evaluate --hparams original`
through the CLI into one sqlite MLflow store; every table value is then checked against the store, read here
independently with MlflowClient."""
import math
import re
import statistics

import pandas as pd
import pytest
import yaml
from mlflow.tracking import MlflowClient
from typer.testing import CliRunner

from gtep.cli import app
from gtep.orchestration.importance import IMPORTANCE_TAG, read_importance_tag
from gtep.orchestration.report_store import trial_hparams, trial_row
from gtep.reporting import run_report
from gtep.reporting.importance import hyperparameter_importance, trial_scores

ALGORITHMS = ("replay", "icarl")
R, S = 2, 2
CONFIG = {
    "study": "rep",
    "algorithm": "replay",
    "backbone": "resnet8",
    "scenario": {"increments": "3x2"},
    "datasets": {"split": {"dataset": "synthetic:classes=14,train=20,test=8,noise=150", "classes_per_phase": 6,
                           "seed": 1}},
    "search": {"trials": R, "orderings": S},
    "first_task": {"epochs": 3, "milestones": [2], "batch_size": 16},
    "training": {"memory_size": 12, "epoch_scale": 0.02},
    "compute": {"cpus_per_trial": 1, "max_concurrent": 2},
    "seed": 3,
}
PNGS = ("task_curves", "acc_vs_params", "acc_vs_time", "original_vs_hstar", "convergence")


def invoke(*args):
    result = CliRunner().invoke(app, [str(a) for a in args])
    assert result.exit_code == 0, result.output + repr(result.exception)
    return result


@pytest.fixture(scope="module")
def tracked(tmp_path_factory, local_ray):
    root = tmp_path_factory.mktemp("report")
    config = root / "exp.yaml"
    config.write_text(yaml.safe_dump(CONFIG))
    out = root / "out"
    for algorithm in ALGORITHMS:  # on this worker's Ray (local_ray), which the four commands join
        common = ["--config", config, "--output", out, "--algorithm", algorithm, "--study", f"rep-{algorithm}"]
        invoke("run", *common)
        invoke("evaluate", *common, "--hparams", "original")
    uri = f"sqlite:///{out / 'mlflow.db'}"
    report = run_report(uri, ["rep-*"], out=root / "report", formats=("table", "md", "csv", "latex"))
    return {"root": root, "out": out, "uri": uri, "client": MlflowClient(tracking_uri=uri), "report": report}


# ---------------------------------------------------------------- the store, read by hand

def runs(client, experiment, query):
    exp = client.get_experiment_by_name(experiment)
    return client.search_runs([exp.experiment_id], query, max_results=1000)


def phase_run(client, algorithm, label):
    """The latest finished phase run of a label, found without the report's code."""
    found = [r for r in runs(client, f"gtep/rep-{algorithm}", "tags.`gtep.level` = 'phase'")
             if r.info.status == "FINISHED"]
    if label == "original":
        found = [r for r in found if r.data.tags.get("gtep.hparams_source") == "preset:original"
                 or r.data.tags["gtep.phase"] == "original"]
    else:
        found = [r for r in found if r.data.tags["gtep.phase"] == label
                 and r.data.tags.get("gtep.hparams_source", "tuning") == "tuning"]
    return max(found, key=lambda r: r.info.start_time)


def children(client, algorithm, parent_id):
    return runs(client, f"gtep/rep-{algorithm}", f"tags.`mlflow.parentRunId` = '{parent_id}'")


def ordering_runs(client, algorithm, label):
    phase = phase_run(client, algorithm, label)
    if label == "tune":
        trials = [client.get_run(phase.data.tags["gtep.best_trial_run_id"])]
    else:
        trials = children(client, algorithm, phase.info.run_id)
    return [o for t in trials for o in children(client, algorithm, t.info.run_id)]


def fraction(run, name):
    """A run's accuracy metric as a fraction: runs tagged gtep.units=percent log 57.0 for 0.57. A tuning phase run
    logs H*'s numbers as best_<name> (fraction stores) or <name> (percent stores)."""
    metrics = run.data.metrics
    value = metrics.get(f"best_{name}", metrics.get(name)) if run.data.tags.get("gtep.level") == "phase" \
        and run.data.tags.get("gtep.phase") == "tune" else metrics[name]
    return value / 100 if run.data.tags.get("gtep.units") == "percent" else value


def by_hand(client, algorithm, label):
    units = ordering_runs(client, algorithm, label)
    assert len(units) == S and all(u.data.tags["gtep.status"] == "finished" for u in units)
    acc = [fraction(u, "acc") for u in units]
    avg = [fraction(u, "avg_acc") for u in units]
    out = {"acc": statistics.fmean(acc), "acc_std": statistics.pstdev(acc), "avg_acc": statistics.fmean(avg),
           "avg_acc_std": statistics.pstdev(avg)}
    out["hmean"] = 2 * out["acc"] * out["avg_acc"] / (out["acc"] + out["avg_acc"])
    out["cell"] = (f"{100 * out['acc']:.2f} ({100 * out['acc_std']:.2f}) / "
                   f"{100 * out['avg_acc']:.2f} ({100 * out['avg_acc_std']:.2f})")
    return out


def only_table(report):
    assert len(report.tables) == 1  # one scenario, one pairing
    return next(iter(report.tables.items()))


COLUMNS = {"tune": "tuning (D^HT)", "evaluate": "evaluation (D^E)", "original": "Original (D^E)"}


# ---------------------------------------------------------------- checks

def test_every_table_cell_equals_the_store(tracked):
    client, report = tracked["client"], tracked["report"]
    (scenario, pairing), table = only_table(report)
    assert scenario == "3+3" and pairing.count("synthetic:classes=14") == 2
    assert sorted(table.index) == sorted(ALGORITHMS)
    for algorithm in ALGORITHMS:
        for label, column in COLUMNS.items():
            hand = by_hand(client, algorithm, label)
            assert table.at[algorithm, column] == hand["cell"], (algorithm, label)
            row = report.summary[(report.summary["label"] == algorithm) & (report.summary["phase"] == label)].iloc[0]
            for key in ("acc", "acc_std", "avg_acc", "avg_acc_std", "hmean"):
                assert row[key] == pytest.approx(hand[key], abs=1e-12), (algorithm, label, key)
            assert row["run_id"] == phase_run(client, algorithm, label).info.run_id


def test_table_agrees_with_the_phase_runs_own_metrics(tracked):
    client, summary = tracked["client"], tracked["report"].summary
    for algorithm in ALGORITHMS:
        tune, evaluate = phase_run(client, algorithm, "tune"), phase_run(client, algorithm, "evaluate")
        row = summary[(summary["label"] == algorithm) & (summary["phase"] == "tune")].iloc[0]
        # the report averages the ordering runs' metrics, the phase run logged the mean of unrounded values: both
        # are rounded to 4 decimals of a percent, so they agree within 1e-6 as fractions
        assert (row["acc"], row["avg_acc"], row["acc_std"]) == pytest.approx(
            tuple(fraction(tune, k) for k in ("acc", "avg_acc", "acc_std")), abs=1e-6)
        row = summary[(summary["label"] == algorithm) & (summary["phase"] == "evaluate")].iloc[0]
        assert (row["acc"], row["avg_acc"], row["hmean"]) == pytest.approx(
            tuple(fraction(evaluate, k) for k in ("acc", "avg_acc", "hmean")), abs=1e-6)


def test_gap_and_kendall_tau_by_hand(tracked):
    client, report = tracked["client"], tracked["report"]
    (_, _), table = only_table(report)
    tune = {a: by_hand(client, a, "tune")["hmean"] for a in ALGORITHMS}
    evaluate = {a: by_hand(client, a, "evaluate")["hmean"] for a in ALGORITHMS}
    gaps = report.gaps.set_index("label")
    for algorithm in ALGORITHMS:
        assert gaps.at[algorithm, "gap"] == pytest.approx(tune[algorithm] - evaluate[algorithm], abs=1e-12)
        assert table.at[algorithm, "gap HM (pp)"] == f"{100 * (tune[algorithm] - evaluate[algorithm]):.2f}"
    # two algorithms: one pair, concordant (+1) or discordant (-1); a tie on either side leaves no ranking (NaN)
    product = (tune["replay"] - tune["icarl"]) * (evaluate["replay"] - evaluate["icarl"])
    tau = report.ranking.set_index("metric").at["hmean", "tau"]
    assert (math.isnan(tau) and product == 0) or tau == math.copysign(1.0, product)


def test_convergence_and_importance_from_the_tuning_trials(tracked):
    client, report = tracked["client"], tracked["report"]
    for algorithm in ALGORITHMS:
        phase = phase_run(client, algorithm, "tune")
        trials = sorted(children(client, algorithm, phase.info.run_id),
                        key=lambda t: int(t.data.tags["gtep.set_index"]))
        scores = [fraction(t, "hmean") for t in trials]
        curve = report.convergence[report.convergence["label"] == algorithm].sort_values("trial")
        assert list(curve["score"]) == pytest.approx(scores)
        assert list(curve["best_so_far"]) == pytest.approx([max(scores[: i + 1]) for i in range(len(scores))])
        importance = report.importance[report.importance["label"] == algorithm]
        varied = {k for k in trials[0].data.params if not k.startswith("gtep.")
                  and len({t.data.params[k] for t in trials}) > 1}
        if len(set(scores)) > 1:
            assert set(importance["hyperparameter"]) == varied
            assert importance["importance"].sum() == pytest.approx(1.0)
        else:
            assert importance.empty


def test_a_tuning_phase_logs_the_importance_a_report_would_fit_from_its_trials(tracked):
    """The tuning phase fits fANOVA when it ends (the gtep.importance tag); the report shows that fit, and it equals
    a fit over the phase's trial runs as the store holds them (the fallback for runs without the tag)."""
    client, report = tracked["client"], tracked["report"]
    for algorithm in ALGORITHMS:
        phase = phase_run(client, algorithm, "tune")
        logged = read_importance_tag(phase.data.tags.get(IMPORTANCE_TAG, ""))
        assert logged is not None and logged["selection"] == "hmean_of_means"
        trials = children(client, algorithm, phase.info.run_id)
        frame = pd.DataFrame([trial_row(t) for t in trials])
        assert logged["scored"] == int(trial_scores(frame, "hmean_of_means").notna().sum())
        refit = hyperparameter_importance(frame, trial_hparams(trials))
        assert logged["importance"] == pytest.approx(dict(zip(refit["hyperparameter"], refit["importance"])),
                                                     abs=1e-9)
        shown = report.importance[report.importance["label"] == algorithm]
        assert dict(zip(shown["hyperparameter"], shown["importance"])) == pytest.approx(logged["importance"])


def test_plots_exist_and_are_png(tracked):
    report = tracked["report"]
    folders = {p.parent for p in report.paths if p.suffix == ".png"}
    assert len(folders) == 1
    folder = folders.pop()
    names = list(PNGS) + (["importance"] if not report.importance.empty else [])
    for name in names:
        png = folder / f"{name}.png"
        assert png.exists() and png.stat().st_size > 1000, name
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert png.with_suffix(".pdf").read_bytes()[:5] == b"%PDF-"  # vector, for a paper
    for name in ("report.md", "report.html", "summary.csv", "ranking.csv", "ranking.tex"):
        assert (report.out / name).stat().st_size > 0
    assert (folder / "table.tex").exists() and (folder / "table.csv").exists()


def phase_rows(client, experiment_id):
    return client.search_runs([experiment_id], "tags.`gtep.level` = 'phase_row'", max_results=1000)


def test_every_reported_phase_has_one_row_in_one_experiment(tracked):
    """The phases a report compares as one experiment's runs in the UI (MLflow's view over several experiments
    makes N^2 requests): a top-level run in gtep/reports per phase run (on the runs table's first page), written
    once (a second report writes none), its params and metrics those of the phase run; the report run says the
    filter that shows them."""
    client, report = tracked["client"], tracked["report"]
    run = client.get_run(report.run_id)
    rows = phase_rows(client, run.info.experiment_id)
    assert "tags.`gtep.level` = 'phase_row'" in run.data.tags["mlflow.note.content"]
    assert sorted(r.data.tags["gtep.phase_run"] for r in rows) == sorted(report.summary["run_id"])
    assert all("mlflow.parentRunId" not in r.data.tags and r.info.status == "FINISHED" for r in rows)
    summary = report.summary.set_index("run_id")
    for row in rows:
        phase = client.get_run(row.data.tags["gtep.phase_run"])
        assert phase.data.tags["gtep.level"] == "phase", "the tag names the phase run"
        assert row.data.params["study"] == summary.at[phase.info.run_id, "study"]
        assert row.data.params["phase"] == summary.at[phase.info.run_id, "phase"]
        finite = {k: v for k, v in phase.data.metrics.items() if math.isfinite(v)}
        assert row.data.metrics == finite and row.data.tags["gtep.units"] == "percent"
        assert row.data.metrics["hmean"] == pytest.approx(100 * summary.at[phase.info.run_id, "hmean"], abs=1e-3)
    again = run_report(tracked["uri"], ["rep-*"], out=tracked["root"] / "again", figures=False)
    assert len(phase_rows(client, run.info.experiment_id)) == len(rows), "rows are written once per phase run"
    assert client.get_run(again.run_id).info.status == "FINISHED"


def test_report_run_holds_the_files(tracked):
    client, report = tracked["client"], tracked["report"]
    run = client.get_run(report.run_id)
    assert run.data.tags["gtep.level"] == "report" and run.data.tags["gtep.sources"] == "rep-*"
    assert run.info.status == "FINISHED"
    assert client.get_experiment(run.info.experiment_id).name == "gtep/reports"
    top = {a.path for a in client.list_artifacts(report.run_id)}
    assert {"report.md", "report.html", "summary.csv", "ranking.tex"} <= top
    folder = next(a.path for a in client.list_artifacts(report.run_id) if a.is_dir)
    inside = {a.path.split("/")[-1] for a in client.list_artifacts(report.run_id, folder)}
    assert {f"{name}.{ext}" for name in PNGS for ext in ("png", "pdf")} <= inside


def artifact_files(client, run_id, under=None):
    found = set()
    for item in client.list_artifacts(run_id, under):
        found |= artifact_files(client, run_id, item.path) if item.is_dir else {item.path}
    return found


def test_a_phases_snapshot_reads_as_the_runs_it_copies(tracked, monkeypatch):
    """The first report wrote a snapshot of each phase (tag gtep.snapshot): its trial runs and the ordering runs a
    report reads of it. A report that reads the snapshots gets the same trial rows, hyperparameters and ordering
    rows as one that searches the runs, and one whose snapshots cannot be read searches instead."""
    from gtep.orchestration.report_store import RunStore, open_store
    from gtep.reporting.collect import read_trials

    client = tracked["client"]
    for algorithm in ALGORITHMS:
        for label in ("tune", "evaluate", "original"):
            assert phase_run(client, algorithm, label).data.tags.get("gtep.snapshot") == "runs.json"

    def read(store, with_phases=True):
        experiments = store.study_experiments()
        phases = store.phase_runs(experiments)
        ids = sorted(experiments.values())
        trials, hparams = store.trial_runs(ids, phases["run_id"].tolist() if with_phases else [])
        orderings = store.ordering_runs(ids, read_trials(phases, trials, experiments))
        return (trials.sort_values("run_id").reset_index(drop=True),
                hparams.sort_values(["trial_run_id", "name"]).reset_index(drop=True),
                orderings.sort_values("run_id").reset_index(drop=True))

    searched = read(open_store(tracked["uri"]), with_phases=False)
    calls = []
    original = RunStore._read_snapshot
    monkeypatch.setattr(RunStore, "_read_snapshot", lambda self, phase: calls.append(phase) or original(self, phase))
    store = open_store(tracked["uri"])
    searches = []
    search = store._search
    monkeypatch.setattr(store, "_search", lambda ids, *args: searches.append(ids) or search(ids, *args))
    for ours, theirs in zip(read(store), searched):
        pd.testing.assert_frame_equal(ours, theirs)
    assert len(calls) == 3 * len(ALGORITHMS) and len(searched[0]) == len(ALGORITHMS) * (R + 2)  # tune, 2 x 1
    assert searches[1:] == [[], []], "the studies' trial and ordering runs came from their snapshots"
    monkeypatch.setattr(RunStore, "_read_snapshot", lambda self, phase: None)  # unreadable: searched instead
    for ours, theirs in zip(read(open_store(tracked["uri"])), searched):
        pd.testing.assert_frame_equal(ours, theirs)


def test_a_snapshot_is_written_only_of_a_whole_settled_phase(tracked, tmp_path):
    """A finished phase whose trial runs or H*'s orderings are not all there or not all ended (its journal still
    catching up after a server outage) gets no snapshot: the report searches its runs until they have settled."""
    from gtep.orchestration.report_store import open_store

    client = tracked["client"]
    experiment = client.create_experiment("gtep/snapshot-check", artifact_location=tmp_path.as_uri())
    phase = client.create_run(experiment, tags={"gtep.level": "phase", "gtep.phase": "tune"}).info.run_id
    client.log_param(phase, "gtep.trials", "2")
    client.log_param(phase, "gtep.orderings", "1")
    trials = [client.create_run(experiment, tags={"gtep.level": "trial", "mlflow.parentRunId": phase,
                                                  "gtep.set_index": str(i)}).info.run_id for i in range(2)]
    ordering = client.create_run(experiment, tags={"gtep.level": "ordering", "mlflow.parentRunId": trials[1]})
    client.set_tag(phase, "gtep.best_trial_run_id", trials[1])
    client.set_terminated(phase, "FINISHED")
    client.set_terminated(trials[0], "FINISHED")
    try:
        assert open_store(tracked["uri"]).write_snapshots([phase]) == 0, "a trial still running"
        client.set_terminated(trials[1], "FINISHED")
        assert open_store(tracked["uri"]).write_snapshots([phase]) == 0, "H*'s ordering still running"
        client.set_terminated(ordering.info.run_id, "FINISHED")
        assert open_store(tracked["uri"]).write_snapshots([phase]) == 1
        assert client.get_run(phase).data.tags["gtep.snapshot"] == "runs.json"
        assert open_store(tracked["uri"]).write_snapshots([phase]) == 0, "written once"
    finally:
        client.delete_experiment(experiment)


def test_a_report_run_through_a_server_uploads_its_folders_at_once(tracked, monkeypatch):
    """Through a server the report run's folders are uploaded at once (a request per file): the run holds every
    file of the report and ends FINISHED."""
    from gtep.orchestration import report_store
    from gtep.orchestration.report_store import open_store

    client, report = tracked["client"], tracked["report"]
    monkeypatch.setattr(report_store, "is_server", lambda uri: True)
    run_id = open_store(tracked["uri"]).log_report(report.out, ["rep-*"], None, {"tau_hmean.x": 0.5})
    written = {str(p.relative_to(report.out)) for p in report.out.rglob("*") if p.is_file()}
    assert artifact_files(client, run_id) == written and len(written) > 10
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.data.metrics["tau_hmean.x"] == 0.5


def test_report_command(tracked, tmp_path):
    out = tracked["out"]
    result = invoke("report", "rep-replay", "gtep/rep-icarl", "--output", out, "--format", "table,md,csv",
                    "-f", "latex",
                    "--out", tmp_path / "cli", "--no-log")
    assert "Kendall's tau" in result.output and "gap HM" in result.output
    hm = f"{100 * by_hand(tracked['client'], 'icarl', 'evaluate')['hmean']:.2f}"
    assert hm in result.output  # the evaluation phase's HM, as the terminal of gtep evaluate shows it
    assert (tmp_path / "cli" / "report.md").exists() and (tmp_path / "cli" / "ranking.tex").exists()
    assert by_hand(tracked["client"], "icarl", "evaluate")["cell"] in (tmp_path / "cli" / "report.md").read_text()
    # a line per stage as it starts, the tables before the figures, and the seconds of each stage at the end
    lines = result.output.splitlines()
    stages = [line for line in lines if line.startswith("report: ")]
    assert stages[0] == f"report: reading the runs of rep-replay, gtep/rep-icarl from sqlite:///{out.resolve()}/mlflow.db"
    assert stages[1].startswith("report: summarising 6 phase runs of 2 studies")
    assert [line.split()[1] for line in stages[2:5]] == ["1", "figures", "report.html"]
    assert lines.index(stages[3]) > max(i for i, line in enumerate(lines) if "gap HM" in line), "tables first"
    done = re.fullmatch(r"report: done in [\d.]+ s \((.*)\)", stages[-1])
    assert done and [part.split()[0] for part in done.group(1).split(", ")] == [
        "read", "summarise", "tables", "figures", "pages"]


def test_a_report_reads_only_the_ordering_runs_it_shows_and_they_are_enough(tracked, monkeypatch):
    """Of a tuning phase only H*'s orderings are read (1,200 of a paper-scale matrix's 18,600): the report is the
    one every ordering run gives."""
    from gtep.orchestration.report_store import open_store
    from gtep.reporting import build, collect

    store = open_store(tracked["uri"])
    some = collect.collect(store, ["rep-*"])
    monkeypatch.setattr(collect, "read_trials", lambda *args: None)  # every ordering run, as before
    every = collect.collect(store, ["rep-*"])
    tuned = every.orderings.merge(every.phases[["run_id", "phase"]], left_on="phase_run_id", right_on="run_id")
    assert len(some.orderings) < len(every.orderings) == len(some.orderings) + (
        (tuned["phase"] == "tune").sum() - len(ALGORITHMS) * CONFIG["search"]["orderings"])
    ours, theirs = build.build_frames(some), build.build_frames(every)
    for name in ("summary", "gaps", "curves", "convergence", "importance", "sets", "protocols"):
        pd.testing.assert_frame_equal(getattr(ours, name), getattr(theirs, name), obj=name)


def test_metric_histories_read_in_bulk_are_the_runs_histories(tracked, monkeypatch):
    from gtep.orchestration import report_store
    from gtep.orchestration.report_store import open_store

    store = open_store(tracked["uri"])
    ids = [r.info.run_id for a in ALGORITHMS for r in ordering_runs(tracked["client"], a, "evaluate")]
    monkeypatch.setattr(report_store, "BULK_RUNS", 3)  # several chunks
    bulk = store.histories(ids, "acc_t")
    assert bulk == {run_id: [(m.step, m.value) for m in tracked["client"].get_metric_history(run_id, "acc_t")]
                    for run_id in ids} and all(bulk.values())


def test_searches_split_by_experiment_give_the_runs_of_one_search_in_its_order(tracked, monkeypatch):
    """Through a server a report searches many studies in groups at once; the runs and their order (newest
    first) are those of one search over every study."""
    from gtep.orchestration import report_store
    from gtep.orchestration.report_store import open_store

    store = open_store(tracked["uri"])
    ids = sorted(store.study_experiments().values())
    whole = {level: [r.info.run_id for r in store._search(ids, level)] for level in ("trial", "ordering")}
    monkeypatch.setattr(report_store, "is_server", lambda uri: True)
    monkeypatch.setattr(report_store, "SEARCH_GROUP", 1)  # a search per study, at once
    assert len(ids) == len(ALGORITHMS) and all(whole.values())
    assert {level: [r.info.run_id for r in store._search(ids, level)] for level in whole} == whole


@pytest.mark.parametrize("args, option", [
    (["rep-*", "--format", "pdf"], "--format"),
    (["nothing-here"], "SELECTORS"),
    ([], "SELECTORS"),
    (["rep-*", "--matrix", "no-such-matrix"], "--matrix"),  # the matrix name is wrong, not the studies
])
def test_report_command_refuses_bad_input(tracked, tmp_path, args, option):
    result = CliRunner().invoke(app, ["report", *args, "--output", str(tracked["out"]), "--out", str(tmp_path / "x")])
    assert result.exit_code == 2 and option in result.output, result.output
    assert not (tmp_path / "x").exists()


def test_report_command_without_a_store(tmp_path):
    result = CliRunner().invoke(app, ["report", "rep-*", "--output", str(tmp_path / "none")])
    assert result.exit_code == 2 and "--output" in result.output and "no MLflow store" in result.output
    assert not (tmp_path / "none").exists()


def test_task_curves_of_h_star_in_both_phases(tracked):
    client, curves = tracked["client"], tracked["report"].curves
    for algorithm in ALGORITHMS:
        assert {"tune", "evaluate", "original"} <= set(curves.loc[curves["label"] == algorithm, "phase"])
        units = ordering_runs(client, algorithm, "tune")
        scale = [100 if u.data.tags.get("gtep.units") == "percent" else 1 for u in units]
        final = [p.value / k for u, k in zip(units, scale) for p in client.get_metric_history(u.info.run_id, "acc_t")
                 if p.step == max(q.step for q in client.get_metric_history(u.info.run_id, "acc_t"))]
        last = curves[(curves["label"] == algorithm) & (curves["phase"] == "tune")].sort_values("t").iloc[-1]
        assert last["mean"] == pytest.approx(statistics.fmean(final))


def test_report_of_a_matrix_finds_its_store_in_the_matrix_folder(tracked, tmp_path):
    import shutil

    (tmp_path / "runs" / "mx").mkdir(parents=True)
    shutil.copy(tracked["out"] / "mlflow.db", tmp_path / "runs" / "mx" / "mlflow.db")
    result = CliRunner().invoke(app, ["report", "--matrix", "mx", "--output", str(tmp_path / "runs"),
                                      "--out", str(tmp_path / "x")])
    # read from runs/mx/mlflow.db: the store is found, and it holds no phase run of a matrix named mx
    assert result.exit_code == 2 and "no MLflow store" not in result.output, result.output
    assert "--matrix" in result.output and not (tmp_path / "x").exists()
