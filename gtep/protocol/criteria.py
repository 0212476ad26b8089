"""H*'s selection criteria: what "best" means, built from an ordering's scalar metrics.

A criterion names the per-ordering metrics it is built from (its components) and how it combines them: the
paper's `hmean_acc_avgacc` is the harmonic mean of Acc and AvgAcc, a one-metric criterion such as `gacc_auc`
is that metric. Both selection rules apply to any criterion (gtep/protocol/selection.py):

    hmean_of_means  the criterion of the components' means over the S orderings (the paper's rule)
    mean_of_hmeans  the mean over the S orderings of each ordering's criterion

For a one-metric criterion the two are the same number. Every criterion is "higher is better".
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Sequence

from gtep.protocol.metrics import harmonic_mean
from gtep.registry import Registry


@dataclass(frozen=True)
class Criterion:
    name: str
    components: tuple[str, ...]  # per-ordering metric names, fractions
    description: str

    def combine(self, values: Sequence[float]) -> float:
        """The criterion of one tuple of component values (NaN if any is NaN)."""
        if any(math.isnan(v) for v in values):
            return float("nan")
        if len(values) == 2:
            return harmonic_mean(values[0], values[1])
        return float(values[0])

    def of(self, metrics: Mapping[str, float]) -> float:
        """The criterion of one ordering's metrics; NaN when a component is missing."""
        return self.combine([float(metrics.get(name, math.nan)) for name in self.components])


# plugins: the gtep.criteria entry points (gtep.plugins), loaded at the first lookup
CRITERIA: Registry[Criterion] = Registry("selection criterion", group="gtep.criteria")


def register_criterion(criterion: Criterion) -> Criterion:
    """A criterion H* can be selected by; a scenario family registers those of its metrics in its own module."""
    CRITERIA.register(criterion.name)(criterion)
    return criterion


# the default as registered, not looked up: a lookup while this module is imported would load the plugins early
DEFAULT_CRITERION = register_criterion(Criterion("hmean_acc_avgacc", ("acc", "avg_acc"),
                                                 "harmonic mean of Acc and AvgAcc (the GTEP paper's, section 4.1)"))
register_criterion(Criterion("last_acc", ("acc",), "Acc: accuracy on every class after the last task"))
register_criterion(Criterion("avg_acc", ("avg_acc",),
                             "AvgAcc: mean over tasks of the accuracy on the classes seen so far"))
