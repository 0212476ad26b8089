"""The scenario generator F of the GTEP paper (Algorithms 2-3): class orderings, task splits, phase splits.

A class-incremental scenario is a list of increments (classes per task). "C50xT1+C10xT5" reads as the
paper's Table 1: 50 classes in one task, then five tasks of 10. Ordering s of a phase is a permutation of
that phase's classes drawn from (seed, s), so the same config always yields the same orderings.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

_TERM = re.compile(r"^\s*C?(\d+)\s*[xX×]\s*T?(\d+)\s*$")


def parse_increments(spec: str | Sequence[int]) -> list[int]:
    """Parse "10x10", "C50xT1+C10xT5" or a list of ints into classes per task.

    "AxB" means B tasks of A classes each (the paper's CAxTB).
    """
    if isinstance(spec, str):
        increments: list[int] = []
        for term in spec.split("+"):
            match = _TERM.match(term)
            if not match:
                raise ValueError(
                    f"cannot read increments term {term.strip()!r}; write e.g. '10x10' or 'C50xT1+C10xT5'"
                )
            classes, tasks = int(match.group(1)), int(match.group(2))
            increments += [classes] * tasks
    else:
        increments = [int(v) for v in spec]
    if not increments or any(v < 1 for v in increments):
        raise ValueError(f"increments must be positive class counts, got {increments}")
    return increments


@dataclass(frozen=True)
class TaskSpec:
    """One task of one ordering: the classes it adds and all classes seen up to it (global ids), and how many
    training images of each new class it has (None: all of them; FSCIL's few-shot sessions: K)."""

    index: int
    new_classes: tuple[int, ...]
    seen_classes: tuple[int, ...]
    shots: int | None = None

    @property
    def old_classes(self) -> tuple[int, ...]:
        return self.seen_classes[: len(self.seen_classes) - len(self.new_classes)]


def ordering_seed(seed: int, ordering: int) -> int:
    """The RNG seed of class ordering s: distinct per ordering, stable for a given study seed."""
    return int(np.random.SeedSequence([seed, ordering]).generate_state(1)[0])


def class_ordering(classes: Sequence[int], seed: int, ordering: int) -> list[int]:
    """Ordering s of the phase's classes: a seeded permutation (PyCIL shuffles with seeds 0..S-1)."""
    rng = np.random.default_rng(ordering_seed(seed, ordering))
    return [int(c) for c in rng.permutation(np.asarray(sorted(classes)))]


def split_tasks(ordered_classes: Sequence[int], increments: Sequence[int]) -> list[TaskSpec]:
    """Cut an ordered class list into tasks; each task is evaluated on all classes seen so far."""
    if sum(increments) != len(ordered_classes):
        raise ValueError(
            f"increments sum to {sum(increments)} but there are {len(ordered_classes)} classes"
        )
    tasks, start = [], 0
    for index, size in enumerate(increments):
        tasks.append(
            TaskSpec(index, tuple(ordered_classes[start : start + size]), tuple(ordered_classes[: start + size]))
        )
        start += size
    return tasks


def build_scenario(classes: Sequence[int], increments: Sequence[int], seed: int, ordering: int) -> list[TaskSpec]:
    """F(D, s): the task sequence of ordering s over the given classes."""
    return split_tasks(class_ordering(classes, seed, ordering), increments)


def split_classes_in_two(classes: Sequence[int], seed: int, first: int, second: int) -> tuple[list[int], list[int]]:
    """High similarity: one dataset's classes cut into two disjoint sets by a seeded permutation."""
    if first + second > len(classes):
        raise ValueError(f"cannot take {first} + {second} disjoint classes from {len(classes)}")
    perm = np.random.default_rng(seed).permutation(np.asarray(sorted(classes)))
    return sorted(int(c) for c in perm[:first]), sorted(int(c) for c in perm[first : first + second])


def split_groups_in_two(
    class_groups: Sequence[str], seed: int, tuning_groups: Sequence[str] | None = None,
    evaluation_groups: Sequence[str] | None = None,
) -> tuple[list[int], list[int]]:
    """High similarity by group (e.g. Omniglot alphabets): whole groups go to one phase or the other.

    Without explicit tuning groups, a seeded permutation of the groups is cut so the class counts of the
    two sides are as equal as possible. Without explicit evaluation groups, every group not in tuning goes to
    evaluation; with them, the groups in neither list are used by neither phase (kept out, e.g. for
    pretraining, or to size a CPU run).
    """
    groups = sorted(set(class_groups))
    if tuning_groups is None:
        order = list(np.random.default_rng(seed).permutation(groups))
        sizes = {g: sum(1 for c in class_groups if c == g) for g in groups}
        total, running = len(class_groups), 0
        chosen: list[str] = []
        for group in order:
            if running + sizes[group] <= total / 2 or not chosen:
                chosen.append(group)
                running += sizes[group]
        tuning_groups = chosen
    unknown = (set(tuning_groups) | set(evaluation_groups or ())) - set(groups)
    if unknown:
        raise ValueError(f"unknown groups {sorted(unknown)}; choose from {groups}")
    both = set(tuning_groups) & set(evaluation_groups or ())
    if both:
        raise ValueError(f"groups {sorted(both)} are in both phases; GTEP's phases must be disjoint")
    chosen_evaluation = set(evaluation_groups) if evaluation_groups is not None else set(groups) - set(tuning_groups)
    tuning = [i for i, g in enumerate(class_groups) if g in set(tuning_groups)]
    evaluation = [i for i, g in enumerate(class_groups) if g in chosen_evaluation]
    return tuning, evaluation


def shared_classes(first: Sequence[object], second: Sequence[object]) -> list[object]:
    """Classes present in both phases; GTEP requires this to be empty (D^HT and D^E are disjoint)."""
    return sorted(set(first) & set(second), key=str)


def few_shot_indices(train_labels: np.ndarray, task: TaskSpec, seed: int, ordering: int,
                     given: Mapping[int, Sequence[int]] | None = None) -> np.ndarray:
    """The training images of a task (indices into the phase's training arrays, ascending): every image of its
    classes, or `task.shots` per class: those `given` lists first (a benchmark's index file), else drawn
    without replacement for (seed, ordering, class), so every set of the study sees the same shots."""
    picked = []
    for c in task.new_classes:
        of_class = np.flatnonzero(train_labels == c)
        if task.shots is None:
            picked.append(of_class)
        elif given is not None and c in given:
            picked.append(np.asarray(given[c][: task.shots], dtype=np.int64))
        else:
            rng = np.random.default_rng([ordering_seed(seed, ordering), int(c)])
            picked.append(rng.choice(of_class, size=min(task.shots, len(of_class)), replace=False))
    return np.sort(np.concatenate(picked)) if picked else np.zeros(0, dtype=np.int64)



def shots_at_phase_positions(given: Mapping[int, Sequence[int]], train_index: np.ndarray) -> dict[int, list[int]]:
    """An index file's dataset positions as positions in a phase's training arrays (`train_index`: each phase
    image's dataset position, ascending). The pre-flight check has made sure every listed image is there."""
    out = {}
    for c, indices in given.items():
        wanted = np.asarray(indices, dtype=np.int64)
        at = np.searchsorted(train_index, wanted)
        kept = at < len(train_index)
        kept[kept] = train_index[at[kept]] == wanted[kept]
        out[c] = [int(i) for i in at[kept]]
    return out
