"""The scenario-family contract, run against every registered family (as Optuna's sampler tests run every
sampler): the abstract base's methods all implemented, options as a dataclass schema, a well-formed metric table
that the criterion, tables and report can read, checks that refuse a class without images with a Problem naming a
field, a description `gtep check` can print, an engine flow for its data, a learner that can learn from it, and
no NotImplementedError anywhere in the family's folder. A new family passes it by being registered."""
import dataclasses
import inspect
from pathlib import Path

import pytest

from gtep.algorithms import ALGORITHMS
from gtep.engine.flows import FLOWS
from gtep.protocol.criteria import CRITERIA
from gtep.protocol.families import FAMILIES, PhaseData, ScenarioFamily

NAMES = sorted(FAMILIES)
UNITS = {"percent", "ratio", "count"}


def family(name: str) -> ScenarioFamily:
    return FAMILIES.get(name)


def phase_of(f: ScenarioFamily, phase: str, train: int = 40, test: int = 20, starve: bool = False) -> PhaseData:
    """A phase with the classes the family's example options ask for, `train` and `test` images each (the first
    class none with `starve`), and its data classes (FLUID's pretrain classes) beside them."""
    options = f.example_options()
    extra = f.data_classes(options)
    classes = tuple(int(c) for c in options.get("classes", range(sum(f.increments(options)))) if c not in extra)
    train_counts = {c: train for c in (*classes, *extra)}
    test_counts = {c: test for c in (*classes, *extra)}
    if starve:
        train_counts[classes[0]] = test_counts[classes[0]] = 0
    return PhaseData(phase, "synthetic", classes, train_counts, test_counts)


def test_every_family_of_gtep_is_registered():
    assert {"class_incremental", "fscil", "iirc", "fluid", "cfsl"} <= set(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_the_family_implements_every_method_of_the_base(name):
    f = family(name)
    assert isinstance(f, ScenarioFamily) and not getattr(type(f), "__abstractmethods__", frozenset())
    for attribute in ("name", "description", "data_flow", "Options", "metrics", "default_criterion"):
        assert getattr(f, attribute, None), attribute
    assert f.name == name and f.description


@pytest.mark.parametrize("name", NAMES)
def test_options_are_a_dataclass_schema_that_reads_the_example(name):
    f = family(name)
    assert dataclasses.is_dataclass(f.Options)
    assert isinstance(f.options(f.example_options()), f.Options)
    increments = f.increments(f.example_options())
    assert increments and all(isinstance(n, int) and n > 0 for n in increments)


@pytest.mark.parametrize("name", NAMES)
def test_the_metric_table_is_well_formed(name):
    f = family(name)
    names = [m.name for m in f.metrics]
    assert len(names) == len(set(names)), "a metric listed twice"
    assert all(m.label and m.unit in UNITS for m in f.metrics)
    # the class-incremental names every table, score and MLflow view reads
    assert {"acc", "avg_acc"} <= set(f.metric_names) and "acc_t" in f.curve_metrics
    assert set(f.headline) <= set(f.metric_names)
    criterion = CRITERIA.get(f.default_criterion)
    selectable = {m.name for m in f.metrics if m.selectable and not m.curve}
    assert set(criterion.components) <= selectable, "H*'s default criterion reads a metric it cannot select by"


def test_a_metric_name_means_one_thing_in_every_family():
    seen = {}
    for name in NAMES:
        for metric in family(name).metrics:
            kind = (metric.unit, metric.curve, metric.first_step)
            assert seen.setdefault(metric.name, kind) == kind, f"{metric.name} differs in {name}"


@pytest.mark.parametrize("name", NAMES)
def test_check_passes_fed_data_and_names_the_field_of_a_class_without_images(name):
    f = family(name)
    options = f.example_options()
    assert f.check([phase_of(f, "tune"), phase_of(f, "evaluate")], options) == []
    problems = f.check([phase_of(f, "tune"), phase_of(f, "evaluate", starve=True)], options)
    assert problems, "a class without any image passed the family's check"
    assert all(p.field and p.message and p.phase == "evaluate" for p in problems)


@pytest.mark.parametrize("name", NAMES)
def test_describe_says_what_ordering_0_holds(name):
    f = family(name)
    described = f.describe(phase_of(f, "tune"), f.example_options(), seed=0)
    assert described and all(isinstance(what, str) and what and images >= 0 for what, images in described)


@pytest.mark.parametrize("name", NAMES)
def test_an_engine_flow_runs_the_family_and_some_learner_can_learn_from_it(name):
    f = family(name)
    assert f.data_flow in FLOWS
    assert any(f.data_flow in ALGORITHMS.get(a).data_flows for a in ALGORITHMS.names())


@pytest.mark.parametrize("name", NAMES)
def test_no_not_implemented_error_in_the_familys_folder(name):
    folder = Path(inspect.getfile(type(family(name)))).parent
    for source in folder.glob("*.py"):
        assert "NotImplementedError" not in source.read_text(), source
