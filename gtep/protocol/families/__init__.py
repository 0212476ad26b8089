"""Scenario families, one folder each (class_incremental, fscil, iirc, fluid, cfsl), on the contract of base.py.

Importing this package registers every family of gtep in FAMILIES; a plugin's family registers when its module is
imported (gtep/plugins.py: entry points, or GTEP_PLUGINS). Everything a family is lives in its folder: its options,
generator, metric table, checks and description.
"""
from __future__ import annotations

# the families of gtep register on import (after the base's names exist: each imports only from base)
from gtep.protocol.families import cfsl, class_incremental, fluid, fscil, iirc  # noqa: E402,F401
from gtep.protocol.families.base import (
    ACC,
    ACC_T,
    AVG_ACC,
    CLASS_INCREMENTAL,
    FAMILIES,
    FamilyOptions,
    Metric,
    PhaseData,
    PhaseLayout,
    Problem,
    ScenarioFamily,
    StudyLayout,
    TaskFamily,
    Unit,
    add_aliases,
    curve,
    empty_classes,
    family_of,
    known_metrics,
    metric_label,
    register_family,
)

__all__ = ["ACC", "ACC_T", "AVG_ACC", "CLASS_INCREMENTAL", "FAMILIES", "FamilyOptions", "Metric", "PhaseData",
           "PhaseLayout", "Problem", "ScenarioFamily", "StudyLayout", "TaskFamily", "Unit", "add_aliases", "curve",
           "empty_classes", "family_of", "known_metrics", "metric_label", "register_family"]
