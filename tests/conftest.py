import os
import tempfile

# Test environment (../shared/INSTALL.md): no Ray token auth, no MLflow job runners, no hub downloads.
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("MLFLOW_SERVER_ENABLE_JOB_EXECUTION", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("RAY_CHDIR_TO_TRIAL_DIR", "0")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")
# Decoded ImageFolder arrays go to a throw-away cache, not the user's ~/.cache/gtep.
os.environ.setdefault("GTEP_CACHE", tempfile.mkdtemp(prefix="gtep-test-cache-"))

import torch  # noqa: E402

# One thread: the tests' models are tiny, and on a 2-core machine a second thread mostly adds contention.
torch.set_num_threads(1)
