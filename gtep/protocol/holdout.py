"""Training images held out of pretraining, the same whatever the seed: a scenario may show them as images the
backbone never saw (FLUID's pretrain classes in its stream). Pure: numpy only."""
from __future__ import annotations

from typing import Sequence

import numpy as np

HOLDOUT_SEED = 31  # held-out images depend on the class alone: pretraining and every study draw the same


def held_out_count(n: int, holdout: float) -> int:
    """Training images held out of a class's n: floor(holdout x n) (1e-9: 0.2 x 500 is 100, not 99.99...)."""
    return int(np.floor(holdout * n + 1e-9))


def held_out(y_train: np.ndarray, classes: Sequence[int], holdout: float) -> np.ndarray:
    """Positions in `y_train` of the training images pretraining must not use (the stream may show them):
    floor(holdout x n) of each class's n, drawn by (HOLDOUT_SEED, class) among the class's images in array order.
    A subset of the dataset that keeps a class's images in order (ImageSet.subset) holds out the same images."""
    picked = [np.zeros(0, dtype=np.int64)]
    for c in classes:
        of_class = np.flatnonzero(y_train == c)
        k = held_out_count(len(of_class), holdout)
        if k:
            rng = np.random.default_rng([HOLDOUT_SEED, int(c)])
            picked.append(of_class[rng.choice(len(of_class), size=k, replace=False)])
    return np.sort(np.concatenate(picked))
