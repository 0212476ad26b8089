"""The continual few-shot task sampler (CFSL; papers/cfsl-task-definitions.txt Algorithm 1, notes 002.1).

A task is NSS support sets S_1..S_NSS and one target set T, controlled by

    NSS  support_sets            support sets per task (must be a multiple of CCI)
    NC   ways                    classes per support set
    K_S  shots                   samples per class in each support set
    K_T  target_shots            samples per class in each support set's share of the target set
    CCI  class_change_interval   consecutive support sets drawn from the same classes (a class block)
    O    overwrite               true: every block reuses labels 0..NC-1; false: block a gets a*NC..(a+1)*NC-1

Algorithm 1 with its index corrected (the paper writes n = a*CCI + b, off by one; n = (a-1)*CCI + b here,
0-based below):

    for a in 0..NSS/CCI-1:
        C_a <- NC classes drawn without replacement from those no earlier block of the task used
        for b in 0..CCI-1:
            n <- a*CCI + b
            for c in C_a: K_S + K_T samples of c, unused so far in the task
            S_n <- K_S per class, T_n <- K_T per class, labelled by O (above)
    T <- union of the T_n

This implements the SPEC, not the reference code (AntreasAntoniou/FewShotContinualLearningDataProvider), which
(1) draws K_S + K_T images once per class block and reuses them for all CCI support sets of the block, breaking
rule 3 (samples unique within a task), and (2) with O = false offsets labels by support set (n*NC) instead of by
class block, so with CCI > 1 one class gets a new label in each support set. Here every support set draws
fresh samples and a class keeps one label in its whole block. Within a block, labels follow the order the
classes were drawn in (a random order), as the reference code shuffles them.

With O = true the merged target set gives the same label to different classes of different blocks: that is
the overwrite semantics (a label means "the k-th class of the latest block that had it"); learners must let
a later block's class take the label over.

Samples are indices into a pool (`pool_labels`: the class id of each image the phase may draw from; the
engine pools a phase's training and test images, since a CFSL task has no train/test split of its own).
Seeds: task t of ordering s is drawn from the RNG of (study seed, s, t): the same config and seed give the
same tasks, and GTEP's ordering s is a set of `tasks_per_ordering` tasks. Pure: numpy only.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from gtep.protocol.families.base import FamilyOptions
from gtep.protocol.scenarios import ordering_seed


@dataclass(frozen=True)
class CfslOptions(FamilyOptions):
    """scenario.cfsl: continual few-shot tasks (the CFSL spec's Algorithm 1); an ordering of a phase is
    tasks_per_ordering tasks drawn with (study seed, ordering). One task type and how many tasks an ordering has
    (the config validates the section against these fields' metadata, and `problem`)."""

    support_sets: int = field(metadata={"ge": 1, "description": "NSS: support sets per task"})
    ways: int = field(metadata={"ge": 1, "description": "NC: classes per support set"})
    shots: int = field(metadata={"ge": 1, "description": "K_S: samples per class in a support set"})
    target_shots: int = field(metadata={"ge": 1, "description": "K_T: target samples per class per support set"})
    class_change_interval: int = field(default=1, metadata={"ge": 1, "description": "CCI: support sets per class "
                                                                                    "block"})
    overwrite: bool = field(default=False, metadata={"description": "O: every class block reuses labels 0..NC-1"})
    tasks_per_ordering: int = field(default=10, metadata={"ge": 1, "description": "tasks that make one GTEP "
                                                                                  "ordering"})

    def problem(self) -> str | None:
        """What is wrong with the task type (None: nothing)."""
        for name in ("support_sets", "ways", "shots", "target_shots", "class_change_interval", "tasks_per_ordering"):
            if getattr(self, name) < 1:
                return f"{name} must be at least 1, got {getattr(self, name)}"
        if self.support_sets % self.class_change_interval:
            return (f"support_sets ({self.support_sets}) must be a multiple of class_change_interval "
                    f"({self.class_change_interval}): a class block spans CCI support sets")
        return None

    @property
    def blocks(self) -> int:
        """Class blocks per task: NSS / CCI, each with NC new classes."""
        return self.support_sets // self.class_change_interval

    @property
    def classes_per_task(self) -> int:
        return self.ways * self.blocks

    @property
    def samples_per_class(self) -> int:
        """Distinct samples a task takes from each of its classes: CCI support sets' K_S + K_T each."""
        return self.class_change_interval * (self.shots + self.target_shots)

    @property
    def num_labels(self) -> int:
        """The task's label space: NC with overwrite, NC * NSS / CCI without."""
        return self.ways if self.overwrite else self.classes_per_task

    def describe(self) -> str:
        return (f"cfsl NSS={self.support_sets} NC={self.ways} K_S={self.shots} K_T={self.target_shots} "
                f"CCI={self.class_change_interval} O={'true' if self.overwrite else 'false'}")


@dataclass(frozen=True)
class SupportSet:
    """S_n: NC classes x K_S samples (pool indices), with their task labels and classes."""

    index: int  # n, from 0
    block: int  # a, from 0
    samples: tuple[int, ...]
    labels: tuple[int, ...]
    classes: tuple[int, ...]  # the dataset class id of each sample


@dataclass(frozen=True)
class CfslTask:
    index: int
    blocks: tuple[tuple[int, ...], ...]  # C_a: the classes of each block, in label order
    support: tuple[SupportSet, ...]
    target_samples: tuple[int, ...]
    target_labels: tuple[int, ...]
    target_classes: tuple[int, ...]
    num_labels: int

    @property
    def classes(self) -> tuple[int, ...]:
        return tuple(c for block in self.blocks for c in block)


def block_labels(options: CfslOptions, block: int) -> list[int]:
    """The labels of block a's classes, in draw order: 0..NC-1 with overwrite, a*NC..(a+1)*NC-1 without."""
    offset = 0 if options.overwrite else block * options.ways
    return list(range(offset, offset + options.ways))


def task_rng(seed: int, ordering: int, task: int) -> np.random.Generator:
    return np.random.default_rng([ordering_seed(seed, ordering), int(task)])


def sample_task(pool_labels: np.ndarray, classes: Sequence[int], options: CfslOptions, seed: int, ordering: int,
                task: int) -> CfslTask:
    """Task `task` of ordering `ordering` (module docstring) over the phase's `classes`."""
    problem = options.problem()
    if problem:
        raise ValueError(problem)
    if options.classes_per_task > len(classes):
        raise ValueError(f"a task needs {options.classes_per_task} classes (NC={options.ways} x NSS/CCI="
                         f"{options.blocks}) but the phase has {len(classes)}; lower ways or support_sets, or raise "
                         "class_change_interval")
    rng = task_rng(seed, ordering, task)
    drawn = rng.choice(np.asarray(sorted(int(c) for c in classes)), size=options.classes_per_task, replace=False)
    blocks = [tuple(int(c) for c in drawn[a * options.ways:(a + 1) * options.ways]) for a in range(options.blocks)]
    per_class = options.samples_per_class
    samples: dict[int, np.ndarray] = {}
    for c in drawn:  # every sample the task takes of class c, drawn at once: none can repeat within the task
        of_class = np.flatnonzero(pool_labels == c)
        if len(of_class) < per_class:
            raise ValueError(f"class {int(c)} has {len(of_class)} samples but a task takes {per_class} of each class "
                             f"(CCI={options.class_change_interval} x (K_S={options.shots} + K_T="
                             f"{options.target_shots})); lower shots, target_shots or class_change_interval")
        samples[int(c)] = rng.permutation(of_class)[:per_class]
    support, target = [], []
    k_s, k_t = options.shots, options.target_shots
    for a, block in enumerate(blocks):
        labels = block_labels(options, a)
        for b in range(options.class_change_interval):
            n = a * options.class_change_interval + b
            take = slice(b * (k_s + k_t), (b + 1) * (k_s + k_t))
            s_idx, s_lab, s_cls = [], [], []
            for c, label in zip(block, labels):
                mine = samples[c][take]
                s_idx += [int(i) for i in mine[:k_s]]
                s_lab += [label] * k_s
                s_cls += [c] * k_s
                target += [(int(i), label, c) for i in mine[k_s:]]
            support.append(SupportSet(n, a, tuple(s_idx), tuple(s_lab), tuple(s_cls)))
    return CfslTask(task, tuple(blocks), tuple(support), tuple(t[0] for t in target), tuple(t[1] for t in target),
                    tuple(t[2] for t in target), options.num_labels)


def ordering_tasks(pool_labels: np.ndarray, classes: Sequence[int], options: CfslOptions, seed: int,
                   ordering: int) -> list[CfslTask]:
    """GTEP's ordering s: tasks_per_ordering tasks, task t drawn with (seed, s, t)."""
    return [sample_task(pool_labels, classes, options, seed, ordering, t) for t in range(options.tasks_per_ordering)]
