"""Few-shot class-incremental learning (Tang et al., papers/fscil-gacc.txt): a base session with every image of its
classes, then N-way K-shot sessions; the paper's aAcc, lAcc, tAcc, gAcc AUC, PD, RPD, KR (metrics.py) and H* by
gAcc AUC. The shots of a class are drawn for (seed, ordering, class), or given by a benchmark's index file."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from gtep.protocol import metrics as matrix_metrics  # not `metrics`: the package's own submodule is that name
from gtep.protocol.criteria import Criterion, register_criterion
from gtep.protocol.families.base import (
    ACC,
    ACC_T,
    AVG_ACC,
    FamilyOptions,
    Metric,
    PhaseData,
    PhaseLayout,
    Problem,
    TaskFamily,
    curve,
    register_family,
)
from gtep.protocol.families.fscil import metrics as fscil_metrics
from gtep.protocol.scenarios import (  # noqa: F401  (few_shot_indices, shots_at_phase_positions: re-exported)
    TaskSpec,
    class_ordering,
    few_shot_indices,
    shots_at_phase_positions,
    split_tasks,
)


@dataclass(frozen=True)
class FewShotOptions(FamilyOptions):
    """scenario.fscil: a base session of `base_classes` with all their images, then `sessions` sessions of
    `ways` classes with `shots` training images each (drawn per ordering, or given by `shot_index`)."""

    base_classes: int = field(metadata={"ge": 1, "description": "classes of the base session, with all their training "
                                                          "images"})
    ways: int = field(metadata={"ge": 1, "description": "N: classes per few-shot session"})
    shots: int = field(metadata={"ge": 1, "description": "K: training images per class in a few-shot session"})
    sessions: int = field(metadata={"ge": 1, "description": "few-shot sessions after the base session"})
    # The benchmarks' fixed split: classes in index order (the first base_classes form the base session), the
    # same in every ordering; only the shots are drawn per ordering. Off: classes shuffled per ordering.
    fixed_order: bool = False
    # JSON {"<class id>": [indices into the dataset's training arrays]}: a benchmark's own shots (the config checks
    # and reads the file: gtep/data/option_files.py)
    shot_index: str | None = field(default=None, metadata={"file": "shot_index"})
    draw_missing_shots: bool = False  # classes the index file omits draw their shots (else refused)
    # the index file's content, read by the config ({"<class id>": [positions in the dataset's training arrays]}),
    # so workers and checks need no file
    shots_given: Mapping[str, Sequence[int]] | None = field(default=None, metadata={"filled_from": "shot_index"})

    @property
    def given(self) -> dict[int, list[int]] | None:
        """The benchmark's own shots: class id -> positions in the dataset's training arrays."""
        if self.shots_given is None:
            return None
        return {int(c): [int(i) for i in v] for c, v in self.shots_given.items()}

    @property
    def increments(self) -> list[int]:
        return [self.base_classes] + [self.ways] * self.sessions


BELOW_CHANCE = "the first session's accuracy is below chance (1 / its classes)"

# the criteria of this family's metrics (search.criterion)
register_criterion(Criterion("gacc_auc", ("gacc_auc",),
                             "area under gAcc(alpha) (FSCIL paper Eq. 5-6, the paper's trapezoid)"))
register_criterion(Criterion("aacc", ("aacc",),
                             "aAcc: FSCIL's class-weighted accuracy averaged over sessions (paper Eq. 1-3)"))


@register_family
class FewShotClassIncremental(TaskFamily):
    name = "fscil"
    section = "fscil"
    description = "few-shot class-incremental: a base session, then N-way K-shot sessions (scenario.fscil)"
    Options = FewShotOptions
    metrics = (Metric("gacc_auc", "gAcc AUC"), Metric("aacc", "aAcc"), Metric("lacc", "lAcc"), Metric("tacc", "tAcc"),
               Metric("hacc", "hAcc"), Metric("novel_acc", "novel"), ACC, AVG_ACC, Metric("hmean", "HM"),
               Metric("aacc_sample", "aAcc (samples)"), Metric("gacc_auc_exact", "gAcc AUC (exact)"),
               # RPD and KR divide by what a session scored when learned: no meaning after a first session below
               # chance, so NaN there, and never H*'s criterion (a NaN criterion would leave a set unselectable)
               Metric("pd", "PD"), Metric("rpd", "RPD", "ratio", selectable=False, undefined=BELOW_CHANCE),
               Metric("kr", "KR", "ratio", selectable=False, undefined=BELOW_CHANCE),
               Metric("forgetting", "forgetting"),
               ACC_T, curve("aacc_t", "aAcc after session t"), curve("gacc_alpha", "gAcc(alpha), alpha = k/12", 0))
    default_criterion = "gacc_auc"
    headline = ("gacc_auc", "aacc", "novel_acc")
    table_metrics = ("aacc", "gacc_auc", "novel_acc")
    table_note = ("FSCIL: aAcc (average accuracy over sessions), gAcc AUC (area under gAcc(alpha), alpha in [0, 1]) "
                  "and novel (the novel classes' accuracy after the last session) in %, mean (std) over orderings; "
                  "criterion: the value of the criterion H* was selected by, %")

    def increments(self, options: Mapping[str, Any]) -> list[int]:
        return FewShotOptions.of(options).increments

    def tasks(self, classes: Sequence[int], options: Mapping[str, Any], seed: int, ordering: int) -> list[TaskSpec]:
        spec = FewShotOptions.of(options)
        ordered = sorted(classes) if spec.fixed_order else class_ordering(classes, seed, ordering)
        return [TaskSpec(t.index, t.new_classes, t.seen_classes, None if t.index == 0 else spec.shots)
                for t in split_tasks(ordered, spec.increments)]

    def check(self, phases: Sequence[PhaseData], options: Mapping[str, Any]) -> list[Problem]:
        return [*super().check(phases, options),
                *(problem for phase in phases for problem in self.shot_problems(phase, options))]

    def example_options(self) -> dict[str, Any]:
        return {"base_classes": 4, "ways": 2, "shots": 2, "sessions": 2}

    def classes_problem(self, phase: PhaseLayout, increments: Sequence[int]) -> Problem:
        return Problem("scenario.fscil", f"its sessions take {sum(increments)} classes "
                       f"({'+'.join(map(str, increments))}) but the {phase.phase} phase has {len(phase.classes)} "
                       f"({phase.dataset}); change base_classes, ways or sessions, or restrict the classes in "
                       f"{phase.dataset_field.rsplit('.', 1)[0]}", phase.phase)

    def given_shots(self, options: Mapping[str, Any]) -> dict[int, list[int]] | None:
        return FewShotOptions.of(options).given

    def summary(self, options: Mapping[str, Any]) -> str:
        f = FewShotOptions.of(options)
        return f"fscil {f.base_classes}+{f.sessions}x{f.ways}-way {f.shots}-shot"

    def shot_problems(self, phase: PhaseData, options: Mapping[str, Any]) -> list[Problem]:
        """Every class that can come in a few-shot session has K training images (a class with fewer would
        make an N-way "K-shot" session silently hold fewer shots), and a shot index file fits the data."""
        spec = FewShotOptions.of(options)
        problems = []
        # with fixed_order the base classes are the first ones; otherwise any class can land in a session
        few_shot = sorted(phase.classes)[spec.base_classes:] if spec.fixed_order else list(phase.classes)
        short = [(c, phase.train_counts.get(c, 0)) for c in few_shot if phase.train_counts.get(c, 0) < spec.shots]
        if short:
            listed = ", ".join(f"class {c} has {n}" for c, n in short[:5])
            problems.append(Problem("scenario.fscil.shots", f"{spec.shots} shots per class, but in the {phase.phase} "
                                    f"phase {listed} training images ({len(short)} classes short); lower shots "
                                    "or leave those classes out", phase.phase))
        given = spec.given
        if given is not None and phase.train_labels is not None:
            problem = check_shot_index(given, phase.train_labels, few_shot, spec.shots, spec.draw_missing_shots)
            if problem:
                problems.append(Problem("scenario.fscil.shot_index", f"{problem} ({phase.phase} phase, "
                                        f"{phase.dataset}; indices are positions in the dataset's training arrays)",
                                        phase.phase))
        return problems

    def summarize(self, matrix: np.ndarray, test_counts: Sequence[int],
                  tasks: Sequence[TaskSpec]) -> dict[str, float | list[float]]:
        base, ways = len(tasks[0].new_classes), len(tasks[1].new_classes) if len(tasks) > 1 else 1
        out = matrix_metrics.summarize(matrix, test_counts)
        out.update(fscil_metrics.summarize_fscil(np.asarray(matrix, dtype=float), list(test_counts), base, ways))
        return out


def check_shot_index(given: Mapping[int, Sequence[int]], train_labels: np.ndarray, classes: Sequence[int],
                     shots: int, draw_missing: bool = False) -> str | None:
    """What is wrong with an index file for the classes that can be in a few-shot session (None: nothing): every
    listed image must be a training image of its class (indices into the dataset's training arrays), listed once;
    each of those classes needs `shots` of them, and a class the file omits is an error unless `draw_missing`."""
    for c, indices in given.items():
        bad = [i for i in indices if not 0 <= i < len(train_labels) or train_labels[i] != c]
        if bad:
            return f"class {c}: training images {bad[:5]} are not of that class (or outside the training arrays)"
        if len(set(indices)) != len(indices):
            return f"class {c}: lists an image twice; list {shots} distinct training images"
    short = [c for c in classes if c in given and len(given[c]) < shots]
    if short:
        return f"classes {short[:5]} list fewer than {shots} images"
    # the engine would train on the first `shots` of them and silently drop the rest (few_shot_indices)
    extra = [(c, len(given[c])) for c in classes if c in given and len(given[c]) > shots]
    if extra:
        c, n = extra[0]
        return (f"class {c} lists {n} images but shots is {shots}, so only its first {shots} would be used "
                f"({len(extra)} classes list more); list exactly {shots} per class, or set shots to {n}")
    missing = [c for c in classes if c not in given]
    if missing and not draw_missing:
        return (f"classes {missing[:5]} ({len(missing)} in all) are not in the file; list them, or set "
                "scenario.fscil.draw_missing_shots: true to draw their shots")
    return None
