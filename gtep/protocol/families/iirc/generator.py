"""IIRC: Incremental Implicitly-Refined Classification (Abdelsalam et al. 2021, papers/iirc.txt; notes 001.1).

A two-level label hierarchy: each superclass has subclasses, and some subclasses (standalone) have no
superclass. A sample carries its subclass and, if there is one, its superclass (multi-label). Superclasses
have no images of their own: they borrow images of their subclasses (`assign_samples`).

    task 0       `first_task_superclasses` superclasses only (the largest task, a kind of pretraining)
    later tasks  `classes_per_task` classes each, a mix of remaining superclasses, subclasses of superclasses
                 introduced in an EARLIER task, and standalone subclasses; a subclass never shares a task with
                 its superclass nor comes before it

Labels (notes 001.1, paper Alg. 3-4):
    training (incomplete information)  labels & classes of the current task (`training_labels`)
    post-task validation and test      labels & classes observed so far (`evaluation_labels`): a sample of a
                                       not-yet-seen subclass of a seen superclass carries the superclass only

How a scenario family would use this module (the family is not registered here):

    hierarchy = Hierarchy.of({super: [subs], ...}, standalone=[...])      # the phase's classes
    tasks = iirc_tasks(hierarchy, first, per_task, seed, ordering)         # ScenarioFamily.tasks
    per_class = assign_samples(train_subclass_labels, hierarchy, seed)     # once per phase, not per ordering
    held = hold_out(train_subclass_labels, hierarchy.subclasses, 0.1, seed)  # optional in-task validation:
    # assign_samples(np.where(held, -1, labels), ...) trains, assign_samples(np.where(held, labels, -1), ...) validates
    train_idx = task_training_indices(per_class, tasks[t])                 # images of task t
    y_train = training_targets(train_subclass_labels[train_idx], hierarchy, tasks[t].new_classes, label_index)
    y_test = evaluation_targets(test_subclass_labels, hierarchy, tasks[t].seen_classes, label_index)
    members = task_members(test_subclass_labels, hierarchy, tasks)         # R_jk's samples of task j
    metrics: gtep.protocol.families.iirc.metrics (its default criterion: mean_pw_js)

Its data flow is multi-label (a sigmoid per class, threshold 0.5), unlike the single-label class-incremental
families. Pure: stdlib and numpy only.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

import numpy as np

from gtep.protocol.scenarios import TaskSpec, ordering_seed

SUB_KEEP = 0.8  # a subclass with a superclass keeps the first 80% of its shuffled training images
SUPER_SHARE = 0.4  # its superclass receives the last 40% (so 20% are seen under both labels)
SUPER_CAP_SUBCLASSES = 8  # above 8 subclasses, a superclass takes (8 / n_sub) * 40% from each

_HOLD_OUT_STREAM = 7  # any constant: the in-task validation draw is not assign_samples' (seed, subclass) draw
_DRAWS = 1000  # rejection-sampling attempts per task before the feasible greedy choice


@dataclass(frozen=True)
class Hierarchy:
    """Superclass id -> its subclass ids, plus the standalone subclasses (no superclass). Ids are distinct."""

    superclasses: Mapping[int, tuple[int, ...]]
    standalone: tuple[int, ...] = ()

    @classmethod
    def of(cls, superclasses: Mapping[int, Iterable[int]], standalone: Iterable[int] = ()) -> "Hierarchy":
        tree = {int(s): tuple(int(c) for c in subs) for s, subs in superclasses.items()}
        alone = tuple(int(c) for c in standalone)
        ids = list(tree) + [c for subs in tree.values() for c in subs] + list(alone)
        if len(ids) != len(set(ids)):
            dup = sorted({c for c in ids if ids.count(c) > 1})
            raise ValueError(f"class ids must be distinct across superclasses and subclasses; repeated: {dup[:5]}")
        return cls(tree, alone)

    @property
    def parent(self) -> dict[int, int]:
        """Subclass id -> its superclass id (standalone subclasses are absent)."""
        return {c: s for s, subs in self.superclasses.items() for c in subs}

    @property
    def subclasses(self) -> tuple[int, ...]:
        """Every leaf class (the single label of a raw sample): subclasses under superclasses, then standalone."""
        return tuple(c for subs in self.superclasses.values() for c in subs) + self.standalone

    @property
    def classes(self) -> tuple[int, ...]:
        """Every label: superclasses, then subclasses."""
        return tuple(self.superclasses) + self.subclasses

    def full_labels(self, subclass: int) -> frozenset[int]:
        """A sample's complete labels: its subclass and, if any, its superclass."""
        parent = self.parent.get(int(subclass))
        return frozenset({int(subclass)} if parent is None else {int(subclass), parent})


# ---------------------------------------------------------------- task sequence

def _sizes(n_rest: int, per_task: int) -> list[int]:
    """Sizes of the later tasks: full tasks of `per_task`, then the remainder as a shorter last task."""
    full, rest = divmod(n_rest, per_task)
    return [per_task] * full + ([rest] if rest else [])


def _greedy(supers: list[int], others: set[int], locked: Mapping[int, int], sizes: Sequence[int]) -> bool:
    """Can `sizes` tasks take the remaining classes? `supers`: remaining superclasses; `others`: remaining
    classes already allowed; `locked`: remaining subclass -> its remaining superclass. Placing superclasses
    as early as possible, those with the most locked subclasses first, completes whenever anything does
    (exchanging a superclass with an earlier non-superclass keeps a sequence valid)."""
    n_locked: dict[int, int] = {s: 0 for s in supers}
    for s in locked.values():
        n_locked[s] += 1
    queue = sorted(supers, key=lambda s: -n_locked[s])
    free = len(others)
    for size in sizes:
        take = min(size, len(queue))
        placed, queue = queue[:take], queue[take:]
        if size - take > free:
            return False
        free -= size - take
        free += sum(n_locked[s] for s in placed)  # allowed from the next task on
    return not queue and free == 0


def iirc_tasks(hierarchy: Hierarchy, first_task_superclasses: int, classes_per_task: int, seed: int,
               ordering: int) -> list[TaskSpec]:
    """An IIRC task configuration: seeded by (seed, ordering), the same inputs always give the same tasks.

    Task 0 holds `first_task_superclasses` superclasses; every later task `classes_per_task` classes (the last
    one the remainder if they do not divide), drawn uniformly among the sets that keep the rest completable,
    from the remaining superclasses, the standalone subclasses and the subclasses of superclasses of EARLIER
    tasks. Each class appears exactly once. Returns TaskSpec(index, new_classes, seen_classes) per task, so
    a family's `tasks` can return it as it is. Raises ValueError when no such sequence exists.
    """
    n_super = len(hierarchy.superclasses)
    if not 0 < first_task_superclasses <= n_super:
        raise ValueError(f"the first task needs 1..{n_super} superclasses, not {first_task_superclasses}")
    if classes_per_task < 1:
        raise ValueError(f"classes_per_task must be positive, not {classes_per_task}")
    rng = np.random.default_rng(ordering_seed(seed, ordering))
    parent = hierarchy.parent
    sizes = _sizes(len(hierarchy.classes) - first_task_superclasses, classes_per_task)

    supers = sorted(hierarchy.superclasses)
    others = set(hierarchy.standalone)  # remaining classes a task may take now
    locked = dict(parent)  # remaining subclasses whose superclass is not out yet

    def pick(candidates: list[int], size: int, rest: Sequence[int]) -> list[int]:
        for _ in range(_DRAWS):
            chosen = [int(c) for c in rng.choice(np.asarray(sorted(candidates)), size=size, replace=False)]
            if feasible(chosen, rest):
                return chosen
        # Feasible sets are rare: the greedy choice (superclasses with the most locked subclasses first).
        by_subs = sorted((c for c in candidates if c in remaining_supers),
                         key=lambda s: (-sum(1 for p in locked.values() if p == s), s))
        chosen = by_subs[:size]
        fill = sorted(c for c in candidates if c not in remaining_supers)
        chosen += [int(c) for c in rng.choice(np.asarray(fill, dtype=np.int64), size=size - len(chosen),
                                              replace=False)]
        if not feasible(chosen, rest):
            raise ValueError("no IIRC task sequence exists for this hierarchy and these task sizes")
        return chosen

    def feasible(chosen: Sequence[int], rest: Sequence[int]) -> bool:
        out = set(chosen)
        sup = [s for s in remaining_supers if s not in out]
        oth = {c for c in others if c not in out} | {c for c, s in locked.items() if s in out}
        lck = {c: s for c, s in locked.items() if s not in out}
        return _greedy(sup, oth, lck, rest)

    remaining_supers = set(supers)
    first = pick(supers, first_task_superclasses, sizes)
    tasks = [first]
    for i, size in enumerate(sizes):
        # Classes of the task before become "out": superclasses unlock their subclasses from now on.
        out = set(tasks[-1])
        remaining_supers -= out
        others -= out
        for c in [c for c, s in locked.items() if s in out]:
            others.add(c)
            del locked[c]
        candidates = sorted(others | remaining_supers)
        tasks.append(pick(candidates, size, sizes[i + 1:]))

    specs, seen = [], []
    for index, new in enumerate(tasks):
        seen += new
        specs.append(TaskSpec(index, tuple(new), tuple(seen)))
    return specs


# ---------------------------------------------------------------- training samples

def _count(fraction: float, n: int) -> int:
    return int(math.floor(fraction * n + 1e-9))


def assign_samples(train_labels_by_subclass: np.ndarray | Sequence[int], hierarchy: Hierarchy, seed: int, *,
                   sub_keep: float = SUB_KEEP, super_share: float = SUPER_SHARE,
                   super_cap_subclasses: int = SUPER_CAP_SUBCLASSES) -> dict[int, np.ndarray]:
    """Training images of each class (indices into the training arrays, ascending), paper section 4.1.

    `train_labels_by_subclass[i]` is the subclass (leaf) label of training image i. For each subclass with a
    superclass, its images are shuffled (seeded by (seed, subclass), the same in every ordering): the
    subclass keeps the first floor(80% n), the superclass receives the last floor(40% n), or floor((8/n_sub)
    40% n) when it has n_sub > 8 subclasses. A standalone subclass keeps all its images. So with 400 images:
    subclass 320, a superclass of 8 (or 5) such subclasses 1280 (800), standalone 400, and 80 images of each
    subclass are in both. (Alg. 3's pseudo-code gives the subclass everything; the paper's counts say 80%.)
    """
    labels = np.asarray(train_labels_by_subclass)
    out: dict[int, np.ndarray] = {}
    for sup, subs in hierarchy.superclasses.items():
        share = super_share * min(1.0, super_cap_subclasses / len(subs)) if subs else 0.0
        borrowed = []
        for sub in subs:
            of_sub = np.flatnonzero(labels == sub)
            shuffled = np.random.default_rng([int(seed), int(sub)]).permutation(of_sub)
            n = len(shuffled)
            out[sub] = np.sort(shuffled[: _count(sub_keep, n)])
            borrowed.append(shuffled[n - _count(share, n):])
        out[sup] = np.sort(np.concatenate(borrowed)) if borrowed else np.zeros(0, dtype=np.int64)
    for sub in hierarchy.standalone:
        out[sub] = np.flatnonzero(labels == sub)
    return out


def hold_out(train_labels_by_subclass: np.ndarray | Sequence[int], subclasses: Iterable[int], share: float,
             seed: int) -> np.ndarray:
    """The in-task validation images (paper section 4.1: a fixed share of the training data, 10% on CIFAR, 4% on
    ImageNet, the same in every run), as a bool mask over the training arrays.

    Each subclass's images are shuffled, seeded by (seed, subclass) on a stream of their own (assign_samples
    draws from (seed, subclass)), and the first floor(share n) are held out: at least one of a subclass with two
    or more images (a few-image class would hold out none), never all of them. share 0 holds out nothing. The
    caller assigns the held-out images to classes as it assigns the training images (`assign_samples` on each
    part), so the in-task validation set has superclass samples too: the paper's Table 1 counts 5,770 with
    duplicates out of 5,000 images."""
    labels = np.asarray(train_labels_by_subclass)
    held = np.zeros(len(labels), dtype=bool)
    if share <= 0:
        return held
    for sub in subclasses:
        of_sub = np.flatnonzero(labels == int(sub))
        n = len(of_sub)
        count = min(max(1, _count(share, n)), n - 1) if n >= 2 else 0
        shuffled = np.random.default_rng([int(seed), int(sub), _HOLD_OUT_STREAM]).permutation(of_sub)
        held[shuffled[:count]] = True
    return held


def task_training_indices(per_class: Mapping[int, np.ndarray], task: TaskSpec | Sequence[int]) -> np.ndarray:
    """A task's training images (Alg. 3 IncrementTask): the union of its classes' assigned images, ascending."""
    classes = task.new_classes if isinstance(task, TaskSpec) else task
    parts = [np.asarray(per_class[int(c)], dtype=np.int64) for c in classes]
    return np.unique(np.concatenate(parts)) if parts else np.zeros(0, dtype=np.int64)


# ---------------------------------------------------------------- labels

def training_labels(sample_classes: Iterable[int], task_classes: Iterable[int]) -> frozenset[int]:
    """Incomplete information (training, in-task validation): only the labels of the current task."""
    return frozenset(int(c) for c in sample_classes) & frozenset(int(c) for c in task_classes)


def evaluation_labels(sample_full_labels: Iterable[int], observed_classes: Iterable[int]) -> frozenset[int]:
    """Complete information (post-task validation, test): all labels among the classes observed so far."""
    return frozenset(int(c) for c in sample_full_labels) & frozenset(int(c) for c in observed_classes)


def multi_hot(label_sets: Sequence[Iterable[int]], label_index: Sequence[int]) -> np.ndarray:
    """Bool array (n_samples x n_labels): column j is class label_index[j]. Labels outside it raise KeyError."""
    column = {int(c): j for j, c in enumerate(label_index)}
    out = np.zeros((len(label_sets), len(column)), dtype=bool)
    for i, labels in enumerate(label_sets):
        for c in labels:
            out[i, column[int(c)]] = True
    return out


def _targets(subclass_labels: np.ndarray | Sequence[int], hierarchy: Hierarchy, allowed: Iterable[int],
             label_index: Sequence[int]) -> np.ndarray:
    allowed_set = frozenset(int(c) for c in allowed)
    return multi_hot([hierarchy.full_labels(int(c)) & allowed_set for c in np.asarray(subclass_labels)],
                     label_index)


def training_targets(subclass_labels: np.ndarray | Sequence[int], hierarchy: Hierarchy,
                     task_classes: Iterable[int], label_index: Sequence[int]) -> np.ndarray:
    """Multi-hot training targets of samples given by their subclass labels (`training_labels` of each)."""
    return _targets(subclass_labels, hierarchy, task_classes, label_index)


def evaluation_targets(subclass_labels: np.ndarray | Sequence[int], hierarchy: Hierarchy,
                       observed_classes: Iterable[int], label_index: Sequence[int]) -> np.ndarray:
    """Multi-hot evaluation targets (`evaluation_labels` of each); a sample of no observed class has none."""
    return _targets(subclass_labels, hierarchy, observed_classes, label_index)


def label_kinds(hierarchy: Hierarchy, label_index: Sequence[int]) -> dict[str, np.ndarray]:
    """Bool masks over the label columns (column j is class label_index[j]) for the paper's diagnostics (App.
    D.2-D.3): "superclass", "with_super" (subclasses under a superclass) and "standalone" (subclasses with none)."""
    parent, alone = hierarchy.parent, set(hierarchy.standalone)
    ids = [int(c) for c in label_index]
    return {"superclass": np.asarray([c in hierarchy.superclasses for c in ids], dtype=bool),
            "with_super": np.asarray([c in parent for c in ids], dtype=bool),
            "standalone": np.asarray([c in alone for c in ids], dtype=bool)}


def task_members(subclass_labels: np.ndarray | Sequence[int], hierarchy: Hierarchy,
                 tasks: Sequence[TaskSpec]) -> list[np.ndarray]:
    """Evaluation samples of each task (Alg. 4 LoadTask), as bool masks: a sample belongs to task j when its
    subclass or its superclass is one of task j's new classes (a superclass takes ALL images of its
    subclasses here). A sample may belong to two tasks; the samples of tasks 0..k (the mask union) are the
    evaluation set after task k."""
    labels = np.asarray(subclass_labels)
    parent = hierarchy.parent
    sup = np.asarray([parent.get(int(c), -1) for c in labels], dtype=np.int64) if len(labels) else labels
    out = []
    for task in tasks:
        new = np.asarray(task.new_classes, dtype=np.int64)
        out.append(np.isin(labels, new) | np.isin(sup, new))
    return out
