"""The experiment file: one YAML validated by pydantic, then resolved against the registries and the data.

Validation happens in two steps, both before any compute: `load_config` checks the file's shape and
types; `resolve` checks the names (algorithm, backbone, datasets, search space) and the protocol's
constraints (increments sum to each phase's classes; the phases share no class). Every failure is one
ConfigError naming the field and the fix.

The modules, each importing only those listed before it:

    base           ConfigError, and the strict model base of every section
    scenario       the scenario section: the family and each family's section, built from its Options
    schema         ExperimentConfig and its other sections; `_validate` (data -> config or one ConfigError)
    files          experiment YAML files, presets, configs from data, recorded configs' added defaults
    phases         each phase's dataset and classes, the weights and the pretrain section against the data
    checks         the device, the output folder and the tracking store
    family_checks  checks across sections: the family's criterion and algorithm, each family's needs
    resolution     `resolve` and the ResolvedExperiment it returns

Importers take every name from `gtep.config`.
"""
from gtep.config.base import ConfigError
from gtep.config.checks import (
    TRACKING_SCHEMES,
    check_device,
    check_output,
    check_port,
    check_store_file,
    check_tracking_uri,
)
from gtep.config.files import (
    ADDED_SEARCH_FIELDS,
    _expand_env,
    load_config,
    load_preset,
    preset_names,
    preset_text,
    read_yaml,
    validate_config,
    with_added_defaults,
)
from gtep.config.phases import PhaseSpec, PretrainPlan, _phase_classes, check_weights_file, phase_pipeline
from gtep.config.resolution import ResolvedExperiment, resolve
from gtep.config.scenario import SECTIONS, ScenarioSpec, section_model
from gtep.config.schema import (
    NAME_RULE,
    PRUNERS,
    ComputeSpec,
    DatasetsSpec,
    ExperimentConfig,
    FirstTaskConfig,
    PhaseDataset,
    PipelineName,
    PretrainSection,
    PrunerOptions,
    SchedulerOptions,
    SearchSpec,
    SplitSpec,
    TrackingSpec,
    TrainingSpec,
    _validate,
)

__all__ = [
    "ADDED_SEARCH_FIELDS", "NAME_RULE", "PRUNERS", "SECTIONS", "TRACKING_SCHEMES",
    "ComputeSpec", "ConfigError", "DatasetsSpec", "ExperimentConfig", "FirstTaskConfig",
    "PhaseDataset", "PhaseSpec", "PipelineName", "PretrainPlan", "PretrainSection",
    "PrunerOptions", "ResolvedExperiment", "ScenarioSpec", "SchedulerOptions", "SearchSpec", "SplitSpec",
    "TrackingSpec", "TrainingSpec",
    "check_device", "check_output", "check_port", "check_store_file", "check_tracking_uri", "check_weights_file",
    "load_config", "load_preset",
    "phase_pipeline", "preset_names", "preset_text", "read_yaml", "resolve", "section_model", "validate_config",
    "with_added_defaults",
    # private, for gtep.matrix and the tests
    "_expand_env", "_phase_classes", "_validate",
]
