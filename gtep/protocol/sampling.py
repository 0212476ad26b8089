"""Drawing hyperparameter sets from predefined discrete sets (GTEP paper, Algorithm 2 lines 3-5).

The paper samples each hyperparameter h_k independently and uniformly from its set h_k^Set, R times,
with a seeded RNG (the reference code uses random.choice). We do the same with numpy, so the R sets are
a pure function of (space, R, seed) and can be written to the study manifest before any training.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

Value = bool | int | float | str


@dataclass(frozen=True)
class SearchSpace:
    """Named discrete sets, in the order they are sampled (the order fixes the draws for a seed)."""

    sets: dict[str, tuple[Value, ...]]

    def __post_init__(self) -> None:
        if not self.sets:
            raise ValueError("the search space is empty: give at least one hyperparameter with a value set")
        for name, values in self.sets.items():
            if len(values) == 0:
                raise ValueError(f"hyperparameter {name!r} has an empty value set")

    @property
    def names(self) -> list[str]:
        return list(self.sets)

    def size(self) -> int:
        return int(np.prod([len(v) for v in self.sets.values()]))


def _plain(value: Any) -> Value:
    """numpy scalars -> Python scalars, so sets serialise to JSON/YAML and compare equal across runs."""
    return value.item() if isinstance(value, np.generic) else value


def sample_sets(space: SearchSpace, count: int, seed: int) -> list[dict[str, Value]]:
    """Draw `count` hyperparameter sets H_1..H_R, each value uniform over its set (with replacement)."""
    if count < 1:
        raise ValueError(f"the number of sampled sets R must be >= 1, got {count}")
    rng = np.random.default_rng(seed)
    drawn: list[dict[str, Value]] = []
    for _ in range(count):
        drawn.append({name: _plain(values[int(rng.integers(len(values)))]) for name, values in space.sets.items()})
    return drawn


def steplr_milestones(epochs: int, milestone_num: int) -> list[int]:
    """The paper's milestone rule (appendix A.1): m milestones at epochs * 2k / (2m + 1), k = 1..m.

    E.g. m=2 gives [2/5, 4/5] of the epochs, m=3 gives [2/7, 4/7, 6/7]. The reference code truncates.
    """
    if milestone_num < 1:
        raise ValueError(f"milestone_num must be >= 1, got {milestone_num}")
    return [int(epochs * 2 * k / (2 * milestone_num + 1)) for k in range(1, milestone_num + 1)]


def effective_hyperparameters(hparams: Mapping[str, Value]) -> dict[str, Value]:
    """The values that actually shape training: under a cosine or constant schedule the milestone count
    and LR decay are unused (paper appendix A.1), so they are dropped to make that visible."""
    scheduler = str(hparams.get("scheduler", "steplr")).lower()
    if scheduler == "steplr":
        return dict(hparams)
    return {k: v for k, v in hparams.items() if k not in ("milestone_num", "lr_decay")}


def describe_set(hparams: Mapping[str, Value], keys: Sequence[str] | None = None) -> str:
    """A compact one-line form, e.g. 'epochs=70 lr=0.1 scheduler=steplr'."""
    keys = list(keys) if keys is not None else list(hparams)
    return " ".join(f"{k}={hparams[k]}" for k in keys if k in hparams)
