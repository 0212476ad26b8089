"""A test plugin (GTEP_PLUGINS): Replay that crashes on the second ordering it starts with a large learning
rate, as a learner with a bug that only some data triggers would. The first ordering of each such value
leaves a marker file in $GTEP_TEST_FLAKY_DIR (O_EXCL: one winner even when orderings start together);
every later one raises."""
from __future__ import annotations

import os
from pathlib import Path

from gtep.algorithms import ALGORITHMS
from gtep.algorithms.replay import Replay

CRASHING_LR = 0.1


@ALGORITHMS.register("flaky_replay")
class FlakyReplay(Replay):
    def fit_task(self, task, fit) -> None:
        # task 2: the first task may come from the study's first-task store, trained by another set
        if task.index == 1 and self.params.lr >= CRASHING_LR:
            marker = Path(os.environ["GTEP_TEST_FLAKY_DIR"]) / f"lr-{self.params.lr}"
            try:
                os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            except FileExistsError:
                raise RuntimeError("flaky_replay crashes on the second ordering of a large learning rate") from None
        super().fit_task(task, fit)
