"""The scenario section: the family, and each family's own section (fscil, iirc, fluid, cfsl) with its checks."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from gtep.config.base import _Strict
from gtep.protocol.scenarios import parse_increments


class FscilSpec(_Strict):
    """scenario.fscil: few-shot class-incremental sessions (papers/fscil-gacc.txt; gtep/protocol/families/)."""

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
    """scenario.iirc: Incremental Implicitly-Refined Classification (gtep/protocol/families/iirc/).
    The phase's
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
        from gtep.protocol.families.iirc import GROUPS

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
    """scenario.cfsl: continual few-shot tasks (gtep/protocol/families/cfsl/generator.py, the CFSL spec's
    Algorithm 1); an ordering
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

    from gtep.protocol.families.iirc import parse_hierarchy

    try:
        return parse_hierarchy(json.loads(path.read_text()))
    except (ValueError, TypeError, AttributeError, OSError) as err:
        raise ValueError(f"{path} is not a hierarchy file ({err})") from None


class FluidSpec(_Strict):
    """scenario.fluid: FLUID's open-world stream (papers/fluid.txt; gtep/protocol/families/fluid/__init__.py)."""

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
    # gtep/protocol/families/: class_incremental (the paper's; needs increments), fscil (needs the fscil
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
            from gtep.protocol.families.cfsl.generator import CfslOptions

            return CfslOptions.of(self.family_options).describe()
        increments = self.increments
        text = increments if isinstance(increments, str) else "+".join(map(str, increments or []))
        return text if self.family == "class_incremental" else f"{self.family} {text}"
