"""The report's frames from a hand-built store (no MLflow): cells, NaN for divergence, gap, tau with a rank change,
the choice of phase runs, and the files and plots written."""
import math

import pandas as pd
import pytest

from gtep.orchestration.importance import importance_tag
from gtep.reporting import build, collect
from gtep.reporting.collect import StoreData
from gtep.reporting.importance import best_so_far, trials_to_best

GROUP = ("10+5+5", "D1 → D2")


def phase(run_id, study, label, algorithm, dataset, **extra):
    row = {"run_id": run_id, "experiment": f"gtep/{study}", "study": study, "phase": label, "status": "FINISHED",
           "start_time": 1, "attempt": "a", "matrix": "", "cell": "", "scenario": GROUP[0], "pairing": GROUP[1],
           "similarity": "low", "algorithm": algorithm, "backbone": "resnet32", "dataset": dataset,
           "increments": "10+5+5", "selection": "hmean_of_means", "best_trial_run_id": "", "best_set_index_tag": "",
           "best_set_index": math.nan, "diverged": 0.0}
    row.update(extra)
    return row


def hand_store() -> StoreData:
    """Three algorithms plus one that diverges in the evaluation phase. By harmonic mean the tuning phase ranks
    a > b > c, the evaluation phase b > a > c: one swapped pair of three, tau = 1/3."""
    phases, trials, orderings = [], [], []
    plan = {  # algorithm: (tuning set 1 (H*) orderings, tuning set 0 orderings, evaluation orderings) as (acc, avg_acc)
        "a": ([(0.6, 0.7), (0.8, 0.9)], [(0.1, 0.1), (0.1, 0.1)], [(0.40, 0.50), (0.40, 0.60)]),
        "b": ([(0.5, 0.6), (0.5, 0.6)], [(0.9, 0.9), (None, None)], [(0.50, 0.60), (0.60, 0.60)]),
        "c": ([(0.3, 0.4), (0.3, 0.4)], [(0.2, 0.2), (0.2, 0.2)], [(0.20, 0.30), (0.20, 0.30)]),
        "d": ([(0.2, 0.3), (0.2, 0.3)], [(0.1, 0.1), (0.1, 0.1)], [(0.30, 0.40), (None, None)]),
    }
    for name, (best, other, evaluation) in plan.items():
        phases.append(phase(f"T{name}", name, "tune", name, "D1", best_trial_run_id=f"T{name}/1",
                            best_set_index_tag="1", best_set_index=1.0))
        phases.append(phase(f"E{name}", name, "evaluate", name, "D2"))
        for set_index, units in ((0, other), (1, best)):
            trial = f"T{name}/{set_index}"
            diverged = sum(acc is None for acc, _ in units)
            hm = [2 * a * b / (a + b) for a, b in units if a is not None]
            score = math.nan if diverged else 2 * (sum(a for a, _ in units) / 2) * (sum(b for _, b in units) / 2) / (
                sum(a for a, _ in units) / 2 + sum(b for _, b in units) / 2)
            trials.append({"run_id": trial, "phase_run_id": f"T{name}", "set_index": set_index, "status": "FINISHED",
                           "start_time": 1, "hmean": score, "mean_of_hmeans": sum(hm) / len(hm),
                           "diverged_orderings": float(diverged), "orderings": 2.0})
            orderings += ordering_rows(trial, f"T{name}", set_index, units)
        trials.append({"run_id": f"E{name}/0", "phase_run_id": f"E{name}", "set_index": -1, "status": "FINISHED"})
        orderings += ordering_rows(f"E{name}/0", f"E{name}", -1, evaluation)
    hparams = pd.DataFrame([{"trial_run_id": t["run_id"], "name": "lr", "value": str(0.1 * (t["set_index"] + 1))}
                            for t in trials if t["run_id"].startswith("T")])
    steps = pd.DataFrame([{"run_id": o["run_id"], "t": t, "acc": o["acc"] + (2 - t) * 0.1}
                          for o in orderings if (o["phase_run_id"].startswith("E") or o["trial_run_id"].endswith("/1"))
                          and o["status"] == "finished"
                          for t in (1, 2)])
    tuned = pd.DataFrame([t for t in trials if t["run_id"].startswith("T")])
    return StoreData(pd.DataFrame(phases), tuned, hparams, pd.DataFrame(orderings), steps)


def ordering_rows(trial, phase_run_id, set_index, units):
    rows = []
    for s, (acc, avg) in enumerate(units):
        rows.append({"run_id": f"{trial}/o{s}", "trial_run_id": trial, "phase_run_id": phase_run_id,
                     "set_index": set_index, "ordering": s, "status": "diverged" if acc is None else "finished",
                     "acc": math.nan if acc is None else acc, "avg_acc": math.nan if avg is None else avg,
                     "params_total": 1000.0, "params_trainable": 1000.0, "train_seconds": 10.0 + s,
                     "forgetting": 0.1})
    return rows


@pytest.fixture(scope="module")
def report():
    return build.build_frames(hand_store())


def test_cells_are_mean_and_std_of_h_star_orderings(report):
    table = report.tables[GROUP]
    # a's H* is set 1 (tag), not the better-looking set 0 of b: means 0.7 / 0.8, population std 0.1 / 0.1
    assert table.at["a", "tuning (D^HT)"] == "70.00 (10.00) / 80.00 (10.00)"
    assert table.at["a", "evaluation (D^E)"] == "40.00 (0.00) / 55.00 (5.00)"
    assert table.at["b", "evaluation (D^E)"] == "55.00 (5.00) / 60.00 (0.00)"


def test_diverged_orderings_show_nan_with_their_count(report):
    table = report.tables[GROUP]
    assert table.at["d", "evaluation (D^E)"] == "NaN (1/2 diverged)"
    row = report.summary[(report.summary["label"] == "d") & (report.summary["phase"] == "evaluate")].iloc[0]
    assert math.isnan(row["acc"]) and row["diverged"] == 1 and row["orderings"] == 2
    assert table.at["d", "gap HM (pp)"] == "NaN"


def test_gap_and_ranks_by_hand(report):
    gaps = report.gaps.set_index("label")
    hm = lambda a, b: 2 * a * b / (a + b)  # noqa: E731
    assert gaps.at["a", "gap"] == pytest.approx(hm(0.7, 0.8) - hm(0.4, 0.55))
    assert gaps.at["b", "gap"] == pytest.approx(hm(0.5, 0.6) - hm(0.55, 0.6))
    assert report.tables[GROUP].at["a", "gap HM (pp)"] == f"{100 * (hm(0.7, 0.8) - hm(0.4, 0.55)):.2f}"
    assert (gaps.at["a", "rank_tuning"], gaps.at["a", "rank_evaluation"]) == (1, 2)
    assert report.tables[GROUP].at["b", "rank tune → eval"] == "2 → 1"


def test_tau_sees_the_rank_change(report):
    ranking = report.ranking.set_index("metric")
    assert ranking.at["hmean", "algorithms"] == 3  # d diverged in evaluation: left out of the ranking
    assert ranking.at["hmean", "tau"] == pytest.approx(1 / 3)
    assert ranking.at["hmean", "order_tuning"] == "a > b > c"
    assert ranking.at["hmean", "order_evaluation"] == "b > a > c"


def test_curves_leave_out_diverged_orderings(report):
    evaluation = report.curves[report.curves["phase"] == "evaluate"]
    d = evaluation[(evaluation["label"] == "d")]
    assert set(d["orderings"]) == {1}
    a1 = evaluation[(evaluation["label"] == "a") & (evaluation["t"] == 1)].iloc[0]
    assert a1["mean"] == pytest.approx(0.5) and a1["std"] == pytest.approx(0.0)


def test_convergence_and_importance_from_trials(report):
    conv = report.convergence[report.convergence["label"] == "b"].sort_values("trial")
    # b's set 0 diverged: it does not count, the best so far starts at set 1
    assert math.isnan(conv["best_so_far"].iloc[0]) and conv["best_so_far"].iloc[1] == pytest.approx(0.5 * 1.2 / 1.1)
    assert set(report.importance["label"]) == {"a", "c", "d"}  # b has one scored set: nothing to attribute
    for _, part in report.importance.groupby("label"):
        assert part["importance"].sum() == pytest.approx(1.0)
    curve = best_so_far(pd.DataFrame({"run_id": list("pqrs"), "set_index": [0, 1, 2, 3], "hmean": [0.2, 0.5, 0.4, 0.5],
                                      "diverged_orderings": [0, 0, 0, 0]}))
    assert list(curve["best_so_far"]) == [0.2, 0.5, 0.5, 0.5] and trials_to_best(curve) == 2


def test_latest_usable_phase_run_wins():
    rows = pd.DataFrame([
        phase("old", "s", "evaluate", "a", "D2", start_time=1),
        phase("new", "s", "evaluate", "a", "D2", start_time=2),
        phase("crashed", "s", "evaluate", "a", "D2", start_time=3, status="FAILED"),
        phase("running", "s", "evaluate", "a", "D2", start_time=4, status="RUNNING"),
        phase("orig", "s", "original", "a", "D2", start_time=0),
        phase("nan", "t", "evaluate", "a", "D2", start_time=5, status="FAILED", diverged=2.0),
    ])
    chosen = collect.latest_phases(rows, pd.DataFrame(columns=["phase_run_id", "diverged_orderings"]))
    assert sorted(chosen["run_id"]) == ["nan", "new", "orig"]


def test_files_and_plots(report, tmp_path):
    paths = build.write_files(report, tmp_path, ("md", "csv", "latex"))
    folder = tmp_path / build.slug(*GROUP)
    for name in ("task_curves", "acc_vs_params", "acc_vs_time", "convergence", "importance"):
        png = folder / f"{name}.png"
        assert png in paths and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 1000
    assert not (folder / "original_vs_hstar.png").exists()  # no original phase in this store
    assert "NaN (1/2 diverged)" in (tmp_path / "report.md").read_text()
    assert ("Kendall's tau between the tuning and evaluation rankings of 3 algorithms: HM 0.333, Acc 0.333, "
            "AvgAcc 0.333") in (tmp_path / "report.md").read_text()
    assert r"$D^{HT}$" in (folder / "table.tex").read_text()
    assert pd.read_csv(tmp_path / "ranking.csv").loc[0, "tau"] == pytest.approx(1 / 3)


def test_unknown_format_is_refused():
    from gtep.config import ConfigError

    assert build.check_formats(["md,csv", "latex", "md"]) == ("md", "csv", "latex")
    with pytest.raises(ConfigError, match="--format"):
        build.check_formats(["pdf"])


def test_every_table_has_the_harmonic_mean_of_each_phase(report):
    table = report.tables[GROUP]
    hm = lambda a, b: 2 * a * b / (a + b)  # noqa: E731
    assert table.at["a", "HM tuning (D^HT)"] == f"{100 * hm(0.7, 0.8):.2f}"
    assert table.at["a", "HM evaluation (D^E)"] == f"{100 * hm(0.4, 0.55):.2f}"
    assert table.at["d", "HM evaluation (D^E)"] == "NaN"


def test_task_curves_hold_h_star_on_the_tuning_data_too(report):
    tune = report.curves[(report.curves["label"] == "a") & (report.curves["phase"] == "tune")].set_index("t")
    # H* = set 1 of a: orderings (0.6, 0.7) and (0.8, 0.9); the hand store's acc_t is acc + (2 - t) * 0.1
    assert tune["mean"].to_dict() == pytest.approx({1: 0.8, 2: 0.7})


def image_width(path):
    from matplotlib.image import imread

    return imread(path).shape[1]


def test_one_parameter_panel_when_nothing_is_frozen(tmp_path):
    from gtep.reporting import plots

    summary = build.build_frames(hand_store()).summary
    columns = (("params_total", "parameters (total)"), ("params_trainable", "parameters (trainable)"))
    one = plots.accuracy_against(summary, columns, tmp_path / "same.png", "same", same="total = trainable")
    frozen = summary.assign(params_trainable=summary["params_total"] / 4)
    two = plots.accuracy_against(frozen, columns, tmp_path / "frozen.png", "frozen")
    assert image_width(two) > 1.5 * image_width(one)  # two panels side by side against one


def test_one_algorithm_has_no_nan_tau_lines(tmp_path):
    data = hand_store()
    only_a = lambda frame, column: frame[frame[column].str.match(r"[TE]a")].reset_index(drop=True)  # noqa: E731
    data = StoreData(only_a(data.phases, "run_id"), only_a(data.trials, "run_id"), data.hparams,
                     only_a(data.orderings, "run_id"), data.steps)
    single = build.build_frames(data)
    assert single.ranking.empty
    build.write_files(single, tmp_path, ("md", "csv", "latex"))
    text = (tmp_path / "report.md").read_text()
    assert "Kendall's tau between" not in text and "NaN" not in text.split("### Tuning trials")[0]
    assert "Kendall's tau: not computed" in text and "(here 1)" in text
    assert not (tmp_path / "ranking.tex").exists()


def test_a_tuning_phases_logged_importance_is_used_when_it_scored_the_sets_read(report):
    """A phase run's gtep.importance tag (fitted when the phase ended) replaces the report's own fit, but only
    when it scored as many sets under the same rule as the trials the report read; else the report fits."""
    data = hand_store()
    logged = {"a": importance_tag({"lr": 1.0, "wd": 0.0}, "hmean_of_means", 2),  # the sets read: used
              "c": importance_tag({"lr": 0.5, "wd": 0.5}, "hmean_of_means", 1),  # another count: refitted
              "d": importance_tag({"wd": 1.0}, "mean_of_hmeans", 2)}  # another rule: refitted
    data.phases["importance_tag"] = data.phases["algorithm"].map(logged).where(data.phases["phase"] == "tune")
    tagged = build.build_frames(data).importance.set_index(["label", "hyperparameter"])["importance"]
    fitted = report.importance.set_index(["label", "hyperparameter"])["importance"]
    assert tagged.loc["a"].to_dict() == {"lr": 1.0, "wd": 0.0}
    for label in ("c", "d"):
        assert tagged.loc[label].to_dict() == pytest.approx(fitted.loc[label].to_dict())
    data.phases["importance_tag"] = "not json"
    assert build.build_frames(data).importance.equals(report.importance)


def test_importance_is_percent_with_a_warning_under_twenty_trials(report, tmp_path):
    build.write_files(report, tmp_path, ("md",))
    text = (tmp_path / "report.md").read_text()
    assert "| lr | 100.0 | 100.0 | 100.0 |" in text
    assert "Warning: a, c, d: fANOVA was fitted on 2 scored trials (fewer than 20)" in text
    assert set(report.importance["trials"]) == {2}


def test_figures_are_png_and_the_html_embeds_them_and_pdf_comes_with_latex(report, tmp_path):
    paths = build.write_files(report, tmp_path / "plain", ())
    pngs = [p for p in paths if p.suffix == ".png"]
    assert pngs and not [p for p in paths if p.suffix == ".pdf"] and not list((tmp_path / "plain").rglob("*.pdf"))
    page = (tmp_path / "plain" / "report.html").read_text()
    assert page.count("data:image/png;base64,") == len(pngs) and "![" not in page
    paths = build.write_files(report, tmp_path / "paper", ("latex",))  # vector figures, for the paper
    pngs = [p for p in paths if p.suffix == ".png"]
    assert pngs and all(p.with_suffix(".pdf") in paths for p in pngs)
    assert all(p.with_suffix(".pdf").read_bytes()[:5] == b"%PDF-" for p in pngs)


def test_figures_drawn_from_the_same_numbers_into_the_same_folder_are_reused(report, tmp_path):
    """A second report into the folder of a first (a matrix's closing report, rerun) draws no figure whose group's
    numbers did not change; a group whose numbers changed, or a figure deleted, is drawn again."""
    folders = build.group_folders(report, tmp_path)
    first = build.draw_groups(report, folders)
    assert first.drawn == len(folders) and first.reused == 0
    stamps = {p: p.stat().st_mtime_ns for p in first.paths}
    again = build.draw_groups(report, folders)
    assert again.drawn == 0 and again.reused == len(folders) and again.paths == first.paths
    assert {p: p.stat().st_mtime_ns for p in again.paths} == stamps, "nothing was drawn again"
    changed = build.Report(**{**report.__dict__, "summary": report.summary.assign(hmean=report.summary["hmean"] / 2)})
    assert build.draw_groups(changed, folders).drawn == len(folders), "other numbers: drawn again"
    first.paths[0].unlink()
    assert build.draw_groups(changed, folders).drawn == 1, "a figure missing: its group drawn again"
    assert build.draw_groups(changed, folders, vector=True).drawn == len(folders), "PDFs asked: drawn again"


def test_incomplete_or_interrupted_phase_runs_are_not_results_and_are_named():
    rows = pd.DataFrame([
        phase("done", "s", "evaluate", "a", "D2", start_time=1, status_tag="finished"),
        phase("lost", "s", "evaluate", "a", "D2", start_time=2, status="FAILED", diverged=1.0,
              status_tag="incomplete", orderings_tag="1/2"),
        phase("stop", "s", "original", "a", "D2", start_time=3, status="KILLED", status_tag="interrupted",
              orderings_tag="5"),
        phase("gone", "s", "tune", "a", "D1", start_time=0, status="FAILED"),
        phase("tune", "s", "tune", "a", "D1", start_time=1),
    ])
    empty = pd.DataFrame(columns=["phase_run_id", "diverged_orderings"])
    chosen = collect.latest_phases(rows, empty)
    assert sorted(chosen["run_id"]) == ["done", "tune"]
    notes = list(collect.left_out_phases(rows, chosen)["note"])
    # the crashed tune attempt was replaced by a later one: not worth a line
    assert notes == ["evaluate of study s: incomplete (1/2 orderings)", "original of study s: interrupted"]


def test_set_states_from_tags_or_derived_for_older_stores():
    from gtep.reporting.summary import set_status

    trials = pd.DataFrame({"status": ["FINISHED", "FAILED", "FINISHED", "KILLED", "FAILED"],
                           "diverged_orderings": [0, 0, 1, 0, 0],
                           "set_status": ["", "", "", "", "incomplete"]})
    assert list(set_status(trials)) == ["complete", "incomplete", "diverged", "interrupted", "incomplete"]


def test_report_figures_are_drawn_by_one_process_per_cpu_at_most_one_per_group(monkeypatch):
    from gtep.reporting.build import report_workers

    monkeypatch.delenv("GTEP_REPORT_WORKERS", raising=False)
    monkeypatch.setattr("os.cpu_count", lambda: 16)
    assert report_workers(20) == 8 and report_workers(3) == 3 and report_workers(1) == 1
    monkeypatch.setenv("GTEP_REPORT_WORKERS", "1")
    assert report_workers(8) == 1, "GTEP_REPORT_WORKERS=1 draws every group in the report's own process"
