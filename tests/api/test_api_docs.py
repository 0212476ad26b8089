"""docs/python-api.md runs as written: its python blocks, in the page's order, as the cells of one notebook.

The page runs the embedded default study, `omniglot-replay` (minutes of training). Here the same code runs on a
copy of the session's tiny study (tests/studies.py, built once: tests/conftest.py's SHARED_SCOPES), through the
substitution map below, which names each change: the page's config and folders become the tiny study's, and its
two fresh runs (`gtep.run(cfg)`, `gtep.tune(cfg)`) resume the study, which is trained already, so they return its
finished phases. Everything else runs as printed, the two evaluations of "The phases one by one" training their S
orderings (into the copy, so the session's study stays as the other tests read it).
"""
from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path
from typing import Any

import pytest

import gtep
from tests.studies import CONFIG, STUDY, R, S
from tests.docs.test_docs import ROOT, read_blocks

PAGE = ROOT / "docs" / "python-api.md"


def substitutions(runs: Path, config: Path) -> dict[str, str]:
    """The page's text -> what this test runs instead (every entry must be used: the map cannot go stale)."""
    return {
        'preset="default"': repr(str(config)),  # the default study -> the tiny study's experiment file
        '"my-study.yaml"': repr(str(config)),
        "trials=4": f"trials={R}",
        '"training.epoch_scale": 0.05': f'"training.epoch_scale": {CONFIG["training"]["epoch_scale"]}',
        'output="runs"': f"output={str(runs)!r}",
        '"runs/omniglot-replay"': repr(str(runs / STUDY)),
        '"omniglot-replay-original"': repr(f"{STUDY}-original"),
        '["omniglot-replay"]': repr([STUDY]),
        # the tiny study is trained already: the page's fresh runs resume it (its finished phases, nothing trained)
        "gtep.run(cfg)": "gtep.run(cfg, resume=True)",
        "gtep.tune(cfg)": "gtep.tune(cfg, resume=True)",
    }


def page_cells(runs: Path, config: Path) -> list[str]:
    """The page's python blocks with the substitutions made; each must be marked as run by this file."""
    blocks = [b for b in read_blocks(PAGE)[0] if b.lang == "python"]
    cells, used = [], set()
    for block in blocks:
        text = block.text
        for old, new in substitutions(runs, config).items():
            if old in text:
                text, _ = text.replace(old, new), used.add(old)
        # the page's strings are in double quotes, the map's in single ones (repr)
        assert '"omniglot-replay' not in text and '"runs' not in text, f"{block.where}: a name the map misses"
        cells.append(text)
    assert used == set(substitutions(runs, config)), f"unused substitutions: {set(substitutions(runs, config)) - used}"
    return cells


@pytest.fixture(scope="module")
def runs(tiny_study: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the tiny study's output folder (its study and its MLflow store), for the page to train into."""
    copy = tmp_path_factory.mktemp("api-docs") / "runs"
    shutil.copytree(tiny_study["out"], copy)
    # MLflow keeps the experiment's artifact folder as an absolute URI: point the copy's at the copy, so that the
    # runs the page adds leave nothing in the session's study
    with sqlite3.connect(copy / "mlflow.db") as db:
        db.execute("UPDATE experiments SET artifact_location = replace(artifact_location, ?, ?)",
                   (Path(tiny_study["out"]).resolve().as_uri(), copy.resolve().as_uri()))
    return copy


def test_the_python_api_page_runs_as_written(runs: Path, tiny_study: dict[str, Any], tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]):
    monkeypatch.chdir(tmp_path)  # anything the map missed would land here, not in the checkout
    cells = page_cells(runs, tiny_study["root"] / "exp.yaml")
    assert len(cells) >= 7
    namespace: dict[str, Any] = {}
    for number, cell in enumerate(cells, 1):
        exec(compile(cell, f"docs/python-api.md, python block {number}", "exec"), namespace)
    printed = capsys.readouterr().out

    study = namespace["study"]  # the last one the page made: gtep.load of the folder
    assert isinstance(study, gtep.StudyResult) and study.folder == runs / STUDY
    assert study.tuning.complete and study.evaluation.complete and len(study.tuning.sets) == R
    assert namespace["tuned"].best == study.best
    assert namespace["evaluated"].summary["orderings"] == S
    assert namespace["original"].folder == runs / f"{STUDY}-original"
    assert namespace["der"].algorithm == "der" and namespace["der"].seed == 7
    assert namespace["report"].summary["phase"].isin(["tune", "evaluate"]).any()
    assert namespace["outcome"].best_index in range(R)
    assert namespace["started"].study_dir == runs / STUDY
    # what the page says is printed: the error's line, and what `gtep run` prints
    assert "trials -> trials: must be >= 1, got 0" in printed
    assert "study folder:" in printed and "H* (set" in printed and "GTEP: replay on" in printed
    assert not any(tmp_path.iterdir())
