"""Fixtures the learner tests share: fine-tuning with no memory on the small scenario, the baseline every
"keeps more old classes than fine-tuning" test compares with."""
from typing import Any, Callable

import pytest

from gtep.engine import OrderingOutcome
from tests.helpers import run_small


@pytest.fixture(scope="session")
def run_finetune() -> Callable[..., OrderingOutcome]:
    """run_small("finetune", hparams, **options), run once per recipe in a worker: the run is seeded, so every
    module that compares with the same recipe reads the same outcome."""
    runs: dict[str, OrderingOutcome] = {}

    def run(hparams: dict[str, Any] | None = None, **options: Any) -> OrderingOutcome:
        key = repr((sorted((hparams or {}).items()), sorted(options.items())))
        if key not in runs:
            runs[key] = run_small("finetune", hparams, **options)
        return runs[key]

    return run


@pytest.fixture(scope="session")
def finetune(run_finetune: Callable[..., OrderingOutcome]) -> OrderingOutcome:
    """Fine-tuning over run_small's default recipe."""
    return run_finetune()
