"""FLUID's stream (Flexible Sequential Learning, papers/fluid.txt; notes 004.1): generator and predict-then-reveal.

A FLUID sequence mixes "pretrain" classes (those the backbone was pretrained on; its images in the stream are
ones it did not train on) with "novel" classes. Images per class follow Zipf's law: the class of rank r gets
a share proportional to 1 / r**s, scaled so that the sequence totals `total_samples`, and capped by
`per_class_cap` and by the images the class has; what a cap cuts goes to the uncapped classes (the paper's
sequences: about 90k images, at most about 961 per class, so the law is scaled to the total and clipped at
the head, notes 004.1). Every class keeps at least one image. Ranks are a seeded random permutation of the
sequence's classes (pretrain and novel mixed), and the order is a uniform shuffle of the chosen images, so
classes first appear mid-stream.

`PredictThenReveal` is the protocol (the paper's Algorithm 1): step t hands out sample t's image index; its
label is handed out only after the prediction for t was recorded, and asking for it earlier raises.
Pure: stdlib and numpy only.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np
from numpy.typing import ArrayLike

UNSEEN = -1  # the prediction "a class not seen so far in the stream"


def zipf_counts(available: Sequence[int], s: float, total: int, cap: int) -> np.ndarray:
    """Images per class, class i having rank i + 1: proportional to 1/(i+1)**s, summing to `total` (or to
    everything the caps allow, when that is less), each at most min(cap, available[i]) and at least 1.

    Water-filling: classes whose scaled share exceeds their cap take the cap, and the rest of the total is
    re-scaled over the others until no share exceeds its cap; the fractions left by rounding go to the
    classes with the largest remainders (ties: the better rank)."""
    limit = np.minimum(np.asarray(available, dtype=np.int64), int(cap))
    if len(limit) == 0:
        return np.zeros(0, dtype=np.int64)
    if (limit < 1).any():
        raise ValueError(f"classes {np.flatnonzero(limit < 1)[:5].tolist()} have no image to give")
    weight = 1.0 / np.arange(1, len(limit) + 1, dtype=float) ** float(s)
    target = min(int(total), int(limit.sum()))
    share = np.zeros(len(limit))
    capped = np.zeros(len(limit), dtype=bool)
    while True:
        free = ~capped
        rest = target - limit[capped].sum()
        share[capped] = limit[capped]
        share[free] = weight[free] / weight[free].sum() * rest if free.any() else 0.0
        over = free & (share > limit)
        if not over.any():
            break
        capped |= over
    counts = np.clip(np.floor(share).astype(np.int64), 1, limit)
    for i in np.argsort(-(share - np.floor(share)), kind="stable"):
        if counts.sum() >= target:
            break
        if counts[i] < limit[i]:
            counts[i] += 1
    return counts


@dataclass(frozen=True)
class StreamSpec:
    """One sequence: sample t shows image `image[t]` (an id from the pools the generator was given) of class
    `label[t]`; `pretrain[t]` says whether that class is a pretrain class; `counts` maps class -> images."""

    label: np.ndarray  # int64 (N,), dataset class ids
    image: np.ndarray  # int64 (N,), image ids from the class pools
    pretrain: np.ndarray  # bool (N,)
    counts: dict[int, int]

    def __len__(self) -> int:
        return len(self.label)


def fluid_stream(pretrain_images: Mapping[int, ArrayLike], novel_images: Mapping[int, ArrayLike],
                 n_pretrain: int, n_novel: int, zipf_s: float, total: int, cap: int,
                 seed: int | Sequence[int]) -> StreamSpec:
    """A FLUID sequence over `n_pretrain` classes drawn from `pretrain_images` and `n_novel` drawn from
    `novel_images` ({class id: the ids of the images it may show}); classes, ranks, images and order all come
    from `seed`."""
    pools = {**{int(c): np.asarray(v, dtype=np.int64) for c, v in pretrain_images.items()},
             **{int(c): np.asarray(v, dtype=np.int64) for c, v in novel_images.items()}}
    pretrain_available = {int(c): len(pools[int(c)]) for c in pretrain_images}
    novel_available = {int(c): len(pools[int(c)]) for c in novel_images}
    if set(pretrain_available) & set(novel_available):
        raise ValueError(f"classes {sorted(set(pretrain_available) & set(novel_available))[:5]} are both pretrain "
                         "and novel; give disjoint groups")
    rng = np.random.default_rng(seed)
    if n_pretrain > len(pretrain_available) or n_novel > len(novel_available):
        raise ValueError(f"the sequence needs {n_pretrain} pretrain and {n_novel} novel classes; there are "
                         f"{len(pretrain_available)} and {len(novel_available)}")
    pre = rng.choice(sorted(pretrain_available), size=n_pretrain, replace=False).tolist() if n_pretrain else []
    nov = rng.choice(sorted(novel_available), size=n_novel, replace=False).tolist() if n_novel else []
    classes = [int(c) for c in rng.permutation(np.asarray(pre + nov, dtype=np.int64))]  # position = Zipf rank - 1
    available = {**pretrain_available, **novel_available}
    counts = zipf_counts([available[c] for c in classes], zipf_s, total, cap)
    labels, images = [], []
    for c, n in zip(classes, counts):
        labels.append(np.full(n, c, dtype=np.int64))
        images.append(pools[c][rng.choice(available[c], size=n, replace=False)])
    order = rng.permutation(int(counts.sum()))
    label, image = np.concatenate(labels)[order], np.concatenate(images)[order]
    return StreamSpec(label, image, np.isin(label, np.asarray(pre, dtype=np.int64)),
                      {c: int(n) for c, n in zip(classes, counts)})


def first_occurrences(labels: ArrayLike) -> np.ndarray:
    """n_t = 1[y_t was not seen earlier in the stream] (bool per step)."""
    seen: set[int] = set()
    y_all = np.asarray(labels)
    out = np.zeros(len(y_all), dtype=np.bool_)
    for t, y in enumerate(y_all):
        out[t] = int(y) not in seen
        seen.add(int(y))
    return out


class LabelNotYetPredicted(RuntimeError):
    """A label was asked for before the prediction of its sample was recorded."""


class PredictThenReveal:
    """The stream as a learner meets it: `sample(t)` gives step t's image index (never its label), `record(t,
    prediction, unseen_score)` stores the prediction, and only then `reveal(t)` gives the label. Steps go in
    order; every recorded prediction is kept for the metrics (`predictions`, `unseen_scores`)."""

    def __init__(self, spec: StreamSpec) -> None:
        self._spec = spec
        self._next = 0  # the step whose prediction is awaited
        self.predictions = np.full(len(spec), UNSEEN, dtype=np.int64)
        self.unseen_scores = np.full(len(spec), np.nan)

    def __len__(self) -> int:
        return len(self._spec)

    def sample(self, t: int) -> int:
        if t != self._next:
            raise LabelNotYetPredicted(f"step {t} asked for while step {self._next} awaits its prediction")
        return int(self._spec.image[t])

    def record(self, t: int, prediction: int, unseen_score: float) -> None:
        if t != self._next:
            raise LabelNotYetPredicted(f"a prediction for step {t} while step {self._next} awaits one")
        self.predictions[t], self.unseen_scores[t] = int(prediction), float(unseen_score)
        self._next += 1

    def reveal(self, t: int) -> int:
        """Sample t's label (a dataset class id), once its prediction is recorded."""
        if not 0 <= t < self._next:
            raise LabelNotYetPredicted(f"the label of step {t} is asked for before its prediction was recorded")
        return int(self._spec.label[t])


    @property
    def finished(self) -> bool:
        return self._next == len(self._spec)
