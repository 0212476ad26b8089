"""Bad input: one clear error naming the field and the fix, before any compute, leaving nothing behind."""
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from gtep.cli import app

runner = CliRunner()

BASE = {
    "study": "bad-input",
    "algorithm": "replay",
    "backbone": "resnet8",
    "scenario": {"increments": "3x2"},
    "datasets": {"split": {"dataset": "synthetic:classes=12", "classes_per_phase": 6}},
    "search": {"trials": 2, "orderings": 1},
}


def write(tmp_path: Path, doc: dict, name: str = "exp.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(doc))
    return path


def merged(**changes) -> dict:
    doc = yaml.safe_load(yaml.safe_dump(BASE))
    for dotted, value in changes.items():
        node = doc
        *parents, leaf = dotted.split(".")
        for key in parents:
            node = node.setdefault(key, {})
        if value is None:
            node.pop(leaf, None)
        else:
            node[leaf] = value
    return doc


def invoke_bad(tmp_path: Path, args: list[str]) -> str:
    out = tmp_path / "out"
    result = runner.invoke(app, [*args, "--output", str(out)])
    assert result.exit_code == 2, result.output
    message = result.stderr.strip()
    assert message.startswith("error:") and len(message.splitlines()) == 1, message
    assert not out.exists(), "a failed validation must leave nothing in the output folder"
    return message


def space_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "space.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("changes, field, hint", [
    ({"algorithm": "nope"}, "algorithm", "choose from"),
    ({"backbone": "vgg99"}, "backbone", "choose from"),
    ({"datasets.split.dataset": "imaginary"}, "datasets.split.dataset", "unknown dataset"),
    ({"datasets.split.dataset": "npz:/no/such/file.npz"}, "datasets.split.dataset", "does not exist"),
    ({"scenario.increments": "4x2"}, "scenario.increments", "sum to 8"),
    ({"scenario.increments": "three"}, "scenario.increments", "cannot read"),
    ({"search.trials": 0}, "search.trials", "greater than or equal to 1"),
    ({"search.orderings": 0}, "search.orderings", "greater than or equal to 1"),
    ({"colour": "blue"}, "colour", "not a known field"),
])
def test_bad_config_fields(tmp_path, changes, field, hint):
    message = invoke_bad(tmp_path, ["tune", "--config", str(write(tmp_path, merged(**changes)))])
    assert field in message and hint in message


def test_phases_sharing_a_class(tmp_path):
    doc = merged(**{"datasets.split": None})
    doc["datasets"] = {"tuning": {"dataset": "synthetic:classes=12", "classes": [0, 1, 2, 3, 4, 5]},
                       "evaluation": {"dataset": "synthetic:classes=12", "classes": [5, 6, 7, 8, 9, 10]}}
    message = invoke_bad(tmp_path, ["run", "--config", str(write(tmp_path, doc))])
    assert "datasets.evaluation.classes" in message and "disjoint" in message


@pytest.mark.parametrize("text, hint", [
    ("space: [unclosed", "not valid YAML"),
    ("algorithm: replay\nspace: {}\n", "empty"),
    ("algorithm: replay\nspace:\n  momentum_of_doom: [1, 2]\n", "not a hyperparameter of replay"),
    ("algorithm: replay\nspace:\n  lr: []\n", "non-empty list"),
    ("algorithm: replay\nspace:\n  scheduler: [steplr, warmup]\n", "not one of"),
    ("algorithm: replay\nspace:\n  epochs: [ten]\n", "should be of type int"),
])
def test_bad_search_space(tmp_path, text, hint):
    doc = merged(**{"search.space": str(space_file(tmp_path, text))})
    message = invoke_bad(tmp_path, ["tune", "--config", str(write(tmp_path, doc))])
    assert "search.space" in message and hint in message


@pytest.mark.parametrize("args, field", [
    (["--algorithm", "nope"], "algorithm"),
    (["--trials", "0"], "--trials"),
    (["--orderings", "0"], "--orderings"),
    (["--preset", "no-such-preset"], "--preset"),
    (["--address", "127.0.0.1:1"], "--address"),
    (["--tracking-uri", "http://127.0.0.1:1"], "--tracking-uri"),
    (["--resume", "no-such-study"], "--resume"),
])
def test_bad_options(tmp_path, args, field):
    base = [] if "--preset" in args else ["--config", str(write(tmp_path, BASE))]
    message = invoke_bad(tmp_path, ["run", *base, *args])
    assert field in message


def test_best_file_for_another_algorithm(tmp_path):
    best = tmp_path / "best.yaml"
    best.write_text(yaml.safe_dump({"algorithm": "icarl", "set_index": 0, "hparams": {"T": 2.0}}))
    message = invoke_bad(tmp_path, ["evaluate", "--config", str(write(tmp_path, BASE)), "--best", str(best)])
    assert "--best" in message and "icarl" in message


def test_missing_config_file(tmp_path):
    message = invoke_bad(tmp_path, ["tune", "--config", str(tmp_path / "nope.yaml")])
    assert "--config" in message


def test_missing_env_var_in_preset(tmp_path, monkeypatch):
    monkeypatch.delenv("CIFAR100_ROOT", raising=False)
    message = invoke_bad(tmp_path, ["tune", "--preset", "cifar50-10tasks"])
    assert "CIFAR100_ROOT" in message


def test_listing_commands():
    for args in (["algorithms"], ["spaces"], ["spaces", "icarl"], ["presets"]):
        result = runner.invoke(app, args)
        assert result.exit_code == 0, result.output
    assert "lambda_aux" in runner.invoke(app, ["spaces", "icarl"]).output
    assert "cifar50-6tasks" in runner.invoke(app, ["presets"]).output
    assert runner.invoke(app, ["spaces", "nope"]).exit_code == 2


def test_pretrained_weights_checks(tmp_path):
    from tests.helpers import VIT, VIT_DATASET, pretrained_vit

    weights = pretrained_vit()  # pretrained on synthetic classes 10-19
    vit = merged(backbone=VIT, algorithm="simplecil", **{"datasets.split.dataset": VIT_DATASET,
                                                         "datasets.split.classes_per_phase": 10})
    vit["weights"] = weights
    message = invoke_bad(tmp_path, ["tune", "--config", str(write(tmp_path, vit)), "--study", "w1"])
    assert "weights" in message and "pretrained on" in message  # the split draws from all 20 classes
    message = invoke_bad(tmp_path, ["tune", "--config", str(write(tmp_path, merged(weights=weights)))])
    assert "weights" in message and "ViT" in message
    message = invoke_bad(tmp_path, ["tune", "--config", str(write(tmp_path, merged(algorithm="simplecil")))])
    assert "backbone" in message and "pretrained ViT" in message
    missing = merged(backbone=VIT, weights=str(tmp_path / "none.safetensors"))
    assert "does not exist" in invoke_bad(tmp_path, ["tune", "--config", str(write(tmp_path, missing))])


def test_pretrain_refuses_bad_input(tmp_path):
    out = tmp_path / "w.safetensors"
    for args, field in ((["--dataset", "imaginary"], "--dataset"), (["--classes", "5-x"], "--classes"),
                        (["--backbone", "resnet32"], "--backbone"), (["--classes", "500"], "--classes")):
        base = {"--dataset": "synthetic", "--classes": "0-3", "--backbone": "vit_micro_patch4_32"}
        base.update(dict(zip(args[::2], args[1::2])))
        flat = [x for kv in base.items() for x in kv]
        result = runner.invoke(app, ["pretrain", *flat, "--out", str(out), "--epochs", "1"])
        assert result.exit_code == 2 and field in result.stderr, result.output
        assert not out.exists()
