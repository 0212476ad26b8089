"""What a newcomer's terminal shows (issue 37): gtep's own lines and the library lines a user can act on, none of
the others (gtep/orchestration/quiet.py), and compute.max_concurrent held whichever searcher runs.

The studies run `gtep run` in a subprocess with the environment of a user's shell: none of the RAY_*, MLFLOW_*
and HF_* settings tests/conftest.py makes (RAY_AUTH_MODE=disabled above all, which hides Ray's token
authentication note), and a fresh HOME (no ~/.ray/auth_token yet, as on a new machine).
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from ray import tune
from ray.tune.search import ConcurrencyLimiter
from ray.tune.search.basic_variant import BasicVariantGenerator
from ray.tune.search.optuna import OptunaSearch

from gtep.config import resolve, validate_config
from gtep.orchestration.ray_search import concurrency_limited, run_tuner, searcher
from gtep.orchestration.study import Manifest, StudyPaths
from gtep.protocol.phases import EVALUATE, TUNE
from gtep.spaces import load_space
from tests.orchestration.test_phases import config

# The lines issue 37 names, and the library lines met on the way (each dropped by gtep.orchestration.quiet)
NOISE = re.compile("|".join([
    r"Token authentication", r"RAY_AUTH_MODE",  # Ray, starting its local cluster with its default token auth
    r"max_concurrent_trials",  # Tune, given both a search generator and max_concurrent_trials
    r"Failed to fetch metrics", r"FileNotFoundError",  # Tune, after an interrupted phase: trials never started
    r"Traceback \(most recent call last\)",
    r"MLflow database tables", r"Updating database tables",  # MLflow, creating a study's sqlite store
    r"A new study created in memory",  # Optuna, under Ray's OptunaSearch
]))
SPACE = {"algorithm": "replay", "space": {"epochs": [3], "batch_size": [16], "lr": [0.05, 0.1],
                                          "scheduler": ["cosine"]}}


def study(name: str, tmp_path: Path, *, epochs: int = 2, **changes) -> Path:
    """A replay study of a few seconds a unit on synthetic classes, written as a user's YAML."""
    (tmp_path / "space.yaml").write_text(yaml.safe_dump(changes.pop("space", SPACE)))
    doc = {
        "study": name, "algorithm": "replay", "backbone": "resnet8", "scenario": {"increments": "3x3"},
        "datasets": {"split": {"dataset": "synthetic:classes=20,train=30,test=10", "classes_per_phase": 9, "seed": 1}},
        "search": {"trials": 2, "orderings": 2, "space": str(tmp_path / "space.yaml")},
        "first_task": {"epochs": epochs, "milestones": [epochs // 2], "batch_size": 16},
        "training": {"memory_size": 18, "epoch_scale": 1.0}, "compute": {"cpus_per_trial": 1}, "seed": 5,
    }
    for key, value in changes.items():
        doc[key] = {**doc[key], **value}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def users_shell(tmp_path: Path) -> dict[str, str]:
    """os.environ without what the test session adds for Ray, Tune, MLflow and the hub; a HOME of its own."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "TUNE_", "MLFLOW_", "HF_"))}
    (tmp_path / "home").mkdir(exist_ok=True)
    return {**env, "HOME": str(tmp_path / "home"), "PYTHONUNBUFFERED": "1"}


def gtep_run(tmp_path: Path, config_path: Path, log: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "gtep.cli", "run", "--config", str(config_path),
                             "--output", str(tmp_path / "runs")], stdout=open(log, "w"), stderr=subprocess.STDOUT,
                            env=users_shell(tmp_path), cwd=tmp_path, start_new_session=True)


def noise(output: str) -> list[str]:
    return [line for line in output.splitlines() if NOISE.search(line)]


@pytest.mark.slow  # a whole `gtep run` in a fresh process: the slow group, with the other studies
def test_a_fresh_run_prints_gteps_table_and_no_line_a_user_cannot_act_on(tmp_path):
    # the random searcher with compute.max_concurrent: Tune warned its max_concurrent_trials would be ignored
    path = study("newcomer", tmp_path, search={"orderings": 1}, compute={"max_concurrent": 1})
    process = gtep_run(tmp_path, path, tmp_path / "run.log")
    code = process.wait(timeout=600)
    output = (tmp_path / "run.log").read_text()
    assert code == 0, output[-3000:]
    assert "GTEP: replay on 3x3" in output and "HM (%)" in output and "study folder:" in output, output
    assert not noise(output), output
    assert (tmp_path / "home" / ".ray" / "auth_token").exists(), "Ray's default token authentication stays on"


@pytest.mark.slow  # a whole `gtep run` in a fresh process: the slow group, with the other studies
def test_an_interrupted_run_prints_gteps_resume_line_and_not_tunes_missing_metrics(tmp_path):
    # An Optuna searcher with no concurrency limit, and trials as large as Ray's local node: one trial runs, the
    # others wait and never start, so Tune finds no result file for them when the phase stops.
    from ray._private.utils import get_num_cpus

    space = {**SPACE, "space": {**SPACE["space"], "epochs": [20]}}
    path = study("stopped", tmp_path, epochs=20, space=space, search={"trials": 3, "searcher": "optuna-tpe"},
                 compute={"cpus_per_trial": get_num_cpus()})
    process = gtep_run(tmp_path, path, tmp_path / "run.log")
    events = tmp_path / "runs" / "stopped" / "events.jsonl"
    deadline = time.monotonic() + 300
    while not (events.exists() and '"unit_started"' in events.read_text()):
        assert process.poll() is None and time.monotonic() < deadline, (tmp_path / "run.log").read_text()[-3000:]
        time.sleep(0.5)
    os.killpg(process.pid, signal.SIGINT)  # a terminal's Ctrl-C: the driver's whole process group
    code = process.wait(timeout=180)
    output = (tmp_path / "run.log").read_text()
    assert code == 130, output[-3000:]
    assert "gtep run --resume" in output, output
    never_started = [trial for trial in (tmp_path / "runs" / "stopped" / "ray").glob("tune-*/train_set_*")
                     if not (trial / "result.json").exists() and not (trial / "progress.csv").exists()]
    assert never_started, "the test needs trials that never started when the phase stopped"
    assert not noise(output), output


# ---------------------------------------------------------------- compute.max_concurrent, whichever searcher runs


SEARCHERS = ("random", "optuna-tpe", "optuna-random")


def tuning_search(tmp_path: Path, searcher_name: str, max_concurrent: int | None, trials: int = 3):
    """The tune phase's (resolved, param_space, search_alg, num_samples) for search.searcher, as tune_phase builds
    them (the random searcher's sets are the manifest's)."""
    doc = config(search={"trials": trials, "orderings": 1, "searcher": searcher_name},
                 compute={"max_concurrent": max_concurrent}, tracking={"output": str(tmp_path)})
    resolved = resolve(validate_config(doc, "test"))
    space = load_space("replay", resolved.space_path).space
    sets = [{"index": i, "hparams": {"lr": 0.01 * (i + 1)}} for i in range(trials)]
    manifest = Manifest(tmp_path / "manifest.json", {"sets": sets if searcher_name == "random" else [],
                                                     "phases": {}, "units": {}})
    return (resolved, *searcher(resolved, manifest, space, 1))


@pytest.mark.parametrize("searcher_name", SEARCHERS)
@pytest.mark.parametrize("max_concurrent", [None, 2])
def test_the_search_algorithm_holds_max_concurrent_so_the_tuner_never_ignores_it(tmp_path, searcher_name,
                                                                                  max_concurrent):
    resolved, _, search_alg, _ = tuning_search(tmp_path, searcher_name, max_concurrent)
    limited = concurrency_limited(search_alg, max_concurrent)
    if searcher_name == "random":
        assert isinstance(limited, BasicVariantGenerator) and limited.max_concurrent == (max_concurrent or 0)
    elif max_concurrent:
        assert isinstance(limited, ConcurrencyLimiter) and limited.max_concurrent == max_concurrent
        assert isinstance(limited.searcher, OptunaSearch)
    else:
        assert isinstance(limited, OptunaSearch)
    fixed = concurrency_limited(None, max_concurrent)  # a fixed-set phase's grid over its orderings
    assert isinstance(fixed, BasicVariantGenerator) and fixed.max_concurrent == (max_concurrent or 0)


def test_a_search_generator_that_cannot_hold_the_limit_is_refused():
    from ray.tune.search import SearchGenerator

    with pytest.raises(TypeError, match="max_concurrent"):
        concurrency_limited(SearchGenerator(OptunaSearch(metric="score", mode="max")), 1)


@pytest.fixture(scope="module")
def small_ray(local_ray):
    """This worker's Ray (tests/conftest.py)."""


def most_at_once(spans: list[tuple[float, float]]) -> int:
    edges = sorted([(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans])
    running = peak = 0
    for _, step in edges:
        running += step
        peak = max(peak, running)
    return peak


@pytest.mark.parametrize("searcher_name", [*SEARCHERS[:2], "fixed set"])
def test_at_most_max_concurrent_trials_run_at_once(small_ray, tmp_path, monkeypatch, searcher_name):
    """Trials of a tenth of a CPU each, 10 of which fit the 1-CPU Ray, and Tune free to queue 8 of them (it queues one
    at a time for a Searcher by default): only the limit holds them to one at a time."""
    monkeypatch.setenv("TUNE_MAX_PENDING_TRIALS_PG", "8")
    spans = tmp_path / "spans"
    spans.mkdir()

    def trial(config):
        start = time.time()
        time.sleep(1.5)
        (spans / f"{os.getpid()}-{start}.json").write_text(json.dumps([start, time.time()]))
        tune.report({"score": 0.5, "orderings_done": 1})

    if searcher_name == "fixed set":
        resolved, *_ = tuning_search(tmp_path, "random", 1)
        param_space, search_alg, num_samples = {"orderings": tune.grid_search([[0], [1], [2]])}, None, 1
    else:
        resolved, param_space, search_alg, num_samples = tuning_search(tmp_path, searcher_name, 1)
    run_tuner(resolved, StudyPaths(tmp_path / "study"), TUNE if search_alg else EVALUATE, "a",
              tune.with_resources(trial, {"cpu": 0.1}), param_space, search_alg, num_samples, [])
    runs = [tuple(json.loads(p.read_text())) for p in spans.iterdir()]
    assert len(runs) == 3
    assert most_at_once(runs) == 1
