"""The MLflow UI in a real browser, as a new user meets it after `gtep run` and `gtep ui` (issue 18).

Group `ui` (pytest -m ui; .ci/run installs Debian's chromium and chromium-driver when they are missing, this test
installs nothing). A tiny study runs in-process on Ray; `gtep ui` starts over its store; headless Chromium, driven
by Selenium, opens the links gtep ui prints and the compare view of the two phase runs. The screenshots go to the
test's tmp folder and to test-artifacts/ui/ in the repository (ignored by git):

  runs.png       the study's runs view: the tune and evaluate phase runs with acc, avg_acc, hmean (%) side by side
  compare.png    MLflow's compare view of the two phase runs: H* as params of both, every metric filled in
  orderings.png  the orderings view: ordering runs grouped by phase, charted per metric with the phases in the legend
"""
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml
from mlflow.tracking import MlflowClient

from gtep.testing import free_port, http_ok
from gtep.testing import wait_for as wait_until
from tests.studies import own_ray, run_study
from tests.ui.browser import headless_chromium

pytestmark = pytest.mark.ui

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "ui"
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--window-size=1920,1080")


def tiny_study() -> dict:
    return {
        "study": "ui", "algorithm": "replay", "backbone": "resnet8", "scenario": {"increments": "3x2"},
        "datasets": {"split": {"dataset": "synthetic:classes=12,train=16,test=6", "classes_per_phase": 6}},
        "search": {"trials": 2, "orderings": 2},
        "first_task": {"epochs": 2, "milestones": [1], "batch_size": 16},
        "training": {"memory_size": 12, "epoch_scale": 0.01}, "seed": 0,
    }


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    with own_ray():
        return run_study(tmp_path_factory.mktemp("ui-study"), tiny_study())["out"]


@pytest.fixture(scope="module")
def ui(study):
    """`gtep ui` over the study: its printed links, then SIGTERM to gtep ui alone must stop the server too."""
    port = free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    proc = subprocess.Popen([sys.executable, "-m", "gtep.cli", "ui", "--output", str(study), "--port", str(port)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    try:
        while not any("orderings by phase" in line for line in lines):
            line = proc.stdout.readline()
            assert line, "gtep ui ended before printing its links:\n" + "".join(lines)
            lines.append(line)
        root = f"http://127.0.0.1:{port}/"
        assert wait_until(lambda: http_ok(root + "health") or proc.poll() is not None, 120, "the MLflow UI",
                          interval=1) and proc.poll() is None, "the MLflow UI never answered"
        links = {"runs": next(w for line in lines if ": runs" in line for w in line.split() if w.startswith(root)),
                 "orderings": next(w for line in lines if "orderings by phase" in line
                                   for w in line.split() if w.startswith(root))}
        yield root, links
    finally:
        proc.send_signal(signal.SIGTERM)  # gtep ui only: it forwards the signal to what it started
        proc.wait(timeout=60)
        deadline = time.time() + 30
        while time.time() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)):
                    break
            time.sleep(0.5)
        else:
            pytest.fail(f"the MLflow UI still serves on port {port} after SIGTERM to gtep ui")


@pytest.fixture(scope="module")
def browser():
    yield from headless_chromium(CHROMIUM_FLAGS, "gtep-ui-chromium",
                                 "apt-get install -y chromium chromium-driver (.ci/run does)")


@pytest.fixture(scope="module")
def shots(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ui-screenshots")
    saved: list[Path] = []

    def save(driver, name: str) -> None:
        path = folder / name
        driver.save_screenshot(str(path))
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, ARTIFACTS / name)
        saved.append(path)

    yield save
    print(f"\nscreenshots: {folder} (copied to {ARTIFACTS}): {', '.join(p.name for p in saved)}")


def wait_for(driver, predicate, what: str, timeout: float = 90):
    """Wait for the React app to render what `predicate` looks for in the page's text (no sleeps)."""
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    try:
        return WebDriverWait(driver, timeout, poll_frequency=0.5).until(
            lambda d: predicate(d.find_element(By.TAG_NAME, "body").text))
    except TimeoutException:
        text = driver.find_element(By.TAG_NAME, "body").text
        pytest.fail(f"the UI never showed {what}; it shows:\n{text[:3000]}")


def shown(value: float) -> str:
    """A metric as the runs table prints it (up to 4 decimals, no trailing zeros)."""
    return f"{value:.4f}".rstrip("0").rstrip(".")


def phase_runs(store: Path):
    client = MlflowClient(tracking_uri=f"sqlite:///{store / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("gtep/ui")
    runs = client.search_runs([experiment.experiment_id], "tags.`gtep.level` = 'phase'")
    return experiment, {r.data.tags["gtep.phase"]: r for r in runs}


def test_runs_view_shows_both_phases_acc_avgacc_hm(study, ui, browser, shots):
    root, links = ui
    experiment, runs = phase_runs(study)
    assert set(runs) == {"tune", "evaluate"}
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"  # opens on runs, not GenAI
    browser.get(links["runs"])
    wanted = [shown(run.data.metrics[k]) for run in runs.values() for k in ("acc", "avg_acc", "hmean")]
    wait_for(browser, lambda text: all(h in text.split("\n") for h in ("acc", "avg_acc", "hmean"))
             and all(v in text.split("\n") for v in wanted) and "evaluate" in text and "tune" in text,
             f"both phase runs with acc/avg_acc/hmean {wanted}")
    shots(browser, "runs.png")


def test_compare_view_of_the_phase_runs_has_no_empty_metric(study, ui, browser, shots):
    root, _ = ui
    experiment, runs = phase_runs(study)
    ids = [runs["tune"].info.run_id, runs["evaluate"].info.run_id]
    browser.get(f"{root}#/compare-runs?runs={urllib.parse.quote(json.dumps(ids))}"
                f"&experiments={urllib.parse.quote(json.dumps([experiment.experiment_id]))}&workflowType=machine_learning")

    def metrics_section(text: str) -> str | None:
        if "Metrics" not in text or "Artifacts" not in text:
            return None
        section = text.split("\nMetrics\n", 1)[-1].split("\nArtifacts", 1)[0]
        return section if "hmean" in section else None

    section = wait_for(browser, metrics_section, "the compare view's metrics")
    from selenium.webdriver.common.by import By

    heading = browser.find_element(By.XPATH, "//*[normalize-space(text())='Metrics']")
    browser.execute_script("arguments[0].scrollIntoView({block: 'start'});", heading)
    shots(browser, "compare.png")
    lines = [line for line in section.split("\n") if line and line != "Show diff only"]
    assert not any(line in ("NaN", "-", "—") for line in lines), section
    names = sorted(set(runs["tune"].data.metrics) | set(runs["evaluate"].data.metrics))
    assert set(runs["tune"].data.metrics) == set(runs["evaluate"].data.metrics), "a metric only one phase has"
    values = [line for line in lines if line not in names]
    assert {"acc", "avg_acc", "hmean"} <= set(lines), section  # (the names column may show only those in view)
    assert len(values) == 2 * len(names), section  # a value for each run and metric
    assert all(float(v.replace("−", "-")) == float(v.replace("−", "-")) for v in values), section
    text = wait_for(browser, lambda t: t if "Parameters" in t else None, "the parameters")
    assert "Nothing to compare" not in text
    hstar = yaml.safe_load((study / "ui" / "best.yaml").read_text())["hparams"]
    for name, value in hstar.items():  # H* is a param of both phase runs
        assert runs["tune"].data.params[name] == runs["evaluate"].data.params[name] == str(value)


def test_orderings_view_charts_the_orderings_by_phase(study, ui, browser, shots):
    _, links = ui
    browser.get(links["orderings"])
    wait_for(browser, lambda text: "Group: tune" in text and "Group: evaluate" in text and "evaluate/o0" in text
             and "tune/set000/o0" in text and "acc_t" in text, "the orderings grouped by phase with their charts")
    shots(browser, "orderings.png")
