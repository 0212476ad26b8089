"""What `gtep check` let through and `tune` then failed on, the commands that had no one-line error, and the
messages that pointed the wrong way (issue 45, item 8). The command-line rows are checked as
tests/cli/test_cli_errors.py checks its own (the same sandbox): exit status 2, one `error:` line holding the field or
option and the fix, nothing written in --output or the working directory, and Ray never started."""
from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Callable

import pandas as pd
import pytest

from gtep.cli import app
from gtep.config import ConfigError
from tests.cli.test_cli_errors import C, Inputs, invoke, runner, sandbox  # noqa: F401 - the fixture
from tests.preflight.test_preflight import fluid, shot_file

PROTONET = {"method": "protonet", "epochs": 1}


def pretrained(dataset: str = "synthetic:classes=12", **section) -> Callable[[Inputs], str]:
    """A config whose phases take classes 2-11 (5 each) and whose pretrain section classes 0-1 of `dataset`."""
    return lambda i: i.cfg(**{"datasets.split.dataset": dataset, "datasets.split.classes": list(range(2, 12)),
                              "datasets.split.classes_per_phase": 5, "scenario.increments": [5],
                              "pretrain": {"classes": [0, 1], **PROTONET, **section}})


def store(i: Inputs, content: bytes | None = None) -> str:
    """A runs folder whose mlflow.db is an SQLite database (or holds `content`)."""
    folder = Path(i.folder("runs"))
    if content is None:
        sqlite3.connect(folder / "mlflow.db").execute("create table t (x)").connection.close()
    else:
        (folder / "mlflow.db").write_bytes(content)
    return str(folder)


def study(i: Inputs, manifest: str) -> str:
    folder = Path(i.folder("runs/a-study"))
    (folder / "manifest.json").write_text(manifest)
    return str(folder)


GAPS: list = [
    # ---- gtep check said ok, and tune failed
    pytest.param(C("check", "-c", pretrained(ways=3)),
                 ["pretrain.ways", "is 3", "only 2 of the 2 pretrain classes", "lower pretrain.ways"],
                 id="protonet-ways-above-pretrain-classes"),
    pytest.param(C("check", "-c", pretrained("synthetic:classes=12,train=6", ways=2, shots=5, queries=5)),
                 ["pretrain.ways", "shots + queries = 10", "the fewest has 6"],
                 id="protonet-episode-above-class-images"),
    pytest.param(C("check", "-c", lambda i: fluid(i)),
                 ["scenario.fluid.head_cut", "is 50", "more than 3 samples", "head class", "below 3"],
                 id="fluid-stream-without-head"),
    pytest.param(C("check", "-c", lambda i: fluid(i, per_class_cap=40, total_samples=2, head_cut=2)),
                 ["scenario.fluid.head_cut", "total_samples 2"], id="fluid-stream-shorter-than-head-cut"),
    pytest.param(C("check", "-c", shot_file({str(c): [c, c + 12] for c in range(12)}, shots=1)),
                 ["scenario.fscil.shot_index", "lists 2 images but shots is 1", "(6 classes list more)",
                  "list exactly 1"],
                 id="shot-index-more-than-shots"),
    # ---- --output '' and output: ''
    pytest.param(C("tune", "-c", lambda i: i.cfg(), "--output", ""), ["--output", "empty", "current folder"],
                 id="opt-output-empty"),
    pytest.param(C("check", "-c", lambda i: i.cfg(), "--output", " "), ["--output", "empty"],
                 id="check-output-blank"),
    pytest.param(C("tune", "-c", lambda i: i.cfg(**{"tracking.output": ""})),
                 ["tracking.output", "empty", "current folder"], id="cfg-output-empty"),
    # ---- ui and replay: one line, exit 2
    pytest.param(C("ui", "--tracking-uri", "http://127.0.0.1:1"), ["--tracking-uri", "http://127.0.0.1:1",
                                                                   "no MLflow server answers", "gtep server"],
                 id="ui-tracking-uri-nobody-answers"),
    pytest.param(C("ui", "--output", lambda i: store(i), "--port", "70000"), ["--port", "70000", "1..65535"],
                 id="ui-port-out-of-range"),
    pytest.param(C("ui", "--output", lambda i: store(i), "--port", "0"), ["--port", "1..65535"], id="ui-port-zero"),
    pytest.param(C("server", "--port", "-5"), ["--port", "1..65535"], id="server-port-negative"),
    pytest.param(C("ui", "--output", lambda i: store(i, b"this is no database\n")),
                 ["--output", "mlflow.db", "not an SQLite database"], id="ui-store-not-a-database"),
    pytest.param(C("replay", lambda i: study(i, "{not json")), ["STUDY_DIR", "manifest.json", "damaged", "restore"],
                 id="replay-manifest-not-json"),
    pytest.param(C("replay", lambda i: study(i, "[1, 2]")), ["STUDY_DIR", "manifest.json", "damaged"],
                 id="replay-manifest-a-list"),
    pytest.param(C("replay", lambda i: study(i, '{"units": [1, 2]}')), ["STUDY_DIR", "cannot read", "restore"],
                 id="replay-manifest-of-another-shape"),
    # ---- messages that pointed one way only
    pytest.param(C("check", "-c", lambda i: i.cfg(pretrain={"classes": list(range(12)), "epochs": 1})),
                 ["pretrain.classes", "with the tune phase", "with the evaluate phase", "kept out of both"],
                 id="pretrain-classes-in-both-phases"),
]


@pytest.mark.parametrize("build, needles", GAPS)
def test_refused_in_one_line(sandbox, build, needles):  # noqa: F811 - sandbox is the imported fixture
    result = invoke(sandbox, build(sandbox[0]))
    message = result.stderr.strip()
    assert message.startswith("error:") and len(message.splitlines()) == 1, message
    missing = [n for n in needles if n not in message]
    assert not missing, f"{missing} not in {message!r}"


@pytest.mark.parametrize("build", [
    pytest.param(pretrained(ways=2, shots=2, queries=1), id="protonet-episodes-that-fit"),
    pytest.param(lambda i: fluid(i, head_cut=2), id="fluid-stream-with-a-possible-head"),
    pytest.param(shot_file({str(c): [c, c + 12] for c in range(12)}, shots=2), id="shot-index-of-exactly-shots"),
])
def test_what_fits_still_passes_check(sandbox, build):  # noqa: F811
    """The new checks refuse only what cannot run: the same configs at the edge pass."""
    inputs, _, out = sandbox
    result = runner.invoke(app, ["check", "-c", build(inputs), "--output", str(out)])
    assert result.exit_code == 0, result.output + result.stderr


class MatrixlessStore:
    """A store whose studies have phase runs, none tagged with a matrix (what collect reads of a RunStore)."""

    def study_experiments(self) -> dict[str, str]:
        return {"gtep/rep-a": "1"}

    def phase_runs(self, experiments: dict[str, str], matrix: str | None = None) -> pd.DataFrame:
        return pd.DataFrame({"run_id": [] if matrix else ["r1"]})


@pytest.mark.parametrize("selectors", [["rep-*"], []])
def test_a_matrix_name_that_matches_nothing_is_named_as_the_option(selectors):
    from gtep.reporting.collect import collect

    with pytest.raises(ConfigError) as err:
        collect(MatrixlessStore(), selectors, matrix="no-such-matrix")  # type: ignore[arg-type]
    assert err.value.field == "--matrix" and "gtep.matrix=no-such-matrix" in err.value.reason


def test_load_refuses_a_damaged_manifest(tmp_path):
    import gtep

    (tmp_path / "manifest.json").write_text("{not json")
    with pytest.raises(ConfigError) as err:
        gtep.load(tmp_path)
    assert err.value.field == "study_dir" and "manifest.json is damaged" in err.value.reason


def test_an_empty_output_from_python_is_refused():
    from gtep.config import validate_config
    from tests.cli.test_cli_errors import merged

    with pytest.raises(ConfigError) as err:
        validate_config(merged(**{"tracking.output": ""}), "test")
    assert err.value.field == "tracking.output"
    assert validate_config(merged(**{"tracking.output": "runs"}), "test").tracking.output == Path("runs")
    import gtep

    with pytest.raises(ConfigError) as err:
        gtep.experiment(preset="default", output="")
    assert err.value.field == "output" and "empty" in str(err.value)


@pytest.mark.parametrize("command", [["matrix", "--preset", "cfsl-learners"], ["report"], ["ui"]])
def test_the_other_output_options_refuse_an_empty_folder_too(command):
    from typer.testing import CliRunner

    from gtep.cli import app

    result = CliRunner().invoke(app, [*command, "--output", ""])
    assert result.exit_code == 2 and "--output: is empty" in result.output, result.output
