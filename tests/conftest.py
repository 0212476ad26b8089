import os
import tempfile
from pathlib import Path

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
_worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
_ray_tmp = Path(tempfile.gettempdir()) / f"gtep-ray-{os.getpid()}-{_worker}"
_ray_tmp.mkdir(parents=True, exist_ok=True)
os.environ.setdefault("RAY_TMPDIR", str(_ray_tmp))

import torch  # noqa: E402

# One thread: the tests' models are tiny, and on a 2-core machine a second thread mostly adds contention.
torch.set_num_threads(1)


def pytest_sessionfinish(session, exitstatus):
    """Ray's session folders of this worker go with it (a Ray still running has been shut down by its fixture)."""
    import shutil

    shutil.rmtree(_ray_tmp, ignore_errors=True)
