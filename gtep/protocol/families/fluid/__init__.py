"""The FLUID scenario family (Flexible Sequential Learning, papers/fluid.txt; notes 004.1-004.5).

A phase is not a task sequence but a stream: each sequence (the family's "ordering") mixes `n_pretrain_classes`
of the backbone's pretrain classes (`pretrain_classes`: kept out of both phases' classes; the stream shows
images the backbone did not train on: their TEST images, and the share `pretrain_holdout` of their training
images that pretraining leaves out, `held_out`) with `n_novel_classes` of the phase's own classes (train and
test images alike), with Zipf-distributed images per class (generator.py). The paper's stream draws
pretrain-class images from ImageNet-22K, as many as a novel class's; test images alone (25 or 50 a class on
small datasets) keep a pretrain class out of the head, so its buckets would not be the paper's. Every sample
is predicted (a class seen so far, or "unseen") before its label is revealed; the learner decides when and
how to update. The two phases' novel classes are disjoint, as GTEP's phases always are; the pretrain classes
are shared by both streams, as the paper's validation sequences share theirs. A sequence's seed mixes the
study seed, the ordering and the phase's classes, so the two phases draw different sequences.

Metrics (gtep/protocol/families/fluid/metrics.py) are over the stream's own predictions (prequential); H* by mean
per-class accuracy unless search.criterion says otherwise; compute (GMACs, inference and updates) is logged
beside every score. Aliases for the parts of gtep that read the class-incremental names (tables' Acc and
AvgAcc, MLflow's per-task `acc_t` steps):

    acc      = overall_acc          avg_acc = mean_per_class_acc          acc_t = rolling_acc

Data flow "stream" (gtep/engine/flows/stream.py runs it). Pure: stdlib and numpy only.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Mapping, Sequence

import numpy as np

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
    ScenarioFamily,
    StudyLayout,
    add_aliases,
    curve,
    register_family,
)
from gtep.protocol.families.fluid.generator import StreamSpec, fluid_stream
from gtep.protocol.holdout import held_out, held_out_count  # noqa: F401  (held_out: re-exported)

FLUID = "fluid"
STREAM = "stream"
ALIASES = {"acc": "overall_acc", "avg_acc": "mean_per_class_acc", "acc_t": "rolling_acc"}

# accuracies are fractions (percent in MLflow); AUROC and F1 ratios; GMACs and the head cut counts
METRICS = (Metric("mean_per_class_acc", "mean per-class"), Metric("overall_acc", "overall"),
           Metric("pretrain_head_acc", "pretrain-head"), Metric("pretrain_tail_acc", "pretrain-tail"),
           Metric("novel_head_acc", "novel-head"), Metric("novel_tail_acc", "novel-tail"),
           Metric("unseen_auroc", "unseen AUROC", "ratio"), Metric("unseen_f1", "unseen F1", "ratio"),
           Metric("gmacs_inference", "GMACs inference", "count", selectable=False),
           Metric("gmacs_update", "GMACs update", "count", selectable=False),
           Metric("gmacs_total", "GMACs", "count", selectable=False),
           Metric("head_cut", "head cut", "count", selectable=False), ACC, AVG_ACC,
           curve("rolling_acc", "rolling accuracy (window w)"), ACC_T)


@dataclass(frozen=True)
class FluidOptions(FamilyOptions):
    """scenario.fluid: FLUID's open-world stream (papers/fluid.txt; the config validates the section against these
    fields' metadata)."""

    pretrain_classes: tuple[int, ...] = field(metadata={
        "min_length": 1, "description": "the backbone's pretraining classes, kept out of both phases; the streams "
        "show their test images"})
    n_pretrain_classes: int = field(metadata={"ge": 0, "description": "pretrain classes per sequence"})
    n_novel_classes: int = field(metadata={"ge": 1, "description": "novel classes per sequence (from the phase's "
                                                                   "classes)"})
    total_samples: int = field(metadata={"ge": 1, "description": "samples per sequence (fewer if the caps allow "
                                                                 "fewer)"})
    per_class_cap: int = field(metadata={"ge": 1, "description": "at most this many samples of one class"})
    zipf_s: float = field(default=1.0, metadata={"ge": 0, "description": "Zipf exponent of images per class (the "
                                                                         "paper's 1)"})
    # head: more than head_cut samples in the sequence (the paper's text)
    head_cut: int = field(default=50, metadata={"ge": 0, "description": "head classes have more samples than this "
                                                                        "(the paper's 50)"})
    window: int = field(default=100, metadata={"ge": 1, "description": "steps per window of the rolling accuracy"})
    # notes 004.2: the paper's ~1
    backward_factor: float = field(default=1.0, metadata={"ge": 0, "description": "a backward pass costs this many "
                                                                                  "forward passes"})
    # one of UNSEEN_POSITIVES (FluidStream.option_problems)
    unseen_positives: str = field(default="novel", metadata={
        "description": "the unseen detector's positives: first sightings of novel classes (the paper's App. H) or "
        "of every class, pretrain classes included"})
    pretrain_holdout: float = field(default=0.0, metadata={
        "ge": 0, "lt": 1, "description": "share of each pretrain class's training images that pretraining leaves "
        "out and the streams may show beside its test images"})

    @classmethod
    def of(cls, options: Mapping[str, Any]) -> "FluidOptions":
        pretrain_classes = tuple(int(c) for c in options.get("pretrain_classes", ()))  # YAML gives a list
        return super().of({**options, "pretrain_classes": pretrain_classes})


UNSEEN_POSITIVES = ("novel", "all")


def class_pools(y_train: np.ndarray, y_test: np.ndarray, classes: Sequence[int],
                with_train: bool, holdout: float = 0.0) -> dict[int, np.ndarray]:
    """Class -> the ids of the images the stream may show: test image i has id len(y_train) + i, training image
    i has id i. `with_train`: every training image (novel classes); else only those pretraining held out (the
    share `holdout`: pretrain classes, whose other training images trained the backbone)."""
    kept = held_out(y_train, [] if with_train else classes, holdout)
    pools = {}
    for c in classes:
        test = np.flatnonzero(y_test == c) + len(y_train)
        train = np.flatnonzero(y_train == c) if with_train else kept[y_train[kept] == c]
        pools[int(c)] = np.concatenate([train, test])
    return pools


def sequence_seed(seed: int, ordering: int, classes: Sequence[int]) -> list[int]:
    """The seed of one phase's sequence `ordering`: distinct per phase (its classes) and per ordering."""
    return [int(seed), int(ordering), *sorted(int(c) for c in classes)]


def phase_stream(y_train: np.ndarray, y_test: np.ndarray, classes: Sequence[int], options: FluidOptions,
                 seed: int, ordering: int) -> StreamSpec:
    """Sequence `ordering` of a phase whose novel classes are `classes` (labels are dataset class ids)."""
    return fluid_stream(class_pools(y_train, y_test, options.pretrain_classes, False, options.pretrain_holdout),
                        class_pools(y_train, y_test, classes, with_train=True), options.n_pretrain_classes,
                        options.n_novel_classes, options.zipf_s, options.total_samples, options.per_class_cap,
                        sequence_seed(seed, ordering, classes))


def with_aliases(metrics: Mapping[str, Any]) -> dict[str, Any]:
    return add_aliases(metrics, ALIASES)


# the criteria of this family's metrics (search.criterion)
register_criterion(Criterion("mean_per_class_acc", ("mean_per_class_acc",),
               "FLUID: mean over the stream's classes of their prequential accuracy (papers/fluid.txt Table 1)"))


@register_family
class FluidStream(ScenarioFamily):
    name = FLUID
    section = FLUID
    description = ("FLUID: an open-world, Zipf-tailed stream of pretrain and novel classes, each sample predicted "
                   "before its label is revealed (scenario.fluid)")
    data_flow = STREAM
    Options = FluidOptions
    metrics = METRICS
    default_criterion = "mean_per_class_acc"
    headline: ClassVar[tuple[str, ...]] = ("mean_per_class_acc", "overall_acc", "unseen_auroc", "gmacs_total")

    def increments(self, options: Mapping[str, Any]) -> list[int]:
        """One 'task': the classes of a sequence (recorded as the study's increments)."""
        spec = FluidOptions.of(options)
        return [spec.n_pretrain_classes + spec.n_novel_classes]

    def pretrain_holdout(self, options: Mapping[str, Any]) -> tuple[float, tuple[int, ...]]:
        """scenario.fluid.pretrain_holdout of each pretrain class's training images, which the stream may show."""
        spec = FluidOptions.of(options)
        return (spec.pretrain_holdout, spec.pretrain_classes) if spec.pretrain_holdout > 0 else (0.0, ())

    def data_classes(self, options: Mapping[str, Any]) -> tuple[int, ...]:
        """Classes a phase's data must hold besides its own: the pretrain classes the streams show."""
        return FluidOptions.of(options).pretrain_classes

    def check_layout(self, phases: Sequence[PhaseLayout], study: StudyLayout,
                     options: Mapping[str, Any]) -> list[Problem]:
        """The pretrain classes exist, are kept out of both phases and (with a pretrain section) are classes the
        backbone is pretrained on, and every phase has the classes a sequence draws."""
        spec = FluidOptions.of(options)
        field = "scenario.fluid.pretrain_classes"
        if study.pretrain_classes is not None:
            foreign = sorted(set(spec.pretrain_classes) - set(study.pretrain_classes))
            if foreign:
                return [Problem(field, f"{foreign[:5]} are not among the pretrain section's classes; the stream's "
                                "pretrain classes are those the backbone was pretrained on: list them in "
                                "pretrain.classes too")]
        if spec.pretrain_holdout > 0 and study.pretrain_classes is None:
            return [Problem("scenario.fluid.pretrain_holdout", f"is {spec.pretrain_holdout:g}, but only the pretrain "
                            "section leaves those training images out of pretraining (a weights file may have "
                            "trained on them): pretrain with the pretrain section, or set it to 0")]
        if len(set(spec.pretrain_classes)) != len(spec.pretrain_classes):
            return [Problem(field, "lists a class twice; give each class id once")]
        if spec.n_pretrain_classes > len(spec.pretrain_classes):
            return [Problem("scenario.fluid.n_pretrain_classes", f"is {spec.n_pretrain_classes} but pretrain_classes "
                            f"lists {len(spec.pretrain_classes)}; lower it or list more classes")]
        for phase in phases:
            available = len(phase.class_names)
            bad = [c for c in spec.pretrain_classes if not 0 <= c < available]
            if bad:
                return [Problem(field, f"class ids {bad[:5]} are outside 0..{available - 1}; use ids of the dataset")]
            shared = sorted(set(spec.pretrain_classes) & set(phase.classes))
            if shared:
                return [Problem(field, f"{len(shared)} of them are {phase.phase} classes (e.g. {shared[:5]}); keep "
                                "the pretrain classes out of both phases (restrict datasets.split.classes to the "
                                "others)")]
            if spec.n_novel_classes > len(phase.classes):
                return [Problem("scenario.fluid.n_novel_classes", f"is {spec.n_novel_classes} but the {phase.phase} "
                                f"phase has {len(phase.classes)} classes; lower it or give the phase more classes")]
        return []

    def check(self, phases: Sequence[PhaseData], options: Mapping[str, Any]) -> list[Problem]:
        # what the streams cannot be drawn from first: an empty head is only worth saying of a stream that can be
        found = [problem for phase in phases for problem in self.stream_problems(phase, options)]
        return found + [problem for phase in phases for problem in self.head_problems(phase, options)]

    def example_options(self) -> dict[str, Any]:
        return {"pretrain_classes": [6, 7], "n_pretrain_classes": 2, "n_novel_classes": 3, "total_samples": 40,
                "per_class_cap": 10, "head_cut": 5}

    def option_problems(self, options: Mapping[str, Any]) -> list[Problem]:
        value = FluidOptions.of(options).unseen_positives
        if value not in UNSEEN_POSITIVES:
            return [Problem("scenario.fluid.unseen_positives", f"should be 'novel' or 'all', not {value!r}")]
        return []

    def summary(self, options: Mapping[str, Any]) -> str:
        stream = FluidOptions.of(options)
        return (f"fluid {stream.n_pretrain_classes} pretrain+{stream.n_novel_classes} novel classes, "
                f"{stream.total_samples} samples, zipf s={stream.zipf_s:g}")

    def stream_problems(self, phase: PhaseData, options: Mapping[str, Any]) -> list[Problem]:
        """What the streams cannot be drawn from, before any compute: every novel class (the phase's) needs an
        image, every pretrain class test images (what the stream shows of it) and, with a holdout, training images
        to hold out. A stream shorter than total_samples is no problem: the caps and the classes' images may
        allow fewer, and the generator gives every image they allow (describe says how many)."""
        spec = FluidOptions.of(options)
        problems = []
        bare = [c for c in phase.classes if phase.train_counts.get(c, 0) + phase.test_counts.get(c, 0) == 0]
        if bare:
            problems.append(Problem("datasets", f"the {phase.phase} phase's classes {bare[:5]} have no images in "
                                    f"{phase.dataset}, so a stream cannot show them; leave them out "
                                    "(datasets.*.classes) or add their images", phase.phase))
        untested = [c for c in spec.pretrain_classes if phase.test_counts.get(c, 0) == 0]
        if untested:
            problems.append(Problem("scenario.fluid.pretrain_classes", f"classes {untested[:5]} have no test images "
                                    f"in {phase.dataset}; the stream shows a pretrain class's test images (the "
                                    "backbone never trained on them): list classes that have some", phase.phase))
        if spec.pretrain_holdout > 0:
            none = [(c, phase.train_counts.get(c, 0)) for c in spec.pretrain_classes
                    if held_out_count(phase.train_counts.get(c, 0), spec.pretrain_holdout) == 0]
            if none:
                listed = ", ".join(f"class {c} has {n}" for c, n in none[:5])
                problems.append(Problem("scenario.fluid.pretrain_holdout", f"{spec.pretrain_holdout:g} of a pretrain "
                                        f"class's training images holds out none where {listed} ({phase.dataset}); "
                                        "raise pretrain_holdout, list classes with more images, or set it to 0",
                                        phase.phase))
        return problems

    def head_problems(self, phase: PhaseData, options: Mapping[str, Any]) -> list[Problem]:
        """A stream in which no class can have more than head_cut samples (per_class_cap, total_samples or the
        images a class can show stop every class at or below it) has no head: the head buckets would be empty in
        every run and the head/tail split meaningless."""
        spec = FluidOptions.of(options)
        shown = {c: phase.test_counts.get(c, 0) + held_out_count(phase.train_counts.get(c, 0), spec.pretrain_holdout)
                 for c in spec.pretrain_classes}
        shown.update({c: phase.train_counts.get(c, 0) + phase.test_counts.get(c, 0) for c in phase.classes})
        most = min(spec.per_class_cap, spec.total_samples, max(shown.values(), default=0))
        if most > spec.head_cut or most == 0:  # 0: no image at all, which stream_problems says
            return []
        return [Problem("scenario.fluid.head_cut", f"is {spec.head_cut}, but no class of the {phase.phase} phase's "
                        f"streams can have more than {most} samples (per_class_cap {spec.per_class_cap}, "
                        f"total_samples {spec.total_samples}, the images a class can show in {phase.dataset}), so no "
                        f"class would ever be a head class; set head_cut below {most}, or raise per_class_cap",
                        phase.phase)]

    def describe(self, phase: PhaseData, options: Mapping[str, Any], seed: int) -> list[tuple[str, int]]:
        """Sequence 0 of the phase as `gtep check` prints it: its samples and classes (the generator run on the
        classes' image counts, which is all it draws from)."""
        spec = FluidOptions.of(options)
        pretrain = {c: range(phase.test_counts.get(c, 0) + held_out_count(phase.train_counts.get(c, 0),
                                                                          spec.pretrain_holdout))
                    for c in spec.pretrain_classes}
        novel = {c: range(phase.train_counts.get(c, 0) + phase.test_counts.get(c, 0)) for c in phase.classes}
        stream = fluid_stream(pretrain, novel, spec.n_pretrain_classes, spec.n_novel_classes, spec.zipf_s,
                              spec.total_samples, spec.per_class_cap, sequence_seed(seed, 0, phase.classes))
        head = sum(n > spec.head_cut for n in stream.counts.values())
        short = f" (total_samples is {spec.total_samples}; the caps and images allow no more)" \
            if len(stream) < spec.total_samples else ""
        what = (f"a stream of {len(stream)} samples{short}: {spec.n_pretrain_classes} pretrain classes "
                f"({100 * stream.pretrain.mean():.0f}% of the samples) + {spec.n_novel_classes} novel classes, "
                f"{head} head classes (> {spec.head_cut} samples)")
        return [(what, len(stream))]
