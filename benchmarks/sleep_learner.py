"""A learner whose units take a set time and nothing else: each task sleeps GTEP_SLEEP_TASK_SECONDS (0.5 s by
default) and predicts at chance, so a study of it measures what gtep and Ray add around units of real length
(seconds, as on a GPU) without using the CPU. benchmarks/cluster_sim.py sets the variable for the Ray nodes it
starts, so that their workers sleep as long.

Registered as "sleep" from outside the package, as benchmarks/noop_learner.py is:

    GTEP_PLUGINS=sleep_learner PYTHONPATH=benchmarks gtep tune --config exp.yaml   # algorithm: sleep
"""
from __future__ import annotations

import os
import time

from noop_learner import ChanceNet
from torch import nn

from gtep.algorithms import ALGORITHMS, CommonParams, IncrementalLearner, TaskData


def task_seconds() -> float:
    return float(os.environ.get("GTEP_SLEEP_TASK_SECONDS", 0.5))


@ALGORITHMS.register("sleep")
class Sleep(IncrementalLearner[CommonParams]):
    """Sleeps through each task (a GPU's work, seen from the CPU); chance-level answers, no memory."""

    uses_memory = False
    fixed_first_task = False  # every unit sleeps its whole time: no first task shared between sets

    def build_network(self) -> nn.Module:
        return ChanceNet()

    def fit_task(self, task: TaskData, fit) -> None:
        time.sleep(task_seconds())
