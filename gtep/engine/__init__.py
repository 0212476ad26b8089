"""The one training loop: run a scenario for one (hyperparameters, ordering) on its family's data flow
(gtep/engine/flows/). Devices live here."""
from gtep.engine.flows import run_ordering
from gtep.engine.runner import FirstTaskSpec, OrderingJob, OrderingOutcome

__all__ = ["FirstTaskSpec", "OrderingJob", "OrderingOutcome", "run_ordering"]
