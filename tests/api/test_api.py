"""The Python API as a notebook uses it: build a config, run a study, read its frames, report and replay it.

One tiny study through real Ray Tune and a real sqlite MLflow store (the session's, tests/studies.py); every frame
is checked against what the study wrote to its folder and to MLflow, so the API cannot drift from the CLI's files."""
from __future__ import annotations

import ast
import inspect
import io
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from rich.console import Console

import gtep
import gtep.api
from gtep.config import ConfigError, ExperimentConfig
from tests.studies import STUDY, R, S

SCENARIO = {
    "study": "api",
    "algorithm": "replay",
    "backbone": "resnet8",
    "scenario": {"increments": "3x2"},
    "datasets": {"split": {"dataset": "synthetic:classes=14,train=20,test=8", "classes_per_phase": 6, "seed": 1}},
    "first_task": {"epochs": 3, "milestones": [2], "batch_size": 16},
    "training": {"memory_size": 12},
    "compute": {"cpus_per_trial": 1, "max_concurrent": 2},
}


def quiet() -> Console:
    return Console(file=io.StringIO(), width=120)


@pytest.fixture(scope="module")
def study(tiny_study):  # shared with test_study_end_to_end.py (tests/conftest.py: SHARED_SCOPES)
    """The session's tiny study (`gtep run`, which calls api.run), as gtep.run returns it to a notebook that runs it
    again: every phase finished, so nothing is trained."""
    console = quiet()
    result = gtep.run(resume=tiny_study["folder"], console=console)
    return {"cfg": gtep.study_config(tiny_study["folder"]), "out": tiny_study["out"], "result": result,
            "printed": console.file.getvalue()}


def test_import_gtep_is_light_and_lists_the_api():
    code = "import sys, gtep; print('torch' in sys.modules, 'ray' in sys.modules, sorted(gtep.__all__))"
    printed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert printed.startswith("False False"), printed  # the API is imported on first use
    for name in ("experiment", "tune", "evaluate", "run", "report", "replay", "load"):
        assert f"'{name}'" in printed


def test_config_from_a_preset_a_mapping_or_a_file(tmp_path):
    preset = gtep.experiment(preset="default", trials=4)
    assert preset.search.trials == 4 and preset.algorithm == "replay"
    assert gtep.experiment() == gtep.experiment(preset="default")
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(SCENARIO))
    from_file = gtep.experiment(path, orderings=2, fields={"scenario.increments": "2x3"})
    assert from_file == gtep.experiment(SCENARIO, orderings=2, fields={"scenario.increments": "2x3"})
    assert from_file.scenario.describe() != gtep.experiment(SCENARIO).scenario.describe()


@pytest.mark.parametrize("call, field", [
    (lambda: gtep.experiment(trials=0), "trials"),
    (lambda: gtep.experiment(epochs=3), "epochs"),
    (lambda: gtep.experiment(fields={"training.epoch_scale": -1}), "training.epoch_scale"),
    (lambda: gtep.check(gtep.experiment(algorithm="no_such_method"), quiet()), "algorithm"),
    (lambda: gtep.experiment(SCENARIO, preset="default"), "preset"),
    (lambda: gtep.replay("/nonexistent/study"), "study_dir"),
    (lambda: gtep.replay("/nonexistent/study", scheduler="hyperband"), "scheduler"),
    (lambda: gtep.report(formats=("pdf-please",)), "--format"),
])
def test_bad_input_is_one_config_error_naming_the_field(call, field):
    with pytest.raises(ConfigError) as caught:
        call()
    assert caught.value.field == field, str(caught.value)


def test_run_returns_h_star_and_the_phases(study):
    result, cfg = study["result"], study["cfg"]
    best = yaml.safe_load((cfg.study_dir / "best.yaml").read_text())
    assert result.best == best["hparams"] and result.tuning.set_index == best["set_index"]
    assert result.tuning.run_id == best["tuning_run_id"]
    assert result.tuning.complete and result.evaluation.complete
    assert result.folder == cfg.study_dir
    assert result.tuning.dataset == result.evaluation.dataset == SCENARIO["datasets"]["split"]["dataset"]
    assert "gtep run" in study["printed"]  # progress goes to the console given


def test_sets_frame_scores_every_set_and_marks_h_star(study):
    sets = study["result"].tuning.sets
    assert len(sets) == R and set(sets["status"]) == {"complete"}
    assert sets.loc[sets["is_best"], "set_index"].tolist() == [study["result"].tuning.set_index]
    assert sets.loc[sets["hmean_of_means"].idxmax(), "is_best"]
    lr_column = [c for c in sets.columns if c.startswith("h.")]
    assert lr_column and sets[lr_column].notna().all().all()


def test_orderings_frames_hold_every_unit(study):
    result = study["result"]
    tuning, evaluation = result.tuning.orderings, result.evaluation.orderings
    assert len(tuning) == R * S and sorted(evaluation["ordering"]) == list(range(S))
    chosen = tuning[tuning["set_index"] == result.tuning.set_index]
    assert chosen["acc"].mean() == pytest.approx(result.tuning.summary["acc"])
    assert evaluation["acc"].mean() == pytest.approx(result.evaluation.summary["acc"])


def test_table_is_the_phases_side_by_side_in_percent(study):
    result = study["result"]
    table = result.table
    assert list(table.index) == ["tuning", "evaluation", "gap"]
    assert table.loc["evaluation", "acc"] == pytest.approx(100 * result.evaluation.summary["acc"])
    assert table.loc["gap", "hmean"] == pytest.approx(table.loc["tuning", "hmean"] - table.loc["evaluation", "hmean"])
    assert table.loc["tuning", "orderings"] == S and table.loc["evaluation", "expected"] == S


def test_load_reads_the_same_results_back(study):
    loaded = gtep.load(study["cfg"].study_dir)
    assert isinstance(loaded, gtep.StudyResult)
    assert loaded.best == study["result"].best
    assert loaded.table.drop(columns="run_id").equals(study["result"].table.drop(columns="run_id"))


def test_a_resumed_finished_phase_returns_its_result_without_training(study):
    folder = study["cfg"].study_dir
    units = sorted((folder / "units").rglob("*.json")) if (folder / "units").exists() else []
    again = gtep.evaluate(resume=folder, console=quiet())
    assert (sorted((folder / "units").rglob("*.json")) if (folder / "units").exists() else []) == units
    assert again.summary["acc"] == pytest.approx(study["result"].evaluation.summary["acc"])
    assert again.run_id == study["result"].evaluation.run_id


def test_evaluate_refuses_a_set_before_any_compute(study, tmp_path):
    cfg = gtep.experiment(study["cfg"], study="api-other", output=tmp_path / "runs")
    with pytest.raises(ConfigError) as caught:
        gtep.evaluate(cfg, hparams="no_such_preset", console=quiet())
    assert caught.value.field == "hparams" and "original" in str(caught.value)
    with pytest.raises(ConfigError) as caught:
        gtep.evaluate(cfg, best={"lr": "fast"}, console=quiet())
    assert caught.value.field == "best"
    assert not (tmp_path / "runs" / "api-other").exists()  # nothing left behind


def test_report_frames_from_the_store(study, tmp_path):
    report = gtep.report([STUDY], output=study["out"], out=tmp_path / "report")
    summary = report.summary
    rows = summary[summary["algorithm"] == "replay"]
    assert set(rows["phase"]) >= {"tune", "evaluate"}
    assert (tmp_path / "report" / "report.html").exists()


def test_replay_gives_the_rules_choice_and_cost(study):
    outcome = gtep.replay(study["cfg"].study_dir, "first_task", protocol_tasks=1)
    assert outcome.best_index in range(R)
    assert 0 < outcome.fraction < 1  # one task of two: cheaper than the full study
    full = gtep.replay(study["cfg"].study_dir, "none")
    assert full.best_index == study["result"].tuning.set_index


def test_the_cli_prints_what_the_api_returns(study, tmp_path):
    """`gtep tune --resume` of the finished study: the CLI is the API's layer and prints its H*."""
    from typer.testing import CliRunner

    from gtep.cli import app

    result = CliRunner().invoke(app, ["tune", "--resume", str(study["cfg"].study_dir)])
    assert result.exit_code == 0, result.output
    assert f"H* on the tuning phase (set {study['result'].tuning.set_index})" in result.output
    assert Path(study["cfg"].study_dir / "best.yaml").exists()


def python_examples() -> list[str]:
    docs = Path(__file__).resolve().parents[2] / "docs"
    blocks = []
    for page in [*docs.rglob("*.md"), docs.parent / "README.md"]:
        blocks += re.findall(r"```python\n(.*?)```", page.read_text(), flags=re.S)
    return blocks


def test_every_python_example_in_the_docs_calls_the_api_as_it_is():
    """The docs' Python blocks compile, name only what `gtep` exports and pass only keywords its functions take,
    so the examples cannot drift from the API (those of docs/python-api.md also run: tests/api/test_api_docs.py)."""
    blocks = python_examples()
    assert len(blocks) >= 5
    calls = 0
    for block in blocks:
        tree = ast.parse(block)
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "gtep":
                assert node.attr in gtep.__all__, f"gtep.{node.attr} in the docs is not part of the API"
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "gtep"):
                params = inspect.signature(getattr(gtep, node.func.attr)).parameters
                takes_any = any(p.kind is p.VAR_KEYWORD for p in params.values())
                for keyword in node.keywords:
                    if keyword.arg is None:
                        continue
                    allowed = keyword.arg in params or (takes_any and keyword.arg in gtep.api.OPTION_FIELDS)
                    assert allowed, f"gtep.{node.func.attr}(... {keyword.arg}=...) in the docs: no such keyword"
                calls += 1
    assert calls >= 10


def test_the_docs_experiment_examples_build_valid_configs():
    """The literal gtep.experiment calls of the docs, run (they only build configs; one that names a file, or
    shows an error inside `try:`, is skipped)."""
    built = 0
    for block in python_examples():
        tree = ast.parse(block)
        shown_to_fail = {id(n) for t in ast.walk(tree) if isinstance(t, ast.Try) for n in ast.walk(t)}
        for node in ast.walk(tree):
            if id(node) in shown_to_fail:
                continue
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "experiment" and not node.args
                    and all(isinstance(k.value, (ast.Constant, ast.Dict)) for k in node.keywords)):
                kwargs = {k.arg: ast.literal_eval(k.value) for k in node.keywords}
                assert isinstance(gtep.experiment(**kwargs), ExperimentConfig)
                built += 1
    assert built >= 1


def test_the_study_shows_its_table_as_text_and_html(study):
    """A notebook that ends a cell with the study sees what `gtep run` prints: H*, the phases side by side."""
    from gtep.reporting.tables import pct, pm

    result = study["result"]
    text, html = repr(result), result._repr_html_()
    for name, value in result.best.items():
        assert name in text and str(value) in text and name in html and str(value) in html
    for phase in (result.tuning, result.evaluation):
        summary = phase.summary
        assert pm(summary["acc"], summary["acc_std"]) in text and pct(summary["hmean"]) in text
        assert f"{100 * summary['acc']:.2f}" in html and f"{100 * summary['hmean']:.2f}" in html
    assert str(result.folder) in text and str(result.folder) in html and "<table" in html
    assert "H* on the tuning phase" in repr(result.tuning) and "Evaluation phase" in repr(result.evaluation)


def test_run_prints_what_the_cli_prints_unless_quiet(study, capsys):
    from gtep.reporting.tables import pct

    result = gtep.run(resume=study["cfg"].study_dir)  # no console given: standard output, as in a notebook
    printed = capsys.readouterr().out
    assert "H* (set" in printed and "study folder:" in printed and "MLflow store:" in printed
    assert pct(result.evaluation.summary["hmean"]) in printed and pct(result.tuning.summary["hmean"]) in printed
    gtep.run(resume=study["cfg"].study_dir, quiet=True)
    assert capsys.readouterr().out.strip() == ""
