"""Issue 57, item 1: the one rule for a tracking address (gtep.config.uris). A `user:password@` in it is refused,
in any letter case of its scheme and in a mistyped scheme, on every path an address comes in by: every command that
takes --tracking-uri, an experiment file (and its ${VAR}s), a study folder (manifest, tracking/state.json) and the
Python API; the refusal never repeats the password and nothing is written."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

import gtep
from gtep.cli import app
from gtep.config import ConfigError
from gtep.config.uris import check_no_userinfo, is_server, redact_uri, redact_uris
from tests.studies import CONFIG

PASSWORD = "pw-Secret-4711"
ADDRESSES = [f"http://alice:{PASSWORD}@127.0.0.1:1", f"HTTP://alice:{PASSWORD}@127.0.0.1:1",
             f"Https://alice:{PASSWORD}@mlflow.example.org", f"htttp://alice:{PASSWORD}@127.0.0.1:1",
             f"postgresql://mlflow:{PASSWORD}@db-host:5432/mlflow"]
IDS = ["http", "HTTP", "Https", "mistyped-scheme", "postgresql"]


@pytest.fixture(autouse=True)
def no_credentials(monkeypatch, tmp_path):
    for name in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))


def invoke(*args: str, input: str | None = None):
    return CliRunner().invoke(app, list(args), input=input)


def assert_refused(result, option: str = "--tracking-uri") -> str:
    assert result.exit_code == 2, result.output
    assert PASSWORD not in result.output, result.output
    assert option in result.output and "***" in result.output, result.output
    return result.output


# ---------------------------------------------------------------- the rule itself

@pytest.mark.parametrize("uri", ["HTTP://h:5000", "Https://h", "http://h"])
def test_a_server_is_told_by_its_scheme_in_any_letter_case(uri):
    assert is_server(uri)  # before: only the lower-case prefix was a server, so HTTP:// skipped every check


@pytest.mark.parametrize("uri", ADDRESSES, ids=IDS)
def test_the_rule_refuses_a_password_in_any_scheme_and_masks_it(uri):
    with pytest.raises(ConfigError) as refused:
        check_no_userinfo(uri, "--tracking-uri")
    assert PASSWORD not in str(refused.value) and ":***@" in str(refused.value)


@pytest.mark.parametrize("uri", ["HTTP://alice@127.0.0.1:5000", "https://alice@h"])
def test_a_user_alone_in_a_server_address_is_refused_too(uri):
    with pytest.raises(ConfigError, match="MLFLOW_TRACKING_USERNAME"):
        check_no_userinfo(uri, "--tracking-uri")


@pytest.mark.parametrize("uri", ["sqlite:////tmp/x/mlflow.db", "http://127.0.0.1:5000", "postgresql://mlflow@db/x",
                                 "file:///tmp/mlruns", "/plain/folder"])
def test_addresses_without_a_secret_pass(uri):
    assert check_no_userinfo(uri, "--tracking-uri") == uri


def test_redaction_masks_only_the_password():
    assert redact_uri(f"http://u:{PASSWORD}@h:1/p?q=1") == "http://u:***@h:1/p?q=1"
    assert redact_uris(f"failed at HTTP://u:{PASSWORD}@h:1/api and postgresql://m:{PASSWORD}@d/x") == (
        "failed at HTTP://u:***@h:1/api and postgresql://m:***@d/x")


# ---------------------------------------------------------------- every command that takes --tracking-uri

def config_file(tmp_path: Path, **tracking) -> Path:
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump({**CONFIG, "tracking": {"output": str(tmp_path / "out"), **tracking}}))
    return path


@pytest.mark.parametrize("uri", ADDRESSES[:4], ids=IDS[:4])
@pytest.mark.parametrize("command", ["tune", "evaluate", "run"])
def test_the_phase_commands_refuse_it_before_anything(tmp_path, command, uri):
    result = invoke(command, "--config", str(config_file(tmp_path)), "--tracking-uri", uri)
    assert_refused(result)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("uri", ADDRESSES[:4], ids=IDS[:4])
def test_check_and_matrix_and_report_and_ui_refuse_it(tmp_path, uri):
    assert_refused(invoke("report", "tiny", "--tracking-uri", uri, "--out", str(tmp_path / "r")))
    assert_refused(invoke("ui", "--tracking-uri", uri, "--port", "5999"))
    matrix = tmp_path / "matrix.yaml"
    matrix.write_text(yaml.safe_dump({
        "matrix": "mx", "algorithms": ["replay"], "scenarios": {"3tasks": "4x3"},
        "pairings": {"split": {"similarity": "high", "datasets": {"split": {
            "dataset": "synthetic:classes=30,train=4,test=2", "classes_per_phase": 12}}}},
        "base": {"backbone": "resnet8", "search": {"trials": 2, "orderings": 2}}}))
    assert_refused(invoke("matrix", "--config", str(matrix), "--tracking-uri", uri, "--output",
                          str(tmp_path / "m")))
    assert not (tmp_path / "r").exists() and not (tmp_path / "m").exists()


@pytest.mark.parametrize("uri", ADDRESSES[:4], ids=IDS[:4])
@pytest.mark.parametrize("form", ["separate", "joined"])
def test_submit_refuses_it_before_asking_the_cluster(tmp_path, uri, form, monkeypatch):
    from gtep.orchestration import jobs

    monkeypatch.setattr(jobs, "client", lambda address: pytest.fail("the cluster was asked"))
    option = ["--tracking-uri", uri] if form == "separate" else [f"--tracking-uri={uri}"]
    # the entrypoint (gtep run --config ... --tracking-uri ...) is what Ray's dashboard shows everyone
    assert_refused(invoke("submit", "--config", str(config_file(tmp_path)), "--address", "http://127.0.0.1:1",
                          *option))


@pytest.mark.parametrize("uri", ADDRESSES[:4], ids=IDS[:4])
@pytest.mark.parametrize("args", [["add", "alice", "--password-stdin"], ["password", "alice", "--password-stdin"],
                                  ["grant", "alice", "tiny", "READ"]], ids=["add", "password", "grant"])
def test_users_refuse_it(uri, args):
    assert_refused(invoke("users", *args, "--tracking-uri", uri, input="a-Long-passphrase-8841\n"))


def study_folder(tmp_path: Path, uri: str) -> Path:
    """A study folder whose journal was written against `uri` (as a study run before this rule could leave)."""
    study = tmp_path / "out" / "tiny"
    (study / "tracking").mkdir(parents=True)
    (study / "tracking" / "state.json").write_text(json.dumps({"tracking_uri": uri, "experiment_id": "1"}))
    (study / "tracking" / "journal.jsonl").write_text("")
    return study


@pytest.mark.parametrize("uri", ADDRESSES[:4], ids=IDS[:4])
def test_sync_neither_stores_nor_prints_it(tmp_path, uri):
    # before: sync never ran the check; it printed the address and wrote it into tracking/state.json
    study = study_folder(tmp_path, "sqlite:///" + str(tmp_path / "mlflow.db"))
    before = (study / "tracking" / "state.json").read_text()
    assert_refused(invoke("sync", str(study), "--tracking-uri", uri))
    assert (study / "tracking" / "state.json").read_text() == before


def test_sync_refuses_one_read_back_from_the_study_folder(tmp_path):
    study = study_folder(tmp_path, ADDRESSES[1])
    result = invoke("sync", str(study))
    assert result.exit_code == 2 and PASSWORD not in result.output and "state.json" in result.output


# ---------------------------------------------------------------- a config file, its ${VAR}s, a manifest, the API

def test_an_experiment_file_with_it_is_refused(tmp_path):
    result = invoke("check", "--config", str(config_file(tmp_path, tracking_uri=ADDRESSES[1])))
    assert_refused(result, "tracking.tracking_uri")


def test_an_address_from_an_environment_variable_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("TEAM_MLFLOW", ADDRESSES[0])
    result = invoke("tune", "--config", str(config_file(tmp_path, tracking_uri="${TEAM_MLFLOW}")))
    assert_refused(result, "tracking.tracking_uri")
    assert not (tmp_path / "out").exists()


def test_a_manifest_with_it_is_refused_on_resume(tmp_path):
    study = tmp_path / "out" / "tiny"
    study.mkdir(parents=True)
    stored = {**CONFIG, "tracking": {"output": str(tmp_path / "out"), "tracking_uri": ADDRESSES[2]}}
    (study / "manifest.json").write_text(json.dumps({"config": stored}))
    result = invoke("run", "--resume", str(study))
    assert result.exit_code == 2 and PASSWORD not in result.output, result.output
    assert sorted(p.name for p in study.iterdir()) == ["manifest.json"]


@pytest.mark.parametrize("uri", ADDRESSES[:4], ids=IDS[:4])
def test_the_api_refuses_it_at_once(tmp_path, uri):
    with pytest.raises(ConfigError) as refused:
        gtep.experiment(CONFIG, tracking_uri=uri)
    assert PASSWORD not in str(refused.value)
    with pytest.raises(ConfigError) as refused:
        gtep.report(tracking_uri=uri, out=tmp_path / "r")
    assert PASSWORD not in str(refused.value) and not (tmp_path / "r").exists()
