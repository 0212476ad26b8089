import os
import tempfile
from pathlib import Path

import pytest

# Test environment (../shared/INSTALL.md): no Ray token auth, no MLflow job runners, no hub downloads.
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("MLFLOW_SERVER_ENABLE_JOB_EXECUTION", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("RAY_CHDIR_TO_TRIAL_DIR", "0")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")
# Decoded ImageFolder arrays go to a throw-away cache, not the user's ~/.cache/gtep.
os.environ.setdefault("GTEP_CACHE", tempfile.mkdtemp(prefix="gtep-test-cache-"))

# pytest-xdist runs the groups on every core (pyproject's addopts). Each worker gets Ray's temp folder of its own:
# the sessions, their logs and sockets, and the file through which ray.init() finds a cluster that `ray start`
# made on this machine. Without it a worker's plain ray.init() could join the two-node cluster another worker's
# test started. Kept short: Ray's Unix socket paths must stay under 108 characters.
# Set, not defaulted: xdist's workers inherit the controller's environment, this included.
_ray_tmp = Path(tempfile.gettempdir()) / f"gtep-ray-{os.getpid()}"
_ray_tmp.mkdir(parents=True, exist_ok=True)
os.environ["RAY_TMPDIR"] = str(_ray_tmp)

# xdist's workers get COLUMNS and LINES of the controller's terminal (80 x 24 when it has none), which the CLI's
# console would take as a terminal's width; tests see the width a single pytest process sees.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.pop("COLUMNS", None)
    os.environ.pop("LINES", None)

import torch  # noqa: E402

# One thread: the tests' models are tiny, and on a 2-core machine a second thread mostly adds contention.
torch.set_num_threads(1)


# How pytest-xdist shares the tests out (pyproject's addopts: -n auto --dist loadscope). A module's tests stay on one
# worker, so its module fixtures (a study, a Ray cluster) are built once; these exceptions widen or narrow that.
# (xdist_group marks would say the same, but pytest 9.2's structured node ids lose them: pytest-xdist#1386.)
SHARED_SCOPES = {
    # the session's tiny study (fixture tiny_study below), read by both modules: built once, on one worker
    "tests/api/test_api.py": "tiny-study",
    "tests/api/test_api_docs.py": "tiny-study",
    "tests/orchestration/test_study_end_to_end.py": "tiny-study",
    "tests/orchestration/test_every_set.py": "tiny-study",
    # the one PostgreSQL database of tests/with-postgres.sh: one writer at a time
    "tests/cluster/test_paper_scale.py": "postgres",
    "tests/cluster/test_tracking_server.py::test_a_study_logs_its_lineage_to_a_postgresql_backed_server": "postgres",
    ("tests/cluster/test_auth_server.py::"
     "test_a_study_runs_both_phases_into_an_authenticated_postgresql_backed_server"): "postgres",
}
# many independent, expensive cases and no module fixture to share: each test is a unit of its own
PER_TEST = ("tests/algorithms/test_contract_regression.py", "tests/orchestration/test_phases.py")
# the longest scopes (docs/development.md's measurements), handed out first so that no worker starts one at the end:
# a group's own, longest first (a unit, or a PER_TEST module: its tests). One golden ViT case early, alone: it
# pretrains the ViT that the module's other ViT cases then load (tests/helpers.py, pretrained_vit).
GOLDEN = "tests/algorithms/test_contract_regression.py"
LONGEST_FIRST = ("tests/benchmarks/test_device_bundle.py", "tests/orchestration/test_matrix.py",
                 "tests/cluster/test_paper_scale.py", "postgres",
                 "tests/cluster/test_slurm.py", "tests/project/test_install.py", "tests/benchmarks/test_gpu_check.py",
                 "tests/orchestration/test_cheap_study.py", "tests/orchestration/test_incomplete.py",
                 "tests/report/test_report_store.py", "tests/cluster/test_tracking_server.py",
                 "tests/cluster/test_resume.py", "tests/orchestration/test_speed.py",
                 f"{GOLDEN}::test_results_match_the_golden_record[coda_prompt]", "tiny-study",
                 "tests/orchestration/test_phases.py", "tests/engine/test_checkpoint.py", GOLDEN,
                 "tests/plugins/test_entry_point_plugins.py", "tests/algorithms/test_podnet.py",
                 "tests/orchestration/test_interrupt.py", "tests/orchestration/test_iirc_study.py",
                 "tests/cluster/test_ray_cluster.py", "tests/report/test_every_family_report.py",
                 "tests/orchestration/test_quiet_output.py")


def xdist_scope(nodeid: str) -> str:
    """The unit of work a test belongs to: a shared scope, itself, or its module."""
    for prefix, scope in SHARED_SCOPES.items():
        if nodeid == prefix or nodeid.startswith(prefix + "::"):
            return scope
    module = nodeid.split("::")[0]
    return nodeid if module in PER_TEST else module


def pytest_xdist_auto_num_workers(config):
    """-n auto: a worker per core, and one more for the default and slow groups, whose workers spend much of their
    time waiting on processes of their own (a trial's Ray worker importing torch, a server starting): the spare
    worker keeps the cores busy meanwhile (default group on 2 cores: 11:00 with 2 workers, 10:04 with 3). `.ci/run`
    runs the slow and cluster groups as one session (-m 'slow or cluster'), whose cluster tests spend most of their
    time waiting on servers, nodes and killed drivers: the spare worker fills it. The cluster and ui groups run
    alone keep one per core."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    selected = config.getoption("markexpr") or ""
    return cores if selected in ("cluster", "ui") else cores + 1


@pytest.hookimpl(tryfirst=True)  # before xdist's own, which would pick its scheduler by --dist alone
def pytest_xdist_make_scheduler(config, log):
    from tests.scheduling import ScopeScheduling

    class GtepScheduling(ScopeScheduling):
        scope_of = staticmethod(xdist_scope)
        longest_first = LONGEST_FIRST

    return GtepScheduling(config, log)


def ensure_local_ray() -> None:
    """This worker's local Ray (tests/studies.py's RAY_CPUS: one trial at a time), started once and kept for the next
    module (the CLI and the API join a running Ray instead of starting their own); pytest_sessionfinish stops it."""
    import ray

    from tests.studies import start_ray

    if not ray.is_initialized():
        start_ray()


@pytest.fixture(scope="module")
def local_ray():
    """ensure_local_ray() for a module. Tests of Ray's own start-up, or of a cluster, do not use it."""
    ensure_local_ray()


@pytest.fixture(scope="session")
def tiny_study(tmp_path_factory):
    """One tiny finished study, both phases through `gtep run` on Ray into a sqlite MLflow store, for the tests that
    only read a study (its runs, files, frames, report, replay). Built once per worker that runs such a test; the
    modules that use it are one scope of SHARED_SCOPES, so that is once per session."""
    from tests.studies import run_tiny_study

    ensure_local_ray()
    return run_tiny_study(tmp_path_factory.mktemp("tiny-study"))


def pytest_sessionfinish(session, exitstatus):
    """This worker's Ray stops, and its session folders go with it."""
    import shutil
    import sys

    if "ray" in sys.modules:
        sys.modules["ray"].shutdown()
    shutil.rmtree(_ray_tmp, ignore_errors=True)
