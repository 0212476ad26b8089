"""The experiment file's schema: ExperimentConfig and its sections (the scenario's are in gtep.config.scenario),
and `_validate`, which turns data into a config or one ConfigError naming the first bad field."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from gtep.config.base import ConfigError, _Strict
from gtep.config.scenario import OPTION_PROBLEM, ScenarioSpec
from gtep.config.uris import check_no_userinfo


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
                         f"{', '.join(names)} (docs/datasets.md: Data pipelines)")
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
    # Rehearse a GPU cluster on CPUs: a trial whose GPUs (Ray's logical ones, `ray start --num-gpus 8`) torch cannot
    # see trains on the CPU and records their ids; off, such a trial stops with an error (docs/cluster.md)
    simulate_gpus: bool = False
    # Train a trial's orderings as one fused network (gtep/engine/fusion.py, docs/speed.md): off, on (refused for a
    # learner that does not opt in), auto (on where the learner opts in, on a GPU, with orderings one at a time)
    fuse_orderings: Literal["off", "on", "auto"] = "off"

    @field_validator("fuse_orderings", mode="before")
    @classmethod
    def _yaml_on_off(cls, value: Any) -> Any:
        """YAML 1.1 reads an unquoted on/off as true/false: they mean on and off here."""
        return {True: "on", False: "off"}.get(value, value) if isinstance(value, bool) else value

    @model_validator(mode="after")
    def _simulated_gpus_are_asked_for(self) -> "ComputeSpec":
        if self.simulate_gpus and not self.gpus_per_trial:
            raise ValueError("simulate_gpus is true but gpus_per_trial is 0, so no trial is given a GPU to simulate; "
                             "set gpus_per_trial (e.g. 0.25) or leave simulate_gpus out")
        return self

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

    @field_validator("tracking_uri")
    @classmethod
    def _no_password(cls, value: str | None) -> str | None:
        """The address is recorded in the manifest and MLflow: never with a password (gtep.config.uris). Every
        config goes through here: a file, its ${VAR}s, a preset, a manifest read back, the API and the CLI."""
        if value is not None:
            try:
                check_no_userinfo(value, "tracking.tracking_uri")
            except ConfigError as err:
                raise ValueError(err.reason) from None
        return value

    @field_validator("output", mode="before")
    @classmethod
    def _not_empty(cls, value: Any) -> Any:
        """'' reads as Path('.'): the study's files would land in the current folder among the user's own."""
        if isinstance(value, str) and not value.strip():
            raise ValueError("is empty, which would write the study into the current folder; give a folder "
                             "(e.g. output: gtep-runs), or leave the key out for ./gtep-runs")
        return value


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
    # supervised (cross-entropy with a linear head) or protonet (episodic meta-training, gtep.engine.pretrain)
    method: Literal["supervised", "protonet"] = "supervised"
    ways: int = Field(30, ge=2)  # protonet's episodes (FLUID's 30-way 5-shot)
    shots: int = Field(5, ge=1)
    queries: int = Field(5, ge=1)

    @model_validator(mode="after")
    def _classes_or_groups(self) -> "PretrainSection":
        if self.classes is not None and self.groups is not None:
            raise ValueError("give either 'classes' or 'groups' to pretrain on (kept out of both phases), not both")
        if self.classes is None and self.groups is None and self.dataset is None:
            raise ValueError("give the 'classes' or 'groups' to pretrain on (kept out of both phases), or a "
                             "'dataset' of its own to pretrain on all its classes")
        return self


EVALUATION_SETS = ("best", "all")


class EvaluationSpec(_Strict):
    """What the evaluation phase trains on D^E: H* alone (the protocol), or every tuned set as well, so that each
    set's evaluation score is known (how well tuning ranks the sets, and each cheaper protocol's regret)."""

    sets: Literal["best", "all"] = "best"

    @field_validator("sets", mode="before")
    @classmethod
    def _known_choice(cls, value: Any) -> Any:
        if value not in EVALUATION_SETS:
            raise ValueError(f"{value!r} is not a choice; use best (H* alone, the protocol) or all (every tuned set "
                             "too, for the sets' rank correlation and the protocols' regret)")
        return value


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
    evaluation: EvaluationSpec = EvaluationSpec()
    seed: int = Field(0, ge=0)  # numpy seeds are non-negative

    @model_validator(mode="before")
    @classmethod
    def _one_memory_budget(cls, data: Any) -> Any:
        """A family option that is the whole replay budget (ScenarioFamily.memory_budget_option: IIRC's
        memory_per_class), when given, makes a training.memory_size left out 0, not the fixed total's default (the
        family's layout check refuses a memory_size given beside it). Written into the data, so a config dumped
        and read again (a manifest, command-line overrides) means the same."""
        from gtep.protocol.families import FAMILIES

        scenario = data.get("scenario") if isinstance(data, dict) else None
        name = scenario.get("family") if isinstance(scenario, dict) else None
        if not isinstance(scenario, dict) or not isinstance(name, str) or name not in FAMILIES:
            return data
        family = FAMILIES.get(name)
        section = scenario.get(family.section) if family.section else None
        option = family.memory_budget_option
        if option is None or not isinstance(section, dict) or section.get(option) is None:
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


NAME_RULE = "start with a letter or digit and use only letters, digits, '_', '.' and '-'"


def _validate(data: dict[str, Any], source: str) -> ExperimentConfig:
    try:
        return ExperimentConfig.model_validate(data)
    except ValidationError as err:
        first = err.errors()[0]
        field = ".".join(str(p) for p in first["loc"] if not str(p).startswith("function-")) or "config"
        message = first["msg"]
        if first["type"] == OPTION_PROBLEM:  # a family's option_problems name the field at fault
            field = first.get("ctx", {}).get("field", field)
        elif first["type"] == "extra_forbidden":
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
