"""What MLflow's compare-experiments view costs as the experiments it spans grow (issue 34's open UI figure).

The paper-scale rehearsal (paper_scale.py) measured 373.5 s before the view over a matrix's 120 studies showed its
first page of phase runs, against 4.73 s over 16 studies. This script isolates the view: a `gtep server` on a fresh
sqlite store on 127.0.0.1, N experiments of two phase runs each (nothing else in the store), then for each N the
view opened in headless Chromium with the same filter paper_scale.py uses, timed until its runs show, and the
requests the page made, counted from Chromium's performance log:

    .venv/bin/python benchmarks/ui_compare_requests.py --experiments 16 32

Measured with MLflow 3.17.2 (2 cores, shared): 16 experiments, 256 `experiments/get` requests, 4.74 s; 32
experiments, 1,024 requests, 14.64 s. The page asks for every experiment once per experiment it shows (N^2), so at
120 studies it makes 14,400 requests; the single `runs/search` behind the table is not where the time goes.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
import urllib.parse
from collections import Counter
from pathlib import Path

from gtep.testing import MlflowServer


def fill(uri: str, experiments: int) -> list[str]:
    """`experiments` studies of two finished phase runs (tune, evaluate) with an hmean each."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    ids = []
    for i in range(experiments):
        experiment = client.create_experiment(f"gtep/ui-study-{i:03d}")
        ids.append(experiment)
        for phase in ("tune", "evaluate"):
            run = client.create_run(experiment, run_name=phase, tags={"gtep.level": "phase", "gtep.phase": phase})
            client.log_metric(run.info.run_id, "hmean", 0.5)
            client.set_terminated(run.info.run_id)
    return ids


def time_view(uri: str, ids: list[str], timeout: float = 900) -> dict:
    """Seconds until the compare-experiments view over `ids` shows its runs, and the API requests it made."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--window-size=1920,1080"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"performance": "ALL"})
    driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
    try:
        driver.get(f"{uri}/")  # the app's bundle once: what is timed is the data
        WebDriverWait(driver, 120).until(lambda d: d.find_element(By.TAG_NAME, "body").text.strip())
        driver.get_log("performance")
        search = urllib.parse.quote("tags.`gtep.level` = 'phase'")
        url = (f"{uri}/#/compare-experiments/s?experiments={urllib.parse.quote(json.dumps(ids))}"
               f"&searchFilter={search}&workflowType=machine_learning")
        start = time.perf_counter()
        driver.get(url)
        WebDriverWait(driver, timeout, poll_frequency=0.2).until(lambda d: any(
            line.endswith("matching runs") for line in d.find_element(By.TAG_NAME, "body").text.split("\n")))
        seconds = round(time.perf_counter() - start, 2)
        requests = Counter()
        for entry in driver.get_log("performance"):
            message = json.loads(entry["message"])["message"]
            if message["method"] == "Network.requestWillBeSent":
                path = urllib.parse.urlsplit(message["params"]["request"]["url"]).path
                if "/ajax-api/" in path:
                    requests[path.split("/mlflow/", 1)[-1]] += 1
        return {"experiments": len(ids), "seconds": seconds, "requests": dict(requests.most_common())}
    finally:
        driver.quit()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--experiments", type=int, nargs="+", default=[16, 32],
                        help="how many experiments the view spans, one measurement each")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="gtep-ui-compare-"))
    server = MlflowServer(folder, f"sqlite:///{folder / 'mlflow.db'}", env=dict(os.environ), workers=1)
    try:
        server.start()
        ids = fill(server.uri, max(args.experiments))
        for count in sorted(args.experiments):
            figure = time_view(server.uri, ids[:count])
            print(f"{count} experiments: shown after {figure['seconds']} s; requests {figure['requests']}", flush=True)
    finally:
        server.stop()
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
