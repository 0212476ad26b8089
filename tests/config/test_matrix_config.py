"""The matrix file (gtep/matrix.py): cells as the product of algorithms, scenarios and pairings, layered fields,
scenario shapes, and one clear error naming the cell and the field before anything is written."""
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from gtep.cli import app
from gtep.config import ConfigError
from gtep.matrix import (
    ScenarioShape,
    cell_keys,
    expand_cells,
    load_matrix_preset,
    matrix_preset_names,
    parse_matrix,
    resolve_cells,
)
from gtep.spaces import load_space

runner = CliRunner()
SHARED = Path(__file__).resolve().parents[3] / "shared" / "data"


def doc(**changes) -> dict:
    data = {
        "matrix": "mx",
        "algorithms": ["replay", "icarl"],
        "scenarios": {"3tasks": "4x3"},
        "pairings": {
            "split": {"similarity": "high",
                      "datasets": {"split": {"dataset": "synthetic:classes=30,train=4,test=2",
                                             "classes_per_phase": 12}}},
            "two": {"similarity": "low",
                    "datasets": {"tuning": {"dataset": "synthetic:classes=12,train=4,test=2,seed=1"},
                                 "evaluation": {"dataset": "synthetic:classes=12,train=4,test=2,seed=2"}}},
        },
        "base": {"backbone": "resnet8", "search": {"trials": 2, "orderings": 2}, "training": {"epoch_scale": 0.02}},
    }
    data.update(changes)
    return data


def refused(data: dict, output: Path) -> ConfigError:
    with pytest.raises(ConfigError) as caught:
        resolve_cells(parse_matrix(data, "test"), output)
    assert not output.exists(), "a refused matrix writes nothing"
    return caught.value


def test_cells_are_the_product_with_their_folders_store_and_tags(tmp_path):
    cells = expand_cells(parse_matrix(doc(), "test"), tmp_path / "out")
    assert [c.name for c in cells] == ["mx-replay-3tasks-split", "mx-icarl-3tasks-split",
                                       "mx-replay-3tasks-two", "mx-icarl-3tasks-two"]
    root = (tmp_path / "out" / "mx").resolve()
    assert {c.config.study_dir for c in cells} == {root / c.name for c in cells}
    assert {c.config.tracking_uri for c in cells} == {f"sqlite:///{root}/mlflow.db"}
    two = cells[3]
    assert two.tags == {"gtep.matrix": "mx", "gtep.cell": "mx-icarl-3tasks-two", "gtep.scenario": "3tasks",
                        "gtep.pairing": "two", "gtep.similarity": "low"}
    assert two.config.algorithm == "icarl" and two.config.datasets.tuning.dataset.endswith("seed=1")
    assert not (tmp_path / "out").exists()


def test_fields_layer_base_then_pairing_then_algorithm_then_command_line(tmp_path):
    data = doc(algorithm_overrides={"icarl": {"backbone": "resnet20", "training": {"memory_size": 30}}})
    data["pairings"]["two"]["overrides"] = {"training": {"memory_size": 20}, "search": {"trials": 3}}
    cells = {c.name: c.config for c in expand_cells(parse_matrix(data, "test"), tmp_path,
                                                    {"search.orderings": 3, "search.trials": None})}
    assert cells["mx-replay-3tasks-split"].training.memory_size == 1000  # the default
    assert cells["mx-replay-3tasks-two"].training.memory_size == 20
    assert cells["mx-icarl-3tasks-two"].training.memory_size == 30
    assert cells["mx-icarl-3tasks-two"].backbone == "resnet20" and cells["mx-replay-3tasks-two"].backbone == "resnet8"
    assert all(c.training.epoch_scale == 0.02 for c in cells.values()), "a partial block keeps the base's fields"
    assert cells["mx-replay-3tasks-two"].search.trials == 3 and cells["mx-replay-3tasks-split"].search.trials == 2
    assert {c.search.orderings for c in cells.values()} == {3}


def test_a_scenario_shape_is_filled_with_each_pairings_class_count(tmp_path):
    assert ScenarioShape(tasks=10).increments(100) == [10] * 10
    assert ScenarioShape(tasks=10).increments(50) == [5] * 10
    assert ScenarioShape(tasks=6, first="half").increments(100) == [50] + [10] * 5  # paper Table 1
    assert ScenarioShape(tasks=6, first="half").increments(50) == [25] + [5] * 5
    data = doc(scenarios={"half": {"tasks": 3, "first": "half"}})
    data["pairings"]["two"]["datasets"] = {"tuning": {"dataset": "synthetic:classes=20,train=4,test=2,seed=1"},
                                           "evaluation": {"dataset": "synthetic:classes=20,train=4,test=2,seed=2"}}
    cells = {c.cell.name: c for c in resolve_cells(parse_matrix(data, "test"), tmp_path / "out")}
    assert cells["mx-replay-half-split"].resolved.increments == (6, 3, 3)
    assert cells["mx-replay-half-two"].resolved.increments == (10, 5, 5)
    assert cells["mx-replay-half-two"].cell.config.scenario.increments == "C10xT1+C5xT2"
    data["scenarios"] = {"half": {"tasks": 4, "first": "half"}}
    err = refused(data, tmp_path / "out")
    assert err.field == "scenarios.half" and "(cell mx-replay-half-two)" in str(err)
    assert "20 classes cannot be cut into half of them first, then 3 equal tasks" in str(err)


def test_an_unknown_algorithm_is_one_error_naming_its_cell(tmp_path):
    err = refused(doc(algorithms=["replay", "nosuch"]), tmp_path / "out")
    assert err.field == "algorithms"
    assert "unknown algorithm 'nosuch'" in str(err) and "cell mx-nosuch-3tasks-split" in str(err)


def test_increments_that_do_not_sum_in_one_pairing_name_the_scenario_and_the_cell(tmp_path):
    data = doc()
    data["pairings"]["big"] = {"similarity": "high",
                               "datasets": {"split": {"dataset": "synthetic:classes=30,train=4,test=2",
                                                      "classes_per_phase": 14}}}
    err = refused(data, tmp_path / "out")
    assert err.field == "scenarios.3tasks"
    assert "sum to 12 classes but the tune phase has 14" in str(err) and "cell mx-replay-3tasks-big" in str(err)


def test_overlapping_phases_name_the_pairing_field_and_the_cell(tmp_path):
    data = doc()
    data["pairings"]["overlap"] = {"similarity": "low", "datasets": {
        "tuning": {"dataset": "synthetic:classes=30,train=4,test=2", "classes": list(range(12))},
        "evaluation": {"dataset": "synthetic:classes=30,train=4,test=2", "classes": list(range(6, 18))}}}
    err = refused(data, tmp_path / "out")
    assert err.field == "pairings.overlap.datasets.evaluation.classes"
    assert "shares 6 classes" in str(err) and "cell mx-replay-3tasks-overlap" in str(err)


def test_a_bad_layer_value_names_the_layer_it_came_from(tmp_path):
    data = doc(algorithm_overrides={"icarl": {"search": {"trials": 0}}})
    err = refused(data, tmp_path / "out")
    assert err.field == "algorithm_overrides.icarl.search.trials" and "cell mx-icarl-3tasks-split" in str(err)
    err = refused(doc(base={"backbone": "nosuchnet"}), tmp_path / "out")
    assert err.field == "base.backbone"


@pytest.mark.parametrize("change, field", [
    (lambda d: d["pairings"]["two"].update(foo=1), "pairings.two.foo"),
    (lambda d: d.update(base={"study": "x"}), "base.study"),
    (lambda d: d["pairings"]["split"].update(similarity="low"), "pairings.split.similarity"),
    (lambda d: d.update(algorithms=["replay", "replay"]), "algorithms"),
    (lambda d: d.update(algorithm_overrides={"wa": {"seed": 1}}), "algorithm_overrides.wa"),
    (lambda d: d["pairings"]["two"].update(overrides={"tracking": {"output": "x"}}), "pairings.two.overrides.tracking"),
    (lambda d: d.update(scenarios={"bad": "4y3"}), "scenarios.bad"),
    (lambda d: d.update(scenarios={"bad": {"tasks": 1}}), "scenarios.bad.tasks"),
    (lambda d: d.update(protocol="tuned"), "protocol"),
    (lambda d: d.pop("pairings"), "pairings"),
])
def test_file_errors_name_the_field(change, field):
    data = doc()
    change(data)
    with pytest.raises(ConfigError) as caught:
        parse_matrix(data, "test")
    assert caught.value.field == field, str(caught.value)


def test_the_command_line_refuses_a_bad_matrix_before_any_compute(tmp_path):
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump(doc(algorithms=["replay", "nosuch"])))
    result = runner.invoke(app, ["matrix", "--config", str(path), "--output", str(tmp_path / "out")])
    assert result.exit_code == 2
    assert "algorithms: unknown algorithm 'nosuch'" in result.stderr and "mx-nosuch-3tasks-split" in result.stderr
    assert not (tmp_path / "out").exists()


def test_check_lists_the_cells_and_writes_nothing(tmp_path):
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump(doc()))
    result = runner.invoke(app, ["matrix", "--config", str(path), "--output", str(tmp_path / "out"), "--check"],
                           env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    assert "4 cells, all valid" in result.output and "mx-icarl-3tasks-two" in result.output
    assert not (tmp_path / "out").exists()


def test_matrix_presets_are_listed_and_shown():
    assert {"paper-4.1", "small"} <= set(matrix_preset_names())
    result = runner.invoke(app, ["matrices"], env={"COLUMNS": "250"})
    assert result.exit_code == 0 and "paper-4.1" in result.output and "small" in result.output
    shown = runner.invoke(app, ["matrices", "--show", "small"])
    assert shown.exit_code == 0 and yaml.safe_load(shown.output)["matrix"] == "small"


def test_the_paper_preset_is_section_4_1(monkeypatch):
    for name in ("CIFAR100_ROOT", "IMAGENET100_1_ROOT", "IMAGENET100_2_ROOT"):
        monkeypatch.setenv(name, f"/data/{name.lower()}")
    m = load_matrix_preset("paper-4.1")
    assert m.algorithms == ["replay", "icarl", "bic", "wa", "podnet", "der", "foster", "beef", "memo"]
    assert {p: s.similarity for p, s in m.pairings.items()} == {
        "imagenet100": "high", "cifar50": "high", "imagenet50": "high", "cifar50-imagenet50": "low",
        "imagenet50-cifar50": "low"}
    assert m.scenarios == {"10tasks": ScenarioShape(tasks=10), "6tasks": ScenarioShape(tasks=6, first="half")}
    assert len(cell_keys(m)) == 90 and m.original and m.base.search == {"trials": 30, "orderings": 5}
    tuning = m.pairings["cifar50-imagenet50"].datasets.tuning
    assert tuning.dataset == "cifar100:/data/cifar100_root" and len(tuning.classes) == 50


@pytest.mark.skipif(not (SHARED / "tinyimagenet200_32.npz").exists(), reason="../shared/data is not there")
def test_the_small_preset_resolves_on_the_shared_files(monkeypatch, tmp_path):
    monkeypatch.setenv("TINYIMAGENET_NPZ", str(SHARED / "tinyimagenet200_32.npz"))
    monkeypatch.setenv("OMNIGLOT_NPZ", str(SHARED / "omniglot_small_32.npz"))
    m = load_matrix_preset("small")
    cells = resolve_cells(m, tmp_path / "out")
    assert len(cells) == 6 and m.original and m.algorithms == ["replay", "icarl"]
    assert {c.cell.similarity for c in cells} == {"high", "low"}
    for c in cells:
        assert c.resolved.increments == (4, 4, 4) and c.resolved.config.backbone == "resnet8"
        assert "original" in load_space(c.cell.algorithm, c.resolved.space_path).presets
    low = next(c for c in cells if c.cell.pairing == "tiny-omniglot")
    assert "tinyimagenet" in low.resolved.tuning.dataset and "omniglot" in low.resolved.evaluation.dataset
    assert not (tmp_path / "out").exists()


def test_a_family_scenario_section_and_pretrain_reach_every_cell_as_an_experiment_file_writes_them(tmp_path):
    fluid = {"family": "fluid", "fluid": {"pretrain_classes": [0, 1, 2, 3], "n_pretrain_classes": 2,
                                          "n_novel_classes": 4, "total_samples": 40, "per_class_cap": 10,
                                          "zipf_s": 1.0, "head_cut": 2, "window": 10}}
    data = doc(algorithms=["fluid_ncm", "fluid_finetune"], scenarios={"stream": fluid},
               base={"backbone": "resnet8", "search": {"trials": 2, "orderings": 2},
                     "pretrain": {"classes": [0, 1, 2, 3], "epochs": 2}},
               algorithm_overrides={"fluid_finetune": {"pretrain": {"epochs": 3}}})
    cells = expand_cells(parse_matrix(data, "test"), tmp_path / "out")
    assert {c.config.scenario.family for c in cells} == {"fluid"}
    assert all(c.config.scenario.fluid.total_samples == 40 for c in cells)
    epochs = {c.algorithm: c.config.pretrain.epochs for c in cells}
    assert epochs == {"fluid_ncm": 2, "fluid_finetune": 3}


def test_a_bad_option_of_a_family_scenario_names_the_matrix_scenario_and_the_cell(tmp_path):
    data = doc(scenarios={"stream": {"family": "fluid", "fluid": {"total_samples": 40}}})
    with pytest.raises(ConfigError) as caught:
        expand_cells(parse_matrix(data, "test"), tmp_path / "out")
    assert caught.value.field.startswith("scenarios.stream.fluid.")  # the missing option, by its path
    assert "(cell mx-replay-stream-split)" in str(caught.value)
