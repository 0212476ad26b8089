"""The experiment file: one YAML validated by pydantic, then resolved against the registries and the data.

Validation happens in two steps, both before any compute: `load_config` checks the file's shape and
types; `resolve` checks the names (algorithm, backbone, datasets, search space) and the protocol's
constraints (increments sum to each phase's classes; the phases share no class). Every failure is one
ConfigError naming the field and the fix.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, replace
from dataclasses import field as dataclass_field
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from gtep.protocol.scenarios import parse_increments, shared_classes, split_classes_in_two, split_groups_in_two

if TYPE_CHECKING:
    from gtep.data.pipelines import PipelineSpec
    from gtep.protocol.criteria import Criterion
    from gtep.protocol.families import ScenarioFamily


class ConfigError(ValueError):
    """One bad field: `field: what is wrong; how to fix it`."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.reason = message


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class FscilSpec(_Strict):
    """scenario.fscil: few-shot class-incremental sessions (papers/fscil-gacc.txt; gtep/protocol/families.py)."""

    base_classes: int = Field(ge=1, description="classes of the base session, with all their training images")
    ways: int = Field(ge=1, description="N: classes per few-shot session")
    shots: int = Field(ge=1, description="K: training images per class in a few-shot session")
    sessions: int = Field(ge=1, description="few-shot sessions after the base session")
    fixed_order: bool = False  # the benchmarks' split: classes in index order in every ordering (shots still drawn)
    # JSON {"<class id>": [indices into the dataset's training arrays]}: a benchmark's own shots
    shot_index: Path | None = None
    draw_missing_shots: bool = False  # classes shot_index omits draw their shots (else the file is refused)

    @field_validator("shot_index")
    @classmethod
    def _readable(cls, value: Path | None) -> Path | None:
        if value is None:
            return None
        from gtep.data.shot_index import read_shot_index

        path = Path(os.path.expanduser(value))
        if not path.is_file():
            raise ValueError(f"{value} does not exist; give a JSON file {{\"<class id>\": [training image indices]}}")
        try:
            read_shot_index(path)
        except (ValueError, TypeError, AttributeError) as err:
            raise ValueError(f"{value} is not a shot index ({err}); write {{\"<class id>\": [indices], ...}}") from None
        return path

    @property
    def options(self) -> dict[str, Any]:
        """The family's options: these fields, and the shot index file's content as `shots_given` (workers and
        the pre-flight checks need no file)."""
        from gtep.data.shot_index import read_shot_index

        options = self.model_dump(mode="json")
        if self.shot_index is not None:
            options["shots_given"] = {str(c): v for c, v in read_shot_index(self.shot_index).items()}
        return options


class IircSpec(_Strict):
    """scenario.iirc: Incremental Implicitly-Refined Classification (gtep/protocol/iirc_family.py). The phase's
    classes are the subclasses; `hierarchy` gives their superclasses."""

    first_task_superclasses: int = Field(ge=1, description="superclasses of task 0 (superclasses only)")
    classes_per_task: int = Field(ge=1, description="labels (superclasses and subclasses) of every later task")
    # "groups": each class group of the dataset (Omniglot's alphabets) is a superclass; else a JSON file
    # {"<superclass name>": ["<subclass class name or id>", ...]} (classes it does not list are standalone)
    hierarchy: str = "groups"
    sub_keep: float = Field(0.8, gt=0, le=1, description="share of a subclass's training images it keeps")
    super_share: float = Field(0.4, gt=0, le=1, description="share of each subclass's images its superclass gets")
    # The replay budget as the paper keeps it (20 per seen label, growing with the labels), in place of
    # training.memory_size's fixed total: give one of the two (config.resolve refuses both).
    memory_per_class: int | None = Field(None, ge=1, description="replay samples kept per seen label")
    in_task_validation: float = Field(0.0, ge=0, lt=1, description="share of each subclass's training images held "
                                      "out to validate in-task; its pw-JS plateau decays the lr (0: off)")
    plateau_patience: int = Field(10, ge=1, description="epochs without a validation gain before the lr decays "
                                  "(scaled by epoch_scale)")

    @field_validator("hierarchy")
    @classmethod
    def _hierarchy_source(cls, value: str) -> str:
        from gtep.protocol.iirc_family import GROUPS

        if value == GROUPS:
            return value
        path = Path(os.path.expanduser(value))
        if not path.is_file():
            raise ValueError(f"{value} is neither 'groups' nor an existing file; give 'groups' or a JSON file "
                             "{\"<superclass name>\": [\"<subclass class name or id>\", ...]}")
        read_hierarchy(path)
        return str(path.resolve())

    @property
    def options(self) -> dict[str, Any]:
        """The family's options: these fields, and a hierarchy file's content as `tree` (workers need no file)."""
        options = self.model_dump(mode="json")
        if self.hierarchy != "groups":
            options["tree"] = read_hierarchy(Path(self.hierarchy))
        return options


class CfslSpec(_Strict):
    """scenario.cfsl: continual few-shot tasks (gtep/protocol/cfsl.py, the CFSL spec's Algorithm 1); an ordering
    of a phase is tasks_per_ordering tasks drawn with (study seed, ordering)."""

    support_sets: int = Field(ge=1, description="NSS: support sets per task")
    ways: int = Field(ge=1, description="NC: classes per support set")
    shots: int = Field(ge=1, description="K_S: samples per class in a support set")
    target_shots: int = Field(ge=1, description="K_T: target samples per class per support set")
    class_change_interval: int = Field(1, ge=1, description="CCI: support sets per class block")
    overwrite: bool = Field(False, description="O: every class block reuses labels 0..NC-1")
    tasks_per_ordering: int = Field(10, ge=1, description="tasks that make one GTEP ordering")

    @model_validator(mode="after")
    def _blocks(self) -> "CfslSpec":
        if self.support_sets % self.class_change_interval:
            raise ValueError(f"support_sets ({self.support_sets}) must be a multiple of class_change_interval "
                             f"({self.class_change_interval}): a class block spans CCI support sets")
        return self


def read_hierarchy(path: Path) -> dict[str, list[str | int]]:
    """An IIRC hierarchy file: JSON {"<superclass name>": ["<subclass class name or id>", ...]}."""
    import json

    from gtep.protocol.iirc_family import parse_hierarchy

    try:
        return parse_hierarchy(json.loads(path.read_text()))
    except (ValueError, TypeError, AttributeError, OSError) as err:
        raise ValueError(f"{path} is not a hierarchy file ({err})") from None


class FluidSpec(_Strict):
    """scenario.fluid: FLUID's open-world stream (papers/fluid.txt; gtep/protocol/fluid_family.py)."""

    pretrain_classes: list[int] = Field(min_length=1, description="the backbone's pretraining classes, kept out "
                                        "of both phases; the streams show their test images")
    n_pretrain_classes: int = Field(ge=0, description="pretrain classes per sequence")
    n_novel_classes: int = Field(ge=1, description="novel classes per sequence (from the phase's classes)")
    total_samples: int = Field(ge=1, description="samples per sequence (fewer if the caps allow fewer)")
    per_class_cap: int = Field(ge=1, description="at most this many samples of one class")
    zipf_s: float = Field(1.0, ge=0, description="Zipf exponent of images per class (the paper's 1)")
    head_cut: int = Field(50, ge=0, description="head classes have more samples than this (the paper's 50)")
    window: int = Field(100, ge=1, description="steps per window of the rolling accuracy")
    backward_factor: float = Field(1.0, ge=0, description="a backward pass costs this many forward passes")
    unseen_positives: Literal["novel", "all"] = Field(
        "novel", description="the unseen detector's positives: first sightings of novel classes (the paper's App. "
        "H) or of every class, pretrain classes included")
    pretrain_holdout: float = Field(0.0, ge=0, lt=1, description="share of each pretrain class's training images "
                                    "that pretraining leaves out and the streams may show beside its test images")


class ScenarioSpec(_Strict):
    # gtep/protocol/families.py: class_incremental (the paper's; needs increments), fscil (needs the fscil
    # section), iirc (needs the iirc section) or cfsl (needs the cfsl section)
    family: str = "class_incremental"
    increments: str | list[int] | None = Field(
        None, description="classes per task: '10x10', 'C50xT1+C10xT5' or a list (class_incremental)")
    fscil: FscilSpec | None = None
    iirc: IircSpec | None = None
    fluid: FluidSpec | None = None
    cfsl: CfslSpec | None = None

    @field_validator("increments")
    @classmethod
    def _parse(cls, value: str | list[int] | None) -> str | list[int] | None:
        if value is not None:
            parse_increments(value)
        return value

    @model_validator(mode="after")
    def _family_and_its_section(self) -> "ScenarioSpec":
        from gtep.protocol.families import FAMILIES

        if self.family not in FAMILIES:
            raise ValueError(f"family {self.family!r} is unknown; choose from {FAMILIES.names()}")
        if self.iirc is not None and self.family != "iirc":
            raise ValueError("the iirc section needs family: iirc; remove it or set the family")
        if self.fluid is not None and self.family != "fluid":
            raise ValueError("the fluid section needs family: fluid; remove it or set the family")
        if self.cfsl is not None and self.family != "cfsl":
            raise ValueError("the cfsl section needs family: cfsl; remove it or set the family")
        if self.family == "class_incremental":
            if self.increments is None:
                raise ValueError("a class_incremental scenario needs increments, e.g. increments: 10x10")
            if self.fscil is not None:
                raise ValueError("the fscil section needs family: fscil; remove it or set the family")
        elif self.family == "fscil":
            if self.fscil is None:
                raise ValueError("family fscil needs its section, e.g. fscil: {base_classes: 60, ways: 5, shots: 5, "
                                 "sessions: 8}")
            if self.increments is not None:
                raise ValueError("an fscil scenario takes its tasks from the fscil section; remove increments")
        elif self.family == "iirc":
            if self.iirc is None:
                raise ValueError("family iirc needs its section, e.g. iirc: {first_task_superclasses: 2, "
                                 "classes_per_task: 10, hierarchy: groups}")
            if self.increments is not None or self.fscil is not None:
                raise ValueError("an iirc scenario takes its tasks from the iirc section; remove increments/fscil")
        elif self.family == "fluid":
            if self.fluid is None:
                raise ValueError("family fluid needs its section, e.g. fluid: {pretrain_classes: [0, 1, 2], "
                                 "n_pretrain_classes: 2, n_novel_classes: 10, total_samples: 500, per_class_cap: 100}")
            if self.increments is not None or self.fscil is not None or self.iirc is not None:
                raise ValueError("a fluid scenario takes its stream from the fluid section; remove "
                                 "increments/fscil/iirc")
        elif self.family == "cfsl":
            if self.cfsl is None:
                raise ValueError("family cfsl needs its section, e.g. cfsl: {support_sets: 10, ways: 5, shots: 1, "
                                 "target_shots: 5, class_change_interval: 1, overwrite: false}")
            if self.increments is not None or self.fscil is not None:
                raise ValueError("a cfsl scenario takes its tasks from the cfsl section; remove increments/fscil")
        return self

    @property
    def family_options(self) -> dict[str, Any]:
        """The family's options as the generator takes them (plain values, paths as strings)."""
        if self.family == "fscil" and self.fscil is not None:
            return self.fscil.options
        if self.family == "iirc" and self.iirc is not None:
            return self.iirc.options
        if self.family == "fluid" and self.fluid is not None:
            return self.fluid.model_dump(mode="json")
        if self.family == "cfsl" and self.cfsl is not None:
            return self.cfsl.model_dump(mode="json")
        return {"increments": self.increments}

    @property
    def increment_list(self) -> list[int]:
        from gtep.protocol.families import FAMILIES

        return FAMILIES.get(self.family).increments(self.family_options)

    def describe(self) -> str:
        """The scenario in one phrase, for terminals and run names: '10x10', 'fscil 20+4x5-way 5-shot'."""
        if self.family == "fscil" and self.fscil is not None:
            f = self.fscil
            return f"fscil {f.base_classes}+{f.sessions}x{f.ways}-way {f.shots}-shot"
        if self.family == "iirc" and self.iirc is not None:
            i = self.iirc
            source = "groups" if i.hierarchy == "groups" else Path(i.hierarchy).name
            extras = ([f"{i.memory_per_class}/label memory"] if i.memory_per_class is not None else []) + (
                [f"{i.in_task_validation:.0%} in-task validation"] if i.in_task_validation else [])
            return (f"iirc {i.first_task_superclasses} superclasses+{i.classes_per_task}/task ({source})"
                    + "".join(f", {e}" for e in extras))
        if self.family == "fluid" and self.fluid is not None:
            stream = self.fluid
            return (f"fluid {stream.n_pretrain_classes} pretrain+{stream.n_novel_classes} novel classes, "
                    f"{stream.total_samples} samples, zipf s={stream.zipf_s:g}")
        if self.family == "cfsl" and self.cfsl is not None:
            from gtep.protocol.cfsl import CfslOptions

            return CfslOptions.of(self.family_options).describe()
        increments = self.increments
        text = increments if isinstance(increments, str) else "+".join(map(str, increments or []))
        return text if self.family == "class_incremental" else f"{self.family} {text}"


class PhaseDataset(_Strict):
    """Low similarity: each phase names its own dataset, optionally restricted to some of its classes."""

    dataset: str
    classes: list[int] | None = None


class SplitSpec(_Strict):
    """High similarity: one dataset's classes cut into two disjoint sets with a seed."""

    dataset: str
    by: Literal["class", "group"] = "class"
    seed: int = Field(0, ge=0)
    classes: list[int] | None = None  # restrict the pool before splitting
    classes_per_phase: int | None = Field(None, ge=1)  # default: half the pool each
    tuning_groups: list[str] | None = None  # by=group: which groups (e.g. alphabets) go to tuning
    groups: list[str] | None = None  # restrict the pool to these groups (e.g. to leave others for pretrain)
    # by=group: which go to evaluation (default: every other group; groups in neither list are kept out)
    evaluation_groups: list[str] | None = None

    @model_validator(mode="after")
    def _evaluation_groups_need_tuning_groups(self) -> "SplitSpec":
        if self.evaluation_groups is not None and self.tuning_groups is None:
            raise ValueError("evaluation_groups needs tuning_groups too (the groups in neither list are kept out)")
        return self


class DatasetsSpec(_Strict):
    split: SplitSpec | None = None
    tuning: PhaseDataset | None = None
    evaluation: PhaseDataset | None = None

    @model_validator(mode="after")
    def _one_mode(self) -> "DatasetsSpec":
        if self.split is not None and (self.tuning or self.evaluation):
            raise ValueError("give either 'split' (one dataset, high similarity) or 'tuning' + 'evaluation', not both")
        if self.split is None and not (self.tuning and self.evaluation):
            raise ValueError("give 'split' (one dataset) or both 'tuning' and 'evaluation' datasets")
        return self


class SchedulerOptions(_Strict):
    """search.scheduler_options: rungs are counted in orderings (a set's running score after k of S)."""

    grace_period: float = Field(1, gt=0, description="orderings every set runs before it can be stopped (a "
                                "fraction of one with search.fidelity: tasks)")
    reduction_factor: float = Field(2.0, gt=1, description="keep the top 1/reduction_factor at each rung")
    brackets: int = Field(1, ge=1, description="ASHA brackets (HyperBand ignores it)")


PRUNERS = ("none", "median", "percentile", "successive_halving", "hyperband")


class PrunerOptions(_Strict):
    """search.pruner_options: Optuna's pruners on the orderings axis (a step is an ordering done)."""

    n_startup_trials: int = Field(2, ge=0, description="median/percentile: sets that finish before any is pruned")
    n_warmup_steps: int = Field(0, ge=0, description="median/percentile: orderings a set runs before it can be "
                                "pruned (beyond the first)")
    percentile: float = Field(25.0, gt=0, lt=100, description="percentile: prune below this percentile of the "
                              "finished sets' scores at the same ordering")
    min_resource: int = Field(1, ge=1, description="successive_halving/hyperband: orderings at the first rung")
    reduction_factor: int = Field(2, ge=2, description="successive_halving/hyperband: keep the top 1/this at a rung")


class SearchSpec(_Strict):
    trials: int = Field(30, ge=1, description="R: sampled hyperparameter sets")
    orderings: int = Field(5, ge=1, description="S: class orderings per set and in evaluation")
    space: Path | None = None  # default: search_spaces/<algorithm>.yaml
    searcher: Literal["random", "optuna-tpe", "optuna-random"] = "random"
    selection: Literal["hmean_of_means", "mean_of_hmeans"] = "hmean_of_means"
    # H*'s criterion (gtep/protocol/criteria.py); None: the scenario family's (hmean_acc_avgacc, gacc_auc for fscil)
    criterion: str | None = None
    # Early stopping on the orderings axis: a trial reports its running score after each ordering; ASHA or
    # HyperBand stop sets whose score is hopeless at a rung. A stopped set is never H* (set_status "stopped").
    scheduler: Literal["none", "asha", "hyperband"] = "none"
    scheduler_options: SchedulerOptions = Field(default_factory=lambda: SchedulerOptions())
    # How sets are compared in the tuning phase: gtep (every set over the whole scenario), first_task (Lee et al.
    # 2024: only the first `protocol_tasks` tasks; H* runs the whole scenario in evaluation). The conventional
    # protocol (tune and report on D^HT): tuning as gtep's, and `gtep run` adds the `conventional` phase (the same
    # as --protocol conventional).
    protocol: Literal["gtep", "first_task", "conventional"] = "gtep"
    protocol_tasks: int = Field(1, ge=1, description="k: the tasks sets are compared on with protocol first_task")
    # Optuna's pruners (with the Optuna searchers) on the same axis as search.scheduler: a set's running score after
    # each ordering is an intermediate value; a pruned set is stopped as a scheduler stops it, and is never H*.
    pruner: Literal[PRUNERS] = "none"  # type: ignore[valid-type]
    pruner_options: PrunerOptions = Field(default_factory=lambda: PrunerOptions())
    # When a trial reports its running score: after each ordering, or also after each task inside one (then a
    # scheduler's time is orderings done + tasks done / T, and a pruner's step is tasks done), so a hopeless set
    # can be stopped inside its first ordering. Class-incremental scenarios, one ordering at a time per trial.
    fidelity: Literal["orderings", "tasks"] = "orderings"

    @model_validator(mode="after")
    def _rungs_fit(self) -> "SearchSpec":
        if self.scheduler != "none" and self.scheduler_options.grace_period >= self.orderings:
            raise ValueError(f"scheduler_options.grace_period ({self.scheduler_options.grace_period}) must be below "
                             f"search.orderings ({self.orderings}): a rung at S stops nothing")
        if self.pruner != "none" and self.scheduler != "none":
            raise ValueError(f"give search.scheduler ({self.scheduler}) or search.pruner ({self.pruner}), not both: "
                             "each stops sets on its own")
        if self.pruner != "none" and not self.searcher.startswith("optuna"):
            raise ValueError(f"search.pruner {self.pruner} is one of Optuna's pruners and runs with the Optuna "
                             f"searchers: set search.searcher to optuna-tpe or optuna-random, or stop sets with "
                             f"search.scheduler (asha, hyperband) under the {self.searcher} searcher")
        return self

    @property
    def stops_sets(self) -> bool:
        """Whether a scheduler or a pruner may stop a set before its S orderings."""
        return self.scheduler != "none" or self.pruner != "none"


ADDED_SEARCH_FIELDS = ("scheduler", "scheduler_options", "protocol", "protocol_tasks",  # issue 24
                       "pruner", "pruner_options", "fidelity")
ADDED_IIRC_FIELDS = ("memory_per_class", "in_task_validation", "plateau_patience")  # issue 31


def with_added_defaults(stored: dict[str, Any]) -> dict[str, Any]:
    """A recorded config (a manifest's) with the search fields (and scenario.iirc's) added since, at their
    defaults: a study recorded before them compares equal to the same config today (resume, matrix cells)."""
    scenario = stored.get("scenario")
    if isinstance(scenario, dict) and isinstance(scenario.get("iirc"), dict):
        iirc = {name: IircSpec.model_fields[name].default for name in ADDED_IIRC_FIELDS}
        stored = {**stored, "scenario": {**scenario, "iirc": {**iirc, **scenario["iirc"]}}}
    if not isinstance(stored.get("search"), dict):
        return stored
    defaults = SearchSpec().model_dump(mode="json")
    return {**stored, "search": {**{k: defaults[k] for k in ADDED_SEARCH_FIELDS}, **stored["search"]}}


class FirstTaskConfig(_Strict):
    """The paper's Table 3: the first task's fixed recipe."""

    epochs: int = Field(200, ge=1)
    lr: float = Field(0.1, gt=0)
    milestones: list[int] = [60, 120, 170]
    lr_decay: float = 0.1
    weight_decay: float = 5e-4
    batch_size: int = Field(128, ge=1)  # Table 3 gives none; PyCIL uses its batch size
    scheduler: Literal["sampled", "steplr", "cosine", "constant"] = "sampled"


PipelineName = Literal["pycil-cifar", "pycil-imagenet", "pilot", "pilot-coda", "none"]


class TrainingSpec(_Strict):
    memory_size: int = Field(1000, ge=0, description="exemplars in total, spread evenly over seen classes")
    epoch_scale: float = Field(1.0, gt=0, le=1, description="multiplies every epoch count (smoke runs); 1 = the paper")
    # The data pipeline (gtep/data/pipelines.py): true = the dataset's own (32 px arrays: pycil-cifar; ImageFolder
    # trees: pycil-imagenet; a ViT backbone: pilot), false = none (train on the test view), or a name.
    augment: bool | PipelineName = True

    @field_validator("augment", mode="before")
    @classmethod
    def _pipeline_name(cls, value: Any) -> Any:
        """A word that names no pipeline gets the list of names (not pydantic's 'should be a valid boolean')."""
        names = PipelineName.__args__  # type: ignore[attr-defined]
        if isinstance(value, bool) or value in names:
            return value
        raise ValueError(f"{value!r} is not a data pipeline; use true (the dataset's own), false, or one of "
                         f"{', '.join(names)} (README: Data pipelines)")
    # The side the network sees with a resizing pipeline (ImageNet-like data, ViTs): None = the paper's (224 px,
    # or the ViT's own input); smaller for CPU smoke runs. ImageFolder images are stored at 256/224 of it.
    image_size: int | None = Field(None, ge=8, le=1024)
    device: str = "auto"
    # Train each ordering's first task once per study and share it between the sets (its result does not
    # depend on the sampled set, paper appendix A.1); off: every (set, ordering) trains its own.
    reuse_first_task: bool = True
    # On CUDA: bf16 autocast and channels-last memory format (ignored on the CPU); off: plain fp32.
    mixed_precision: bool = True
    compile: bool = False  # torch.compile the training step's loss (worth it for long GPU runs)


class ComputeSpec(_Strict):
    cpus_per_trial: float = Field(1, gt=0)
    gpus_per_trial: float = Field(0, ge=0)
    max_concurrent: int | None = Field(None, ge=1)
    ray_address: str | None = None  # None: start Ray locally
    # a trial whose worker dies is retried this often; it continues from its last finished task
    max_failures: int = Field(2, ge=0)
    checkpoints: bool = True  # per-task checkpoints of running orderings (off: a retry restarts the ordering)
    # What one ordering needs; a trial with room for several runs its orderings in parallel (None: the trial's)
    cpus_per_ordering: float | None = Field(None, gt=0)
    gpus_per_ordering: float | None = Field(None, ge=0)

    @model_validator(mode="after")
    def _orderings_fit_in_a_trial(self) -> "ComputeSpec":
        if self.cpus_per_ordering is not None and self.cpus_per_ordering > self.cpus_per_trial:
            raise ValueError(f"cpus_per_ordering ({self.cpus_per_ordering:g}) exceeds cpus_per_trial "
                             f"({self.cpus_per_trial:g}); lower it or raise cpus_per_trial")
        if self.gpus_per_ordering and self.gpus_per_ordering > self.gpus_per_trial:
            raise ValueError(f"gpus_per_ordering ({self.gpus_per_ordering:g}) exceeds gpus_per_trial "
                             f"({self.gpus_per_trial:g}); lower it or raise gpus_per_trial")
        return self

    def parallel_orderings(self, orderings: int) -> int:
        """How many orderings of one trial run at once: as many as the trial's resources hold, at most S."""
        slots = [int(self.cpus_per_trial // self.cpus_per_ordering)] if self.cpus_per_ordering else [1]
        if self.gpus_per_ordering:
            slots.append(int(self.gpus_per_trial // self.gpus_per_ordering))
        return max(1, min(orderings, *slots))


class TrackingSpec(_Strict):
    output: Path = Path("gtep-runs")
    tracking_uri: str | None = None  # default sqlite:///<output>/mlflow.db


class PretrainSection(_Strict):
    """A backbone pretrained once before the phases (gtep.orchestration.pretraining), on classes kept out of both,
    cached and used as the run's weights: a preset then runs on a fresh machine with no weights file."""

    dataset: str | None = None  # default: the study's dataset (datasets.split.dataset, else datasets.tuning.dataset)
    classes: list[int] | None = None  # class ids of that dataset ...
    groups: list[str] | None = None  # ... or whole class groups (e.g. Omniglot's alphabets); neither: all of them
    epochs: int | None = Field(None, ge=1)  # default per backbone kind: gtep.engine.pretrain.default_spec
    lr: float | None = Field(None, gt=0)
    batch_size: int = Field(64, ge=1)
    weight_decay: float | None = Field(None, ge=0)
    seed: int = Field(0, ge=0)

    @model_validator(mode="after")
    def _classes_or_groups(self) -> "PretrainSection":
        if self.classes is not None and self.groups is not None:
            raise ValueError("give either 'classes' or 'groups' to pretrain on (kept out of both phases), not both")
        if self.classes is None and self.groups is None and self.dataset is None:
            raise ValueError("give the 'classes' or 'groups' to pretrain on (kept out of both phases), or a "
                             "'dataset' of its own to pretrain on all its classes")
        return self


class ExperimentConfig(_Strict):
    study: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    algorithm: str
    backbone: str = "resnet32"
    weights: Path | None = None  # pretrained weights (safetensors or a state dict); see gtep pretrain
    pretrain: PretrainSection | None = None  # or: pretrain the backbone before the phases (cached)
    scenario: ScenarioSpec
    datasets: DatasetsSpec
    search: SearchSpec = SearchSpec()
    first_task: FirstTaskConfig = FirstTaskConfig()
    training: TrainingSpec = TrainingSpec()
    compute: ComputeSpec = ComputeSpec()
    tracking: TrackingSpec = TrackingSpec()
    seed: int = Field(0, ge=0)  # numpy seeds are non-negative

    @model_validator(mode="before")
    @classmethod
    def _one_memory_budget(cls, data: Any) -> Any:
        """scenario.iirc.memory_per_class is the whole budget: a training.memory_size left out is 0, not the
        fixed total's default (resolve refuses a memory_size given beside it). Written into the data, so a
        config dumped and read again (a manifest, command-line overrides) means the same."""
        scenario = data.get("scenario") if isinstance(data, dict) else None
        iirc = scenario.get("iirc") if isinstance(scenario, dict) else None
        if not isinstance(iirc, dict) or iirc.get("memory_per_class") is None:
            return data
        training = data.get("training") or {}
        if isinstance(training, dict) and "memory_size" not in training:
            data = {**data, "training": {**training, "memory_size": 0}}
        return data

    @property
    def study_dir(self) -> Path:
        return self.tracking.output / self.study

    @property
    def tracking_uri(self) -> str:
        return self.tracking.tracking_uri or f"sqlite:///{self.tracking.output.resolve()}/mlflow.db"

    def with_overrides(self, **overrides: Any) -> "ExperimentConfig":
        """Apply CLI options given as dotted paths (None means 'not given')."""
        data = self.model_dump(mode="python")
        for dotted, value in overrides.items():
            if value is None:
                continue
            node = data
            *parents, leaf = dotted.split(".")
            for key in parents:
                node = node[key]
            node[leaf] = value
        return _validate(data, "command line")


# ---------------------------------------------------------------- loading

_ENV = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def _expand_env(value: Any, where: str) -> Any:
    """${VAR} in strings becomes the variable's value (presets name data roots this way); never evaluated."""
    if isinstance(value, dict):
        return {k: _expand_env(v, f"{where}.{k}" if where else k) for k, v in value.items()}
    if isinstance(value, list):
        return [_expand_env(v, where) for v in value]
    if isinstance(value, str):
        def sub(match: re.Match) -> str:
            name = match.group(1)
            if name not in os.environ:
                raise ConfigError(where, f"uses ${{{name}}} but the environment variable {name} is not set; export it")
            return os.environ[name]
        return _ENV.sub(sub, value)
    return value


NAME_RULE = "start with a letter or digit and use only letters, digits, '_', '.' and '-'"


def _validate(data: dict[str, Any], source: str) -> ExperimentConfig:
    try:
        return ExperimentConfig.model_validate(data)
    except ValidationError as err:
        first = err.errors()[0]
        field = ".".join(str(p) for p in first["loc"] if not str(p).startswith("function-")) or "config"
        message = first["msg"]
        if first["type"] == "extra_forbidden":
            message = "is not a known field; remove it or check its spelling"
        elif first["type"] == "missing":
            message = "is required; add it to the experiment file"
        elif first["type"] in ("model_type", "dict_type", "model_attributes_type"):
            message = f"should be a mapping of its fields (key: value lines), not {first['input']!r}"
        elif first["type"] == "list_type":
            message = f"should be a list such as [1, 2, 3], not {first['input']!r}"
        elif first["type"] == "value_error":
            message = message.removeprefix("Value error, ")
        elif first["type"] == "string_pattern_mismatch":
            message = f"{first['input']!r} is not a valid name; {NAME_RULE} (it names a folder and an experiment)"
        raise ConfigError(field, f"{message} (in {source})") from None


def validate_config(data: Any, source: str) -> ExperimentConfig:
    """A config from data (a study's manifest, say): a bad field is one ConfigError naming it and `source`."""
    if not isinstance(data, dict):
        raise ConfigError("config", f"{source} holds no experiment config (a mapping of fields)")
    return _validate(data, source)


def read_yaml(path: Path, field: str, what: str) -> Any:
    """A YAML file's data. A missing file, a folder, a binary file or bad syntax is one ConfigError naming `field`
    (the option or config field that gave the path), the file and, for bad syntax, the line and column."""
    from gtep.spaces import yaml_error

    path = Path(path)
    if not path.exists():
        raise ConfigError(field, f"{path} does not exist; give the path of {what}")
    if path.is_dir():
        raise ConfigError(field, f"{path} is a folder; give the path of {what}")
    try:
        return yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise ConfigError(field, yaml_error(path, err)) from None
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(field, f"cannot read {path} as YAML text ({err.__class__.__name__}); "
                          f"give the path of {what}") from None


def load_config(path: Path) -> ExperimentConfig:
    path = Path(path)
    data = read_yaml(path, "--config", "an experiment YAML file")
    if not isinstance(data, dict):
        raise ConfigError("--config", f"{path} must be a YAML mapping of fields (study, algorithm, scenario, ...)")
    return _validate(_expand_env(data, ""), str(path))


def preset_names() -> list[str]:
    return sorted(p.name[:-5] for p in resources.files("gtep.presets").iterdir() if p.name.endswith(".yaml"))


def preset_text(name: str) -> str:
    if name not in preset_names():
        raise ConfigError("--preset", f"unknown preset {name!r}; choose from {preset_names()} (gtep presets)")
    return resources.files("gtep.presets").joinpath(f"{name}.yaml").read_text()


def load_preset(name: str) -> ExperimentConfig:
    data = yaml.safe_load(preset_text(name))
    return _validate(_expand_env(data, ""), f"preset {name}")


# ---------------------------------------------------------------- resolving against registries and data

@dataclass(frozen=True)
class PhaseSpec:
    """The dataset and the class ids (in that dataset) a phase uses."""

    phase: str  # "tune" | "evaluate"
    dataset: str
    classes: tuple[int, ...]
    class_names: tuple[str, ...]


@dataclass(frozen=True)
class PretrainPlan:
    """The config's pretrain section resolved: the dataset (at the phases' storage size) and its class ids."""

    dataset: str
    classes: tuple[int, ...]


@dataclass(frozen=True)
class ResolvedExperiment:
    config: ExperimentConfig
    increments: tuple[int, ...]
    tuning: PhaseSpec
    evaluation: PhaseSpec
    space_path: Path
    pretraining: PretrainPlan | None = None
    pretrained: Path | None = None  # the file the pretrain step wrote or found (gtep.orchestration.pretraining)
    # phase -> what its loader converted to reach uint8 pixels (gtep.preflight; recorded as gtep.data_conversion)
    data_conversions: dict[str, str] = dataclass_field(default_factory=dict)

    @property
    def weights(self) -> Path | None:
        """The run's backbone weights: those the pretrain section made, else the config's `weights`."""
        return self.pretrained or self.config.weights

    @property
    def family(self) -> "ScenarioFamily":
        from gtep.protocol.families import FAMILIES

        return FAMILIES.get(self.config.scenario.family)

    @property
    def criterion(self) -> "Criterion":
        """H*'s criterion: search.criterion, else the scenario family's."""
        from gtep.protocol.criteria import CRITERIA

        return CRITERIA.get(self.config.search.criterion or self.family.default_criterion)

    def phase(self, name: str) -> PhaseSpec:
        """The data of a phase label: D^HT for tune and conventional (H* re-run where it was tuned, paper section
        3.1), D^E for evaluate and original."""
        return self.tuning if name in ("tune", "conventional") else self.evaluation

    def pipeline(self, name: str) -> "PipelineSpec":
        """The data pipeline of a phase label: chosen by its dataset, unless training.augment names one."""
        return phase_pipeline(self.config, self.phase(name).dataset)


def phase_pipeline(cfg: ExperimentConfig, dataset: str) -> "PipelineSpec":
    from gtep.data.pipelines import choose_pipeline

    return choose_pipeline(cfg.training.augment, dataset, cfg.backbone, cfg.algorithm, cfg.training.image_size)


def _stored_at_pipeline_size(cfg: ExperimentConfig, phase: PhaseSpec) -> PhaseSpec:
    """ImageFolder images are decoded once, at the side the phase's pipeline resizes test images to (256 px for
    224), with its interpolation; a size given in the dataset string stays."""
    from gtep.data import with_storage

    spec = phase_pipeline(cfg, phase.dataset)
    dataset = with_storage(phase.dataset, spec.storage_side(), spec.interpolation)
    return replace(phase, dataset=dataset)


def _check_classes(field: str, classes: list[int], available: int) -> None:
    bad = [c for c in classes if not 0 <= c < available]
    if bad:
        raise ConfigError(field, f"class ids {bad[:5]} are outside 0..{available - 1}; use ids of the dataset")
    if len(set(classes)) != len(classes):
        raise ConfigError(field, "lists a class twice; give each class id once")


def _source(field: str, name: str):
    from gtep.data import DatasetError, resolve_dataset

    try:
        source = resolve_dataset(name)
        source.class_names  # reads metadata: proves the file or root is there and readable
        return source
    except DatasetError as err:
        raise ConfigError(field, str(err)) from None


def _phase_classes(cfg: ExperimentConfig) -> tuple[PhaseSpec, PhaseSpec]:
    spec = cfg.datasets
    if spec.split is not None:
        split = spec.split
        source = _source("datasets.split.dataset", split.dataset)
        names = source.class_names
        pool = split.classes if split.classes is not None else list(range(len(names)))
        _check_classes("datasets.split.classes", pool, len(names))
        if split.groups is not None:
            all_groups = source.class_groups
            if all_groups is None:
                raise ConfigError("datasets.split.groups", f"{split.dataset} has no class groups; drop groups")
            unknown = sorted(set(split.groups) - set(all_groups))
            if unknown:
                raise ConfigError("datasets.split.groups", f"{split.dataset} has no groups {unknown[:5]}")
            pool = [c for c in pool if all_groups[c] in set(split.groups)]
        if split.by == "group":
            groups = source.class_groups
            if groups is None:
                raise ConfigError("datasets.split.by", f"{split.dataset} has no class groups; use by: class")
            try:
                t_idx, e_idx = split_groups_in_two([groups[c] for c in pool], split.seed, split.tuning_groups,
                                                   split.evaluation_groups)
            except ValueError as err:
                # the evaluation list is at fault when it names a group that is unknown or already in tuning
                free = set(groups) - set(split.tuning_groups or ())
                field = "evaluation_groups" if not set(split.evaluation_groups or ()) <= free else "tuning_groups"
                raise ConfigError(f"datasets.split.{field}", str(err)) from None
            tuning, evaluation = [pool[i] for i in t_idx], [pool[i] for i in e_idx]
            if split.classes_per_phase:
                n = split.classes_per_phase
                if min(len(tuning), len(evaluation)) < n:
                    raise ConfigError("datasets.split.classes_per_phase",
                                      f"{n} classes per phase, but the groups give {len(tuning)} and {len(evaluation)}")
                tuning, evaluation = sorted(tuning)[:n], sorted(evaluation)[:n]
        else:
            n = split.classes_per_phase or len(pool) // 2
            if 2 * n > len(pool):
                raise ConfigError("datasets.split.classes_per_phase",
                                  f"2 x {n} classes do not fit in the pool of {len(pool)}; lower it")
            tuning, evaluation = split_classes_in_two(pool, split.seed, n, n)
        t = PhaseSpec("tune", source.name, tuple(sorted(tuning)), tuple(names[c] for c in sorted(tuning)))
        e = PhaseSpec("evaluate", source.name, tuple(sorted(evaluation)), tuple(names[c] for c in sorted(evaluation)))
        return t, e
    phases = []
    sources = []
    for phase, field in (("tune", "tuning"), ("evaluate", "evaluation")):
        ref: PhaseDataset = getattr(spec, field)
        source = _source(f"datasets.{field}.dataset", ref.dataset)
        names = source.class_names
        classes = ref.classes if ref.classes is not None else list(range(len(names)))
        _check_classes(f"datasets.{field}.classes", classes, len(names))
        phases.append(PhaseSpec(phase, source.name, tuple(sorted(classes)), tuple(names[c] for c in sorted(classes))))
        sources.append(source)
    if sources[0].identity == sources[1].identity:
        shared = shared_classes(phases[0].classes, phases[1].classes)
        if shared:
            raise ConfigError("datasets.evaluation.classes",
                              f"shares {len(shared)} classes with datasets.tuning (e.g. {shared[:5]}); "
                              "GTEP needs disjoint phases: give disjoint class lists or use datasets.split")
    return phases[0], phases[1]


def _check_weights(cfg: ExperimentConfig, phases: tuple[PhaseSpec, PhaseSpec]) -> None:
    if cfg.weights is not None:
        check_weights_file(cfg.weights, cfg.backbone, phases)


def check_weights_file(weights: Path, backbone: str, phases: tuple[PhaseSpec, PhaseSpec]) -> None:
    """Weights must exist, fit the backbone, and not have been pretrained on a class either phase uses."""
    from gtep.data import resolve_dataset
    from gtep.models.vit import weights_metadata

    if not Path(weights).exists():
        raise ConfigError("weights", f"{weights} does not exist; train one with gtep pretrain or fix the path")
    if Path(weights).is_dir():
        raise ConfigError("weights", f"{weights} is a folder; give a .safetensors file (gtep pretrain) "
                          "or a saved state dict")
    try:
        meta = weights_metadata(Path(weights))
    except Exception as err:  # noqa: BLE001 - safetensors raises its own error types for a damaged header
        raise ConfigError("weights", f"{weights} is not a readable safetensors file ({err.__class__.__name__}); "
                          "give the file gtep pretrain wrote") from None
    if meta.get("gtep.backbone") and meta["gtep.backbone"] != backbone:
        raise ConfigError("weights", f"{weights} holds {meta['gtep.backbone']}, not {backbone}; "
                          "match --backbone")
    if "gtep.dataset" in meta and "gtep.classes" in meta:
        pretrained = {int(c) for c in meta["gtep.classes"].split(",") if c}
        identity = resolve_dataset(meta["gtep.dataset"]).identity
        for phase in phases:
            if resolve_dataset(phase.dataset).identity == identity and pretrained & set(phase.classes):
                shared = sorted(pretrained & set(phase.classes))
                raise ConfigError("weights", f"{weights} was pretrained on {len(shared)} classes the {phase.phase} "
                                  f"phase uses (e.g. {shared[:5]}); pretrain on classes kept out of both phases")


def _check_pretrain(cfg: ExperimentConfig, phases: tuple[PhaseSpec, PhaseSpec]) -> PretrainPlan | None:
    """The pretrain section's classes: in the dataset, and in neither phase (same dataset), before any compute."""
    section = cfg.pretrain
    if section is None:
        return None
    if cfg.weights is not None:
        raise ConfigError("pretrain", "the config gives both weights and a pretrain section; drop one (the pretrain "
                          "section makes the weights)")
    default = cfg.datasets.split.dataset if cfg.datasets.split else cfg.datasets.tuning.dataset  # type: ignore[union-attr]
    source = _source("pretrain.dataset", section.dataset or default)
    names = source.class_names
    if section.groups is not None:
        groups = source.class_groups
        if groups is None:
            raise ConfigError("pretrain.groups", f"{source.name} has no class groups; give pretrain.classes")
        unknown = sorted(set(section.groups) - set(groups))
        if unknown:
            raise ConfigError("pretrain.groups", f"{source.name} has no groups {unknown[:5]}; "
                              f"it has e.g. {sorted(set(groups))[:5]}")
        classes = [c for c, g in enumerate(groups) if g in set(section.groups)]
        field = "pretrain.groups"
    elif section.classes is not None:
        classes = list(section.classes)
        field = "pretrain.classes"
        _check_classes(field, classes, len(names))
    else:  # a dataset of its own (the validator saw to it), every class of it
        classes, field = list(range(len(names))), "pretrain.dataset"
    if not classes:
        raise ConfigError(field, "names no classes; give the classes (or groups) to pretrain on")
    from gtep.data import resolve_dataset

    for phase in phases:
        if resolve_dataset(phase.dataset).identity == source.identity:
            shared = sorted(set(classes) & set(phase.classes))
            if shared:
                raise ConfigError(field, f"shares {len(shared)} classes with the {phase.phase} phase (e.g. "
                                  f"{shared[:5]}); pretrain on classes kept out of both phases (restrict the "
                                  "phases with datasets.split.classes, or pick other classes)")
    stored = _stored_at_pipeline_size(cfg, PhaseSpec("pretrain", source.name, tuple(classes), ()))
    return PretrainPlan(stored.dataset, tuple(sorted(classes)))


_DEVICE = re.compile(r"^(auto|cpu|mps|cuda(:[0-9]+)?)$")
TRACKING_SCHEMES = ("sqlite", "file", "http", "https", "postgresql", "mysql", "mssql", "databricks")


def check_device(device: str, field: str) -> None:
    if not _DEVICE.match(device):
        raise ConfigError(field, f"{device!r} is not a device; use auto, cpu, cuda or cuda:N")


def _blocking_file(path: Path) -> Path | None:
    """The file (not folder) that `path` or one of its parents is, so that the folder cannot be made there."""
    for candidate in (path, *path.parents):
        try:
            if candidate.exists():
                return None if candidate.is_dir() else candidate
        except OSError:  # a name longer than the filesystem takes: it does not exist (gtep.preflight refuses it)
            continue
    return None


def check_output(output: Path, field: str) -> None:
    blocking = _blocking_file(Path(output).expanduser())
    if blocking is not None:
        raise ConfigError(field, f"{blocking} is a file, so the folder {output} cannot be made there; "
                          "give a folder for the studies")


def check_tracking_uri(uri: str, field: str) -> None:
    """A store MLflow can open: a known scheme, and for sqlite a file whose folder can be made (nothing is written)."""
    match = re.match(r"^([A-Za-z][A-Za-z0-9+.-]*):", uri)
    if match is None or re.match(r"^[A-Za-z]:[\\/]", uri):
        return  # a plain folder: MLflow's file store
    scheme = match.group(1).split("+", 1)[0].lower()
    if scheme not in TRACKING_SCHEMES:
        raise ConfigError(field, f"{uri!r} has the unknown scheme {scheme!r}; use sqlite:///PATH/mlflow.db, "
                          "http://HOST:PORT (gtep server) or postgresql://... (MLflow knows "
                          f"{', '.join(TRACKING_SCHEMES)})")
    if scheme == "sqlite":
        path = uri[len("sqlite:///"):] if uri.startswith("sqlite:///") else ""
        if not path:
            raise ConfigError(field, f"{uri!r} names no file; write sqlite:///PATH/mlflow.db "
                              "(four slashes for an absolute path)")
        blocking = _blocking_file(Path(path).parent)
        if blocking is not None:
            raise ConfigError(field, f"{blocking} is a file, so {path} cannot be made there; give another path")


def _check_family(cfg: ExperimentConfig) -> None:
    """The criterion is built from metrics the family reports, and the algorithm can run the family's data."""
    from gtep.algorithms import ALGORITHMS
    from gtep.protocol.criteria import CRITERIA
    from gtep.protocol.families import FAMILIES

    family = FAMILIES.get(cfg.scenario.family)
    name = cfg.search.criterion
    if name is not None:
        if name not in CRITERIA:
            raise ConfigError("search.criterion", f"unknown criterion {name!r}; choose from {CRITERIA.names()}")
        missing = [m for m in CRITERIA.get(name).components if m not in family.metric_names]
        if missing:
            usable = [c for c in CRITERIA.names() if set(CRITERIA.get(c).components) <= set(family.metric_names)]
            raise ConfigError("search.criterion", f"{name!r} needs {missing}, which the {family.name} family does "
                              f"not report; choose from {usable}")
    if family.data_flow not in ALGORITHMS.get(cfg.algorithm).data_flows:
        able = [a for a in ALGORITHMS.names() if family.data_flow in ALGORITHMS.get(a).data_flows]
        raise ConfigError("algorithm", f"{cfg.algorithm} cannot run the {family.name} family's data "
                          f"({family.data_flow}); algorithms that can: {', '.join(able) or 'none'}")


def _check_iirc(cfg: ExperimentConfig, tuning: PhaseSpec, evaluation: PhaseSpec) -> tuple[int, ...]:
    """IIRC before any compute: each phase's hierarchy (its classes are the subclasses), no superclass with
    subclasses in both phases of one dataset, and a task sequence for each phase. Returns the tuning phase's
    labels per task (ResolvedExperiment.increments: the same in every ordering; the evaluation phase's may
    differ, and its jobs compute their own)."""
    from gtep.protocol.iirc_family import IircOptions, ordering_tasks, phase_hierarchy, split_problem, task_sizes

    spec = cfg.scenario.iirc
    assert spec is not None
    if spec.memory_per_class is not None and cfg.training.memory_size:
        raise ConfigError("scenario.iirc.memory_per_class", f"is {spec.memory_per_class} per label but "
                          f"training.memory_size gives a fixed total ({cfg.training.memory_size}) too; give one "
                          "budget: remove training.memory_size, or memory_per_class for the fixed total")
    options = IircOptions.of(cfg.scenario.family_options)
    sizes: list[tuple[int, ...]] = []
    metadata = []
    for phase in (tuning, evaluation):
        source = _source("datasets.split.dataset" if cfg.datasets.split else
                         f"datasets.{'tuning' if phase.phase == 'tune' else 'evaluation'}.dataset", phase.dataset)
        names, groups = source.class_names, source.class_groups
        metadata.append((source.identity, names, groups))
        try:
            hierarchy = phase_hierarchy(phase.classes, options.source, names, groups)
        except ValueError as err:
            raise ConfigError("scenario.iirc.hierarchy", f"{err} ({phase.phase} phase, {phase.dataset})") from None
        n_super = len(hierarchy.superclasses)
        if spec.first_task_superclasses > n_super:
            raise ConfigError("scenario.iirc.first_task_superclasses",
                              f"is {spec.first_task_superclasses} but the {phase.phase} phase has {n_super} "
                              f"superclasses; lower it to at most {n_super}")
        try:
            ordering_tasks(hierarchy, options, cfg.seed, 0)
        except ValueError as err:
            raise ConfigError("scenario.iirc", f"{err} ({phase.phase} phase: {n_super} superclasses, "
                              f"{len(hierarchy.subclasses)} subclasses); change first_task_superclasses or "
                              "classes_per_task") from None
        sizes.append(tuple(task_sizes(hierarchy, options)))
    (t_id, names, groups), (e_id, _, _) = metadata
    if t_id == e_id:
        problem = split_problem(tuning.classes, evaluation.classes, options.source, names, groups)
        if problem:
            raise ConfigError("scenario.iirc.hierarchy", f"{problem}: GTEP's phases must split the superclasses; "
                              "split by group (datasets.split.by: group) or give disjoint whole superclasses")
    return sizes[0]


def _check_fluid(cfg: ExperimentConfig, tuning: PhaseSpec, evaluation: PhaseSpec,
                 pretraining: PretrainPlan | None) -> None:
    """FLUID before any compute: the pretrain classes exist, are kept out of both phases and (with a pretrain
    section) are classes the backbone is pretrained on, and every phase has the classes a sequence draws."""
    spec = cfg.scenario.fluid
    assert spec is not None
    if pretraining is not None:
        foreign = sorted(set(spec.pretrain_classes) - set(pretraining.classes))
        if foreign:
            raise ConfigError("scenario.fluid.pretrain_classes", f"{foreign[:5]} are not among the pretrain "
                              "section's classes; the stream's pretrain classes are those the backbone was "
                              "pretrained on: list them in pretrain.classes too")
    if spec.pretrain_holdout > 0 and pretraining is None:
        raise ConfigError("scenario.fluid.pretrain_holdout", f"is {spec.pretrain_holdout:g}, but only the pretrain "
                          "section leaves those training images out of pretraining (a weights file may have trained "
                          "on them): pretrain with the pretrain section, or set it to 0")
    if len(set(spec.pretrain_classes)) != len(spec.pretrain_classes):
        raise ConfigError("scenario.fluid.pretrain_classes", "lists a class twice; give each class id once")
    if spec.n_pretrain_classes > len(spec.pretrain_classes):
        raise ConfigError("scenario.fluid.n_pretrain_classes", f"is {spec.n_pretrain_classes} but pretrain_classes "
                          f"lists {len(spec.pretrain_classes)}; lower it or list more classes")
    for phase in (tuning, evaluation):
        available = len(_source("scenario.fluid.pretrain_classes", phase.dataset).class_names)
        _check_classes("scenario.fluid.pretrain_classes", spec.pretrain_classes, available)
        shared = sorted(set(spec.pretrain_classes) & set(phase.classes))
        if shared:
            raise ConfigError("scenario.fluid.pretrain_classes", f"{len(shared)} of them are {phase.phase} classes "
                              f"(e.g. {shared[:5]}); keep the pretrain classes out of both phases (restrict "
                              "datasets.split.classes to the others)")
        if spec.n_novel_classes > len(phase.classes):
            raise ConfigError("scenario.fluid.n_novel_classes", f"is {spec.n_novel_classes} but the {phase.phase} "
                              f"phase has {len(phase.classes)} classes; lower it or give the phase more classes")
def _check_cfsl(cfg: ExperimentConfig, tuning: PhaseSpec, evaluation: PhaseSpec) -> None:
    """A CFSL task takes NC * NSS / CCI classes of its phase: each phase must have them. (That each class has
    CCI x (K_S + K_T) images is checked when a task is drawn: counting needs the images.)"""
    from gtep.protocol.cfsl import CfslOptions

    options = CfslOptions.of(cfg.scenario.family_options)
    for phase in (tuning, evaluation):
        if len(phase.classes) < options.classes_per_task:
            raise ConfigError("scenario.cfsl", f"a task takes {options.classes_per_task} classes (ways {options.ways} "
                              f"x support_sets {options.support_sets} / class_change_interval "
                              f"{options.class_change_interval}) but the {phase.phase} phase has {len(phase.classes)} "
                              f"({phase.dataset}); lower ways or support_sets, raise class_change_interval, or give "
                              "the phase more classes")


def _check_first_task_sets_differ(cfg: ExperimentConfig, space: dict[str, tuple]) -> None:
    """first_task at k = 1 compares sets on task 1 only; where the first task is trained with the fixed
    first_task recipe and no hyperparameter of the space that reaches it varies, every set scores the same
    and H* would be a tie broken by set order: refused, with the fix."""
    from gtep.algorithms import ALGORITHMS
    from gtep.engine.runner import names_reaching_first_task

    if cfg.search.protocol != "first_task" or cfg.search.protocol_tasks != 1:
        return
    names = names_reaching_first_task(ALGORITHMS.get(cfg.algorithm), cfg.first_task.scheduler)
    if names is None or any(len(set(map(repr, space.get(n, ())))) > 1 for n in names):
        return
    raise ConfigError("search.protocol_tasks", f"1 compares sets on task 1 only, which {cfg.algorithm} trains with "
                      f"the fixed first_task recipe: none of the space's values reaches it (only "
                      f"{', '.join(sorted(names))} would), so every set would score the same; set protocol_tasks "
                      "to 2 or more (or first_task.scheduler: sampled with a sampled scheduler)")


def resolve(cfg: ExperimentConfig) -> ResolvedExperiment:
    """Check every name and constraint; touches only metadata, never trains or writes anything."""
    from gtep.algorithms import ALGORITHMS
    from gtep.models import BACKBONES, backbone_exists
    from gtep.spaces import SearchSpaceError, default_space_file, load_space

    if cfg.algorithm not in ALGORITHMS:
        raise ConfigError("algorithm", f"unknown algorithm {cfg.algorithm!r}; "
                          f"choose from {ALGORITHMS.names()} (gtep algorithms)")
    if not backbone_exists(cfg.backbone):
        raise ConfigError("backbone", f"unknown backbone {cfg.backbone!r}; choose from {BACKBONES.names()}, "
                          "vit_micro_patch4_32, vit_mini_patch4_32 or any timm ViT name")
    from gtep.models.vit import is_vit

    if ALGORITHMS.get(cfg.algorithm).uses_pretrained and not is_vit(cfg.backbone):
        raise ConfigError("backbone", f"{cfg.algorithm} works on a pretrained ViT, not {cfg.backbone!r}; "
                          "pass --backbone vit_... --weights FILE (gtep pretrain makes one)")
    check_device(cfg.training.device, "training.device")
    check_output(cfg.tracking.output, "tracking.output")
    check_tracking_uri(cfg.tracking_uri, "tracking.tracking_uri")
    _check_family(cfg)
    iirc = cfg.scenario.family == "iirc"
    fluid = cfg.scenario.family == "fluid"
    cfsl = cfg.scenario.family == "cfsl"
    increments = () if iirc else tuple(cfg.scenario.increment_list)
    tuning, evaluation = (_stored_at_pipeline_size(cfg, p) for p in _phase_classes(cfg))
    pretraining = _check_pretrain(cfg, (tuning, evaluation))  # first: it refuses weights given beside it
    _check_weights(cfg, (tuning, evaluation))
    if iirc:
        increments = _check_iirc(cfg, tuning, evaluation)
    if fluid:
        _check_fluid(cfg, tuning, evaluation, pretraining)
    if cfsl:
        _check_cfsl(cfg, tuning, evaluation)
    for phase in (tuning, evaluation) if not (iirc or fluid or cfsl) else ():
        if sum(increments) != len(phase.classes):
            own = "tuning" if phase.phase == "tune" else "evaluation"
            field = "datasets.split" if cfg.datasets.split else f"datasets.{own}"
            if cfg.scenario.family == "class_incremental":
                raise ConfigError("scenario.increments", f"sum to {sum(increments)} classes but the {phase.phase} "
                                  f"phase has {len(phase.classes)} ({phase.dataset}); change the increments or "
                                  f"restrict the classes in {field}")
            raise ConfigError(f"scenario.{cfg.scenario.family}", f"its sessions take {sum(increments)} classes "
                              f"({'+'.join(map(str, increments))}) but the {phase.phase} phase has "
                              f"{len(phase.classes)} ({phase.dataset}); change base_classes, ways or sessions, or "
                              f"restrict the classes in {field}")
    if cfg.search.fidelity == "tasks" and cfg.scenario.family != "class_incremental":
        raise ConfigError("search.fidelity", f"tasks reports a score after each task of a class-incremental "
                          f"ordering; the {cfg.scenario.family} family reports after each ordering: use orderings")
    if cfg.search.protocol == "first_task":
        if cfg.scenario.family != "class_incremental":
            raise ConfigError("search.protocol", f"first_task compares sets on the first tasks of a class-incremental "
                              f"scenario; the {cfg.scenario.family} family has its own sessions, use gtep")
        if cfg.search.protocol_tasks >= len(increments):
            raise ConfigError("search.protocol_tasks", f"{cfg.search.protocol_tasks} is not below the scenario's "
                              f"{len(increments)} tasks; first_task compares sets on fewer tasks than the whole")
    space_path = cfg.search.space or default_space_file(cfg.algorithm)
    try:
        space = load_space(cfg.algorithm, space_path)
    except SearchSpaceError as err:
        raise ConfigError("search.space", str(err)) from None
    _check_first_task_sets_differ(cfg, space.space.sets)
    return ResolvedExperiment(cfg, increments, tuning, evaluation, Path(space_path), pretraining)
