"""The one training loop: run a scenario for one (hyperparameters, ordering). Devices live here."""
from gtep.engine import cfsl, multilabel, stream  # noqa: F401  (register the multi-label, CFSL and stream paths of run_ordering)
from gtep.engine.runner import FirstTaskSpec, OrderingJob, OrderingOutcome, run_ordering

__all__ = ["FirstTaskSpec", "OrderingJob", "OrderingOutcome", "run_ordering"]
