"""Issue 45, item 8: every learner's numeric hyperparameters declare their valid ranges, and the pre-flight pass
(`gtep check`, and every command that trains) refuses a search space with a value outside them, or one that can
draw a combination its learner refuses (L2P's top_k above pool_size), before any compute and writing nothing."""
from __future__ import annotations

import dataclasses
import types
import typing
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from gtep.algorithms import ALGORITHMS
from gtep.algorithms.base import Range
from gtep.config import ConfigError
from gtep.config.files import preset_text
from gtep.preflight import check_space_values
from gtep.spaces import default_space_file
from tests.cli.test_cli_errors import Inputs, invoke, sandbox  # noqa: F401 - the fixture

NUMBERS = (int, float)


def numeric(hint: typing.Any) -> bool:
    """int or float, or a tuple of them, optionally with None (milestones, ridge candidates, prompt layers)."""
    if hint in NUMBERS:
        return True
    args = [a for a in typing.get_args(hint) if a is not type(None) and a is not Ellipsis]
    origin = typing.get_origin(hint)
    if origin is tuple:
        return bool(args) and all(a in NUMBERS for a in args)
    return origin in (typing.Union, types.UnionType) and any(numeric(a) for a in args)


@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS.names()))
def test_every_numeric_hyperparameter_declares_a_range(algorithm):
    """A new learner cannot forget one: every int, float or tuple-of-numbers field has a range, every range names a
    field, and every default is inside its own range."""
    params = ALGORITHMS.get(algorithm).Params
    hints = typing.get_type_hints(params)
    fields = {f.name: f for f in dataclasses.fields(params)}
    ranges = params.value_ranges()
    missing = [name for name in fields if numeric(hints[name]) and name not in ranges]
    assert not missing, f"{params.__name__} declares no range for {missing}: add them to its `ranges`"
    assert not set(ranges) - set(fields), f"{params.__name__}.ranges names no field: {set(ranges) - set(fields)}"
    bad_defaults = [params.range_problem(name, f.default) for name, f in fields.items()
                    if f.default is not dataclasses.MISSING and params.range_problem(name, f.default)]
    assert not bad_defaults, bad_defaults


def test_the_walk_sees_the_family_learners_and_the_parameters_the_issue_names():
    names = set(ALGORITHMS.names())
    assert {"iirc_agem", "fluid_ncm", "cfsl_protonet", "cec", "l2p"} <= names
    assert str(ALGORITHMS.get("iirc_agem").Params.value_ranges()["memory_batch_size"]) == ">= 1"
    assert str(ALGORITHMS.get("replay").Params.value_ranges()["lr"]) == "> 0"


def test_range_bounds_and_text():
    unit_open = Range(0, 1, low_open=True, high_open=True)
    assert 0.5 in unit_open and 0 not in unit_open and 1 not in unit_open and float("nan") not in unit_open
    assert True not in Range(0) and "1" not in Range(0)  # a bool or a string is no number
    assert 1 in Range(0, 1) and str(Range(0, 1)) == "in [0, 1]" and str(unit_open) == "in (0, 1)"


@pytest.mark.parametrize("algorithm", sorted(n for n in ALGORITHMS.names() if default_space_file(n).exists()))
def test_every_shipped_space_passes(algorithm):
    check_space_values(SimpleNamespace(config=SimpleNamespace(algorithm=algorithm),
                                       space_path=default_space_file(algorithm)))


def space_check(tmp_path: Path, algorithm: str, text: str) -> ConfigError:
    path = tmp_path / "space.yaml"
    path.write_text(text)
    resolved = SimpleNamespace(config=SimpleNamespace(algorithm=algorithm), space_path=path)
    with pytest.raises(ConfigError) as err:
        check_space_values(resolved)
    return err.value


def test_a_preset_outside_a_range_and_a_drawable_conflict_are_refused(tmp_path):
    space = "algorithm: replay\nspace: {lr: [0.1]}\npresets:\n  original: {lr: 0.1, momentum: 1.5}\n"
    said = str(space_check(tmp_path, "replay", space))
    assert "in presets.original," in said and "momentum=1.5" in said and "in [0, 1)" in said
    # each value is in its range, but the space can draw top_k 12 with pool_size 10: both named
    said = str(space_check(tmp_path, "l2p", "algorithm: l2p\nspace: {pool_size: [10, 20], top_k: [2, 12]}\n"))
    assert "top_k=12 and pool_size=10 conflict" in said and "lower top_k or raise pool_size" in said
    said = str(space_check(tmp_path, "coda_prompt", "algorithm: coda_prompt\nspace: {prompt_length: [4, 6, 7]}\n"))
    assert "prompt_length=7" in said and "even" in said


def test_from_mapping_refuses_what_the_space_check_refuses():
    """Params built from a set (a worker's, or --best's) refuse the same values, naming the field and range."""
    agem = ALGORITHMS.get("iirc_agem").Params
    with pytest.raises(ValueError, match=r"memory_batch_size=0 is outside its range: memory_batch_size must be >= 1"):
        agem.from_mapping({"memory_batch_size": 0})
    with pytest.raises(ValueError, match="top_k=6 and pool_size=4 conflict"):
        ALGORITHMS.get("dualprompt").Params.from_mapping({"pool_size": 4, "top_k": 6})
    assert agem.from_mapping({"memory_batch_size": 1}).memory_batch_size == 1


def iirc_agem_config(inputs: Inputs, space: str) -> str:
    """The shipped omniglot-iirc preset run with A-GEM and the given search space."""
    doc = yaml.safe_load(preset_text("omniglot-iirc"))
    doc["algorithm"] = "iirc_agem"
    doc["search"]["space"] = inputs.text("agem-space.yaml", space)
    return inputs.yaml(doc)


AGEM_SPACE = "algorithm: iirc_agem\nspace:\n  lr: [0.5, 1.0]\n  memory_batch_size: {}\n"


@pytest.mark.parametrize("values, needles", [
    # an empty memory batch: A-GEM's projection has no reference gradient, so it trains as fine-tuning
    ("[0, 32]", ["memory_batch_size=0", ">= 1", "agem-space.yaml", "in space.memory_batch_size,"]),
    ("[-4]", ["memory_batch_size=-4", ">= 1"]),
], ids=["empty-memory-batch", "negative-memory-batch"])
def test_check_refuses_a_value_outside_the_learners_range(sandbox, values, needles):  # noqa: F811
    inputs = sandbox[0]
    result = invoke(sandbox, ["check", "-c", iirc_agem_config(inputs, AGEM_SPACE.format(values)),
                              "--output", str(sandbox[2])])
    message = result.stderr.strip()
    assert message.startswith("error: search.space") and len(message.splitlines()) == 1, message
    assert all(n in message for n in needles), message


def test_tune_refuses_a_negative_learning_rate_before_writing(sandbox):  # noqa: F811
    """The class-incremental BASE config (replay) with lr -0.1: `tune` refuses it with nothing written."""
    inputs = sandbox[0]
    config = inputs.space("algorithm: replay\nspace:\n  epochs: [1]\n  lr: [0.1, -0.1]\n")
    message = invoke(sandbox, ["tune", "-c", config]).stderr.strip()
    assert "in space.lr, lr=-0.1 is outside its range" in message and "> 0" in message, message


def test_a_prompt_pool_conflict_names_both_parameters_where_the_network_is_built():
    """Built directly (not from a set), the networks refuse the conflict too, naming top_k and pool_size with their
    values, not as a range of top_k that pool_size sets."""
    from gtep.algorithms.dualprompt import DualPromptNet, DualPromptParams
    from gtep.algorithms.l2p import L2PNet
    from gtep.models.vit import PromptableViT, create_timm_vit
    from tests.helpers import VIT

    vit = PromptableViT(create_timm_vit(VIT))
    with pytest.raises(ValueError, match="top_k=6 and pool_size=4 conflict: .* lower top_k or raise pool_size"):
        L2PNet(vit, 4, 2, 6)
    with pytest.raises(ValueError, match="top_k=3 and pool_size=2 conflict"):
        DualPromptNet(vit, DualPromptParams(pool_size=2, top_k=3))


def test_a_given_h_star_outside_a_range_is_refused_before_compute(tmp_path, monkeypatch):
    """evaluate(best={...}) with a negative lr: refused naming `best`, before
    Ray starts or the study folder is written."""
    import gtep

    monkeypatch.setattr("ray.init", lambda *a, **k: pytest.fail("Ray started"))
    cfg = gtep.experiment(preset="default", output=tmp_path, trials=1, orderings=1)
    with pytest.raises(ConfigError) as err:
        gtep.evaluate(cfg, best={"lr": -0.1, "epochs": 1}, quiet=True)
    assert err.value.field == "best" and "lr=-0.1 is outside its range" in str(err.value)
    assert not any(tmp_path.iterdir())
