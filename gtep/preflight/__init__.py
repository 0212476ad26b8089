"""The pre-flight pass, before any compute: `checks` (config, data, files, paths and device: `preflight` and the
study's plan) and `calibration` (`gtep check --calibrate`: trial slots, a learner timed as a trial runs it, the
estimates). The names callers use are here; each module says the rest."""
from gtep.preflight.calibration import (
    Calibration,
    FlowCalibration,
    PretrainEstimate,
    TrialSlots,
    calibrate,
    calibrate_flow,
    compute_estimate,
    compute_flow_estimate,
    estimate,
    image_epochs,
    no_estimate_reason,
    pretrain_estimate,
    sampled_params,
    trial_slots,
)
from gtep.preflight.checks import (
    PhasePlan,
    StudyPlan,
    check_device,
    check_fusion,
    check_learner_limits,
    check_phases,
    check_pretrain_data,
    check_space_values,
    check_study_path,
    check_weights_fit,
    plan_summary,
    preflight,
)

__all__ = ["Calibration", "FlowCalibration", "PhasePlan", "PretrainEstimate", "StudyPlan", "TrialSlots", "calibrate",
           "calibrate_flow", "check_device", "check_fusion", "check_learner_limits", "check_phases",
           "check_pretrain_data", "check_space_values", "check_study_path", "check_weights_fit", "compute_estimate",
           "compute_flow_estimate", "estimate", "image_epochs", "no_estimate_reason", "plan_summary", "preflight",
           "pretrain_estimate", "sampled_params", "trial_slots"]
