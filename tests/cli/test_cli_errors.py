"""Bad input: one clear error naming the field (or the option the user typed) and the fix, exit status 2, before
any compute, leaving nothing behind (issue 18). One table, BAD_INPUT, every row a command line a user could type
wrong; `test_bad_input` checks each row the same way:

- exit status 2, and stderr is exactly one line starting `error:` (no traceback, no Ray or MLflow log lines);
- that line holds each of the row's needles (the field or option, and the hint that says what to do);
- nothing is written: the --output folder is never created and the working directory stays empty;
- Ray never starts (ray.init raises in this test, so a row that reached it would fail with a traceback).

Rows of Click's own usage errors (a value of the wrong type for a typed option, below an option's minimum) are
checked the same way except for the format: Click prints its usage lines and a box naming the option.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

import numpy as np
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

# commands that take --output: each row runs with --output <tmp>/out, which must not exist afterwards
WITH_OUTPUT = {"tune", "evaluate", "run", "matrix", "report", "ui"}


def merged(**changes) -> dict:
    """BASE with dotted keys changed (None removes the key)."""
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


class Inputs:
    """Files a row needs, written under <tmp>/in (never the working directory the command runs in)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir()

    def text(self, name: str, content: str) -> str:
        path = self.root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
        return str(path)

    def yaml(self, doc: object, name: str = "exp.yaml") -> str:
        return self.text(name, yaml.safe_dump(doc))

    def cfg(self, name: str = "exp.yaml", **changes) -> str:
        """An experiment file: BASE with `changes` (dotted keys; '__' stands for '.' in keyword names)."""
        return self.yaml(merged(**{k.replace("__", "."): v for k, v in changes.items()}), name)

    def npz(self, name: str, **arrays: np.ndarray) -> str:
        path = self.root / name
        np.savez(path, **arrays)  # type: ignore[arg-type]
        return str(path)

    def binary(self, name: str) -> str:
        path = self.root / name
        path.write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe\x00\x80")
        return str(path)

    def folder(self, name: str) -> str:
        path = self.root / name
        path.mkdir(parents=True, exist_ok=True)
        return str(path)

    def space(self, text: str) -> str:
        return self.cfg(**{"search.space": self.text("space.yaml", text)})

    def best(self, doc: object) -> str:
        return self.yaml(doc, "best.yaml")

    def good_npz(self, name: str = "data.npz", **replace: np.ndarray) -> str:
        rng = np.random.default_rng(0)
        arrays = {"x_train": rng.integers(0, 255, (24, 8, 8, 3), dtype=np.uint8), "y_train": np.arange(24) % 12,
                  "x_test": rng.integers(0, 255, (12, 8, 8, 3), dtype=np.uint8), "y_test": np.arange(12)}
        arrays.update(replace)
        return self.npz(name, **{k: v for k, v in arrays.items() if v is not None})

    def study_without_manifest(self) -> str:
        return self.folder("runs/half-study")

    def study_with_manifest(self, text: str = '{"config": {}, "phases": {}, "algorithm": "replay"}') -> str:
        folder = Path(self.folder("runs/bad-input"))
        (folder / "manifest.json").write_text(text)
        return str(folder)


Row = Callable[[Inputs], list[str]]


def split_on(dataset: str, **more) -> Callable[[Inputs], str]:
    return lambda i: i.cfg(**{"datasets.split.dataset": dataset, **more})


def vit_weights(i: Inputs) -> str:
    """Weights as gtep pretrain labels them: a ViT pretrained on synthetic classes 10-19 (only the metadata is read
    before compute, so one tensor stands for the model)."""
    import torch
    from safetensors.torch import save_file

    from tests.helpers import VIT, VIT_DATASET

    path = i.root / "vit.safetensors"
    save_file({"w": torch.zeros(1)}, str(path), metadata={"gtep.backbone": VIT, "gtep.dataset": VIT_DATASET,
                                                          "gtep.classes": ",".join(map(str, range(10, 20)))})
    return str(path)


def vit_cfg(i: Inputs, **changes) -> str:
    from tests.helpers import VIT, VIT_DATASET

    return i.cfg(backbone=VIT, algorithm="simplecil", **{"datasets.split.dataset": VIT_DATASET,
                                                         "datasets.split.classes_per_phase": 10,
                                                         "scenario.increments": "5x2"}, **changes)


def pretrain_args(**override: str) -> Row:
    def build(i: Inputs) -> list[str]:
        base = {"--dataset": "synthetic", "--classes": "0-3", "--backbone": "vit_micro_patch4_32",
                "--out": str(i.root / "w.safetensors"), "--epochs": "1"}
        base.update(override)
        return ["pretrain", *[x for kv in base.items() for x in kv]]
    return build


def C(*args: str | Callable[[Inputs], str]) -> Row:
    """A command line: literal strings, and callables that write an input and return its path."""
    return lambda i: [a(i) if callable(a) else a for a in args]


def cfg(**changes) -> Callable[[Inputs], str]:
    return lambda i: i.cfg(**changes)


def text(name: str, content: str) -> Callable[[Inputs], str]:
    return lambda i: i.text(name, content)


MATRIX = {"matrix": "bad-matrix", "algorithms": ["replay"], "scenarios": {"3tasks": {"tasks": 3}},
          "pairings": {"syn": {"similarity": "high", "datasets": {"split": {"dataset": "synthetic:classes=12",
                                                                            "classes_per_phase": 6}}}},
          "base": {"backbone": "resnet8", "search": {"trials": 2, "orderings": 1}}}

# (command line, needles the one error line must contain): ids name the case
BAD_INPUT: list = [
    # ---- experiment file: names, values, shape (tune --config)
    pytest.param(C("tune", "-c", cfg(algorithm="nope")), ["algorithm", "choose from"], id="cfg-algorithm-unknown"),
    pytest.param(C("tune", "-c", cfg(backbone="vgg99")), ["backbone", "choose from"], id="cfg-backbone-unknown"),
    pytest.param(C("tune", "-c", cfg(datasets__split__dataset="imaginary")),
                 ["datasets.split.dataset", "unknown dataset"], id="cfg-dataset-unknown"),
    pytest.param(C("tune", "-c", cfg(scenario__increments="4x2")), ["scenario.increments", "sum to 8"],
                 id="cfg-increments-do-not-sum"),
    pytest.param(C("tune", "-c", cfg(scenario__increments="three")), ["scenario.increments", "cannot read"],
                 id="cfg-increments-unreadable"),
    pytest.param(C("tune", "-c", cfg(search__trials=0)), ["search.trials", "greater than or equal to 1"],
                 id="cfg-trials-zero"),
    pytest.param(C("tune", "-c", cfg(search__orderings=0)), ["search.orderings", "greater than or equal to 1"],
                 id="cfg-orderings-zero"),
    pytest.param(C("tune", "-c", cfg(search__trials="many")), ["search.trials", "integer"], id="cfg-trials-type"),
    pytest.param(C("tune", "-c", cfg(colour="blue")), ["colour", "not a known field", "remove it"],
                 id="cfg-unknown-top-key"),
    # a key that its section does not know, in each section: named with its dotted path
    *(pytest.param(C("tune", "-c", cfg(**{path: value})), [path, "not a known field"], id=f"cfg-unknown-{section}-key")
      for section, path, value in [("search", "search.colour", "blue"), ("compute", "compute.gpu", 1),
                                   ("training", "training.epochs", 3), ("tracking", "tracking.uri", "x"),
                                   ("first-task", "first_task.lr_steps", 3), ("split", "datasets.split.pool", 3)]),
    pytest.param(C("tune", "-c", cfg(compute__cpus_per_trial=-1)), ["compute.cpus_per_trial", "greater than 0"],
                 id="cfg-cpus-negative"),
    pytest.param(C("tune", "-c", cfg(compute__cpus_per_ordering=4)), ["cpus_per_ordering", "cpus_per_trial"],
                 id="cfg-ordering-exceeds-trial"),
    pytest.param(C("tune", "-c", cfg(training__epoch_scale=2)), ["training.epoch_scale", "less than or equal to 1"],
                 id="cfg-epoch-scale-above-one"),
    pytest.param(C("tune", "-c", cfg(training__augment="sometimes")), ["training.augment", "pycil-cifar", "pilot"],
                 id="cfg-augment-type"),
    pytest.param(C("tune", "-c", cfg(search__searcher="grid")), ["search.searcher", "random"],
                 id="cfg-searcher-unknown"),
    pytest.param(C("tune", "-c", cfg(seed=-1)), ["seed", "greater than or equal to 0"], id="cfg-seed-negative"),
    pytest.param(C("tune", "-c", cfg(study="my study/1")), ["study", "letters"], id="cfg-study-name"),
    pytest.param(C("tune", "-c", cfg(study=None)), ["study", "is required"], id="cfg-study-missing"),
    pytest.param(C("tune", "-c", cfg(scenario="3x2")), ["scenario", "mapping of its fields"],
                 id="cfg-section-not-a-mapping"),
    pytest.param(C("tune", "-c", cfg(first_task__milestones="60")), ["first_task.milestones", "list such as"],
                 id="cfg-list-field-not-a-list"),
    pytest.param(C("tune", "-c", cfg(scenario__increments=[0, 6])), ["scenario.increments", "positive"],
                 id="cfg-increments-not-positive"),
    pytest.param(C("tune", "-c", cfg(datasets__split__by="alphabet")), ["datasets.split.by", "class"],
                 id="cfg-split-by-unknown"),
    pytest.param(C("tune", "-c", cfg(datasets__split__classes=[0, 1, 99])),
                 ["datasets.split.classes", "outside 0..11"], id="cfg-classes-out-of-range"),
    pytest.param(C("tune", "-c", cfg(datasets__split__classes_per_phase=7)),
                 ["datasets.split.classes_per_phase", "lower it"], id="cfg-classes-per-phase-too-many"),
    pytest.param(C("tune", "-c", lambda i: i.cfg(**{"datasets.split.dataset": "npz:" + i.good_npz(),
                                                    "datasets.split.by": "group"})),
                 ["datasets.split.by", "use by: class"], id="cfg-split-by-group-without-groups"),
    pytest.param(C("tune", "-c", lambda i: i.yaml({**merged(), "datasets": {
        "split": BASE["datasets"]["split"], "tuning": {"dataset": "synthetic"}}})),
        ["datasets", "not both"], id="cfg-split-and-tuning"),
    pytest.param(C("run", "-c", lambda i: i.yaml({**merged(), "datasets": {
        "tuning": {"dataset": "synthetic:classes=12", "classes": [0, 1, 2, 3, 4, 5]},
        "evaluation": {"dataset": "synthetic:classes=12", "classes": [5, 6, 7, 8, 9, 10]}}})),
        ["datasets.evaluation.classes", "disjoint"], id="cfg-phases-share-a-class"),
    pytest.param(C("tune", "-c", text("exp.yaml", "study: x\nalgorithm: replay\n  scenario: [3x2\n")),
                 ["--config", "exp.yaml", "line 3", "column"], id="cfg-malformed-yaml"),
    pytest.param(C("tune", "-c", text("exp.yaml", "- a\n- b\n")), ["--config", "mapping"], id="cfg-not-a-mapping"),
    pytest.param(C("tune", "-c", text("exp.yaml", "")), ["--config", "mapping"], id="cfg-empty-file"),
    pytest.param(C("tune", "-c", lambda i: str(i.root / "nope.yaml")), ["--config", "does not exist"],
                 id="cfg-missing-file"),
    pytest.param(C("tune", "-c", lambda i: i.binary("exp.yaml")), ["--config", "YAML text"], id="cfg-binary-file"),
    pytest.param(C("tune", "-c", cfg(training__device="tpu")), ["training.device", "cuda"], id="cfg-device-unknown"),
    pytest.param(C("tune", "-c", cfg(datasets__split__seed=-3)), ["datasets.split.seed", "greater than or equal"],
                 id="cfg-split-seed-negative"),
    pytest.param(C("tune", "-c", cfg(tracking__tracking_uri="sqlite://")), ["tracking.tracking_uri", "sqlite:///"],
                 id="cfg-tracking-uri-no-file"),
    pytest.param(C("tune", "-c", lambda i: i.cfg(**{"tracking.tracking_uri": "sqlite:///" + i.text("f", "x")
                                                    + "/mlflow.db"})),
                 ["tracking.tracking_uri", "is a file"], id="cfg-sqlite-store-under-a-file"),
    pytest.param(C("tune", "-c", lambda i: i.folder("cfgdir")), ["--config", "is a folder"], id="cfg-is-a-folder"),
    # ---- datasets of each kind
    pytest.param(C("tune", "-c", split_on("npz:/no/such/file.npz")), ["datasets.split.dataset", "does not exist"],
                 id="npz-missing"),
    pytest.param(C("tune", "-c", split_on("npz:")), ["datasets.split.dataset", "needs a path"], id="npz-no-path"),
    pytest.param(C("tune", "-c", lambda i: i.cfg(**{"datasets.split.dataset": "npz:" + i.text("a.npz", "x,y\n")})),
                 ["datasets.split.dataset", "not an .npz"], id="npz-text-file"),
    pytest.param(C("tune", "-c", lambda i: i.cfg(**{"datasets.split.dataset": "npz:" + i.good_npz(x_test=None)})),
                 ["datasets.split.dataset", "x_test"], id="npz-without-x_test"),
    pytest.param(C("tune", "-c", lambda i: i.cfg(**{"datasets.split.dataset": "npz:" + i.good_npz(
        x_train=np.zeros((24, 8, 8, 4), np.uint8))})), ["datasets.split.dataset", "x_train", "N x H x W"],
        id="npz-x_train-shape"),
    pytest.param(C("tune", "-c", lambda i: i.cfg(**{"datasets.split.dataset": "npz:" + i.good_npz(
        y_train=np.arange(23))})), ["datasets.split.dataset", "y_train"], id="npz-labels-count"),
    pytest.param(C("tune", "-c", lambda i: i.cfg(**{"datasets.split.dataset": "npz:" + i.folder("npzdir")})),
                 ["datasets.split.dataset", "folder"], id="npz-is-a-folder"),
    pytest.param(C("tune", "-c", split_on("cifar100:/no/such/root")), ["datasets.split.dataset", "does not exist"],
                 id="cifar100-missing-root"),
    pytest.param(C("tune", "-c", lambda i: i.cfg(**{"datasets.split.dataset": "cifar100:" + i.folder("cifar")})),
                 ["datasets.split.dataset", "cifar-100-python"], id="cifar100-root-without-meta"),
    pytest.param(C("tune", "-c", split_on("imagefolder:/no/such/root")), ["datasets.split.dataset", "does not exist"],
                 id="imagefolder-missing-root"),
    pytest.param(C("tune", "-c", lambda i: i.cfg(**{"datasets.split.dataset": "imagefolder:" + i.folder("imf")})),
                 ["datasets.split.dataset", "train"], id="imagefolder-without-train"),
    pytest.param(C("tune", "-c", lambda i: i.cfg(**{"datasets.split.dataset": "imagefolder:" + i.folder("imf")
                                                    + "?colour=red"})),
                 ["datasets.split.dataset", "classes=FILE"], id="imagefolder-unknown-option"),
    pytest.param(C("tune", "-c", lambda i: i.cfg(**{"datasets.split.dataset": "imagefolder:" + i.folder("imf")
                                                    + "?size=big"})),
                 ["datasets.split.dataset", "size"], id="imagefolder-size-not-a-number"),
    pytest.param(C("tune", "-c", split_on("synthetic:colour=3")), ["datasets.split.dataset", "choose from"],
                 id="synthetic-unknown-option"),
    pytest.param(C("tune", "-c", split_on("synthetic:classes=many")), ["datasets.split.dataset", "classes"],
                 id="synthetic-option-not-a-number"),
    pytest.param(C("tune", "-c", split_on("synthetic:classes=0")), ["datasets.split.dataset", "classes"],
                 id="synthetic-zero-classes"),
    # ---- search-space files
    *(pytest.param(C("tune", "-c", lambda i, text=text: i.space(text)), ["search.space", *needles], id=f"space-{case}")
      for case, text, needles in [
          ("malformed-yaml", "space: [unclosed", ["line 1", "column"]),
          ("empty", "algorithm: replay\nspace: {}\n", ["empty", "{name: [values]}"]),
          ("unknown-hyperparameter", "algorithm: replay\nspace:\n  momentum_of_doom: [1, 2]\n",
           ["not a hyperparameter of replay"]),
          ("empty-value-list", "algorithm: replay\nspace:\n  lr: []\n", ["non-empty list"]),
          ("literal", "algorithm: replay\nspace:\n  scheduler: [steplr, warmup]\n", ["not one of", "['steplr'"]),
          ("value-type", "algorithm: replay\nspace:\n  epochs: [ten]\n", ["should be of type int"]),
          ("other-algorithm", "algorithm: icarl\nspace:\n  lr: [0.1]\n", ["icarl"]),
          ("presets-not-a-mapping", "algorithm: replay\nspace:\n  lr: [0.1]\npresets: [original]\n",
           ["presets must be a mapping"])]),
    pytest.param(C("tune", "-c", cfg(search__space="/no/such/space.yaml")), ["search.space", "does not exist"],
                 id="space-missing-file"),
    # ---- options of tune / evaluate / run
    # an option given a value it refuses: one error naming the option, with the hint
    *(pytest.param(C(command, "-c", cfg(), option, value), [option, *needles], id=case)
      for case, command, option, value, needles in [
          ("opt-algorithm-unknown", "run", "--algorithm", "nope", ["choose from"]),
          ("opt-backbone-unknown", "run", "--backbone", "vgg99", ["choose from"]),
          ("opt-trials-zero", "run", "--trials", "0", [">= 1"]),
          ("opt-orderings-negative", "run", "--orderings", "-2", [">= 1"]),
          ("opt-max-concurrent-zero", "run", "--max-concurrent", "0", [">= 1"]),
          ("opt-seed-negative", "run", "--seed", "-1", [">= 0"]),
          ("opt-study-name", "tune", "--study", "bad name/", ["letters"]),
          ("opt-config-and-preset", "run", "--preset", "default", ["not both"]),
          ("opt-address-nobody-answers", "run", "--address", "127.0.0.1:1", ["ray start"]),
          ("opt-address-malformed", "run", "--address", "not an address", ["host:port"]),
          ("opt-tracking-uri-nobody-answers", "run", "--tracking-uri", "http://127.0.0.1:1", ["gtep server"]),
          ("opt-tracking-uri-unknown-scheme", "tune", "--tracking-uri", "bogus://x", ["sqlite:///"]),
          ("opt-resume-missing-folder", "run", "--resume", "no-such-study", ["manifest.json"]),
          ("opt-protocol-unknown", "evaluate", "--protocol", "tuned", ["choose gtep, conventional"]),
          ("opt-run-protocol-unknown", "run", "--protocol", "first", ["gtep, conventional, first_task"]),
          ("opt-tune-protocol-conventional", "tune", "--protocol", "conventional", ["choose gtep, first_task"]),
          ("opt-scheduler-unknown", "run", "--scheduler", "median", ["asha", "hyperband"]),
          ("hparams-unknown-preset", "evaluate", "--hparams", "nope", ["original"]),
          ("tuning-run-without-store", "evaluate", "--tuning-run", "0123abcd", ["no MLflow store"]),
          ("submit-phase-unknown", "submit", "--phase", "train", ["tune"])]),
    pytest.param(C("run", "--preset", "no-such-preset"), ["--preset", "choose from"], id="opt-preset-unknown"),
    pytest.param(C("tune", "-c", cfg(), "--output", text("outfile", "a file")), ["--output", "file"],
                 id="opt-output-is-a-file"),
    pytest.param(C("tune", "-c", cfg(), "--weights", lambda i: str(i.root / "none.safetensors")),
                 ["--weights", "does not exist"], id="opt-weights-missing-on-a-cnn"),
    pytest.param(C("tune", "-c", lambda i: vit_cfg(i), "--weights", lambda i: str(i.root / "none.safetensors")),
                 ["--weights", "does not exist"], id="opt-weights-missing"),
    pytest.param(C("tune", "-c", lambda i: vit_cfg(i, weights=vit_weights(i))), ["weights", "pretrained on"],
                 id="cfg-weights-pretrained-on-phase-classes"),
    pytest.param(C("tune", "-c", lambda i: vit_cfg(i), "--weights", text("w.safetensors", "not weights")),
                 ["--weights", "safetensors"], id="opt-weights-not-safetensors"),
    pytest.param(C("tune", "-c", lambda i: vit_cfg(i), "--weights", lambda i: i.folder("wdir")),
                 ["--weights", "folder"], id="opt-weights-is-a-folder"),
    pytest.param(C("tune", "-c", cfg(weights="/no/such/w.safetensors")), ["weights", "does not exist"],
                 id="cfg-weights-missing-on-a-cnn"),
    pytest.param(C("tune", "-c", cfg(pretrain={"classes": [0, 1], "epochs": 1})), ["pretrain.classes", "kept out"],
                 id="cfg-pretrain-classes-in-a-phase"),
    pytest.param(C("tune", "-c", cfg(algorithm="simplecil")), ["backbone", "pretrained ViT"],
                 id="cfg-pretrained-method-on-a-cnn"),
    pytest.param(C("tune", "--preset", "cifar50-10tasks"), ["CIFAR100_ROOT", "export"], id="preset-env-var-unset"),
    pytest.param(C("tune", "--resume", lambda i: i.study_without_manifest()), ["--resume", "manifest.json"],
                 id="opt-resume-folder-without-manifest"),
    pytest.param(C("tune", "--resume", lambda i: i.study_with_manifest("{not json")),
                 ["--resume", "not a gtep manifest"], id="opt-resume-broken-manifest"),
    pytest.param(C("tune", "--resume", lambda i: i.study_with_manifest('{"config": {"study": "x"}}')),
                 ["--resume", "algorithm", "is required"], id="opt-resume-manifest-config-invalid"),
    pytest.param(C("tune", "--resume", lambda i: i.study_with_manifest(), "--trials", "3"),
                 ["--resume", "drop", "--trials"], id="opt-resume-with-other-options"),
    pytest.param(C("run", "-c", cfg(), "--protocol", "first_task", "--protocol-tasks", "0"),
                 ["--protocol-tasks", ">= 1"], id="opt-protocol-tasks-zero"),
    pytest.param(C("evaluate", "-c", cfg(), "--best", lambda i: i.best(
        {"algorithm": "icarl", "set_index": 0, "hparams": {"T": 2.0}})), ["--best", "icarl", "--algorithm"],
        id="best-for-another-algorithm"),
    pytest.param(C("evaluate", "-c", cfg(), "--best", text("best.yaml", "algorithm: replay\nhparams: {lr: [0.1\n")),
                 ["--best", "best.yaml", "line 3", "column"], id="best-malformed-yaml"),
    pytest.param(C("evaluate", "-c", cfg(), "--best", text("best.yaml", "lr: 0.1\n")), ["--best", "hparams"],
                 id="best-not-a-best-file"),
    pytest.param(C("evaluate", "-c", cfg(), "--best", lambda i: i.best(
        {"algorithm": "replay", "set_index": 0, "hparams": {"lr": "fast"}})), ["--best", "lr"],
        id="best-value-type"),
    pytest.param(C("evaluate", "-c", cfg(), "--best", lambda i: str(i.root / "none.yaml")),
                 ["--best", "does not exist"], id="best-missing"),
    pytest.param(C("evaluate", "-c", cfg(), "--best", lambda i: i.folder("bestdir")), ["--best", "folder"],
                 id="best-is-a-folder"),
    pytest.param(C("evaluate", "-c", cfg(), "--hparams", "original", "--best", "x.yaml"),
                 ["--best", "one of"], id="best-and-hparams"),
    pytest.param(C("evaluate", "-c", cfg()), ["--best", "gtep tune first"], id="evaluate-without-best"),
    # ---- report, matrix, ui, submit, spaces
    pytest.param(C("report", "--format", "pdf"), ["--format", "choose from"], id="report-format-unknown"),
    pytest.param(C("report"), ["--output", "no MLflow store"], id="report-without-store"),
    pytest.param(C("report", "--tracking-uri", "bogus://x"), ["--tracking-uri", "sqlite:///"],
                 id="report-tracking-uri-unknown-scheme"),
    pytest.param(C("matrix"), ["--config", "--preset"], id="matrix-neither-config-nor-preset"),
    pytest.param(C("matrix", "--preset", "nope"), ["--preset", "choose from"], id="matrix-preset-unknown"),
    pytest.param(C("matrix", "-c", lambda i: str(i.root / "m.yaml")), ["--config", "does not exist"],
                 id="matrix-config-missing"),
    pytest.param(C("matrix", "-c", text("m.yaml", "matrix: m\nalgorithms: [replay\n")),
                 ["--config", "m.yaml", "line", "column"], id="matrix-malformed-yaml"),
    pytest.param(C("matrix", "-c", lambda i: i.yaml({**MATRIX, "algorithms": ["nope"]}, "m.yaml")),
                 ["algorithm", "choose from"], id="matrix-algorithm-unknown"),
    pytest.param(C("matrix", "-c", lambda i: i.yaml(MATRIX, "m.yaml"), "--trials", "0"), ["--trials"],
                 id="matrix-trials-zero"),
    pytest.param(C("ui"), ["--output", "no MLflow store"], id="ui-without-store"),
    pytest.param(C("submit", "-c", lambda i: str(i.root / "nope.yaml")), ["--config", "does not exist"],
                 id="submit-config-missing"),
    pytest.param(C("spaces", "nope"), ["algorithm", "choose from"], id="spaces-algorithm-unknown"),
    # ---- pretrain
    pytest.param(pretrain_args(**{"--dataset": "imaginary"}), ["--dataset", "unknown dataset"],
                 id="pretrain-dataset-unknown"),
    pytest.param(pretrain_args(**{"--classes": "5-x"}), ["--classes", "0-99"], id="pretrain-classes-unreadable"),
    pytest.param(pretrain_args(**{"--classes": "500"}), ["--classes", "outside"], id="pretrain-classes-out-of-range"),
    pytest.param(pretrain_args(**{"--classes": "@/no/such/list"}), ["--classes", "does not exist"],
                 id="pretrain-classes-file-missing"),
    pytest.param(pretrain_args(**{"--backbone": "resnet33"}), ["--backbone", "unknown backbone"],
                 id="pretrain-backbone-unknown"),
    pytest.param(pretrain_args(**{"--out": "w.pt"}), ["--out", ".safetensors"], id="pretrain-out-suffix"),
    pytest.param(pretrain_args(**{"--lr": "0"}), ["--lr", "> 0"], id="pretrain-lr-zero"),
    pytest.param(pretrain_args(**{"--device": "tpu"}), ["--device", "cuda"], id="pretrain-device-unknown"),
]

# Click refuses these itself (a typed option, a minimum): its usage lines and a box naming the option
USAGE_ERRORS: list = [
    pytest.param(["tune", "--trials", "ten"], "--trials", id="usage-trials-not-a-number"),
    pytest.param(["run", "--seed", "1.5"], "--seed", id="usage-seed-not-an-integer"),
    pytest.param(["tune", "--colour", "red"], "--colour", id="usage-unknown-option"),
    pytest.param(["matrix", "--preset", "small", "--parallel-cells", "0"], "--parallel-cells",
                 id="usage-parallel-cells-zero"),
    pytest.param(["pretrain", "--dataset", "synthetic", "--classes", "0-3", "--out", "w.safetensors", "--epochs", "0"],
                 "--epochs", id="usage-pretrain-epochs-zero"),
    pytest.param(["ui", "--port", "http"], "--port", id="usage-ui-port-not-a-number"),
]


@pytest.fixture
def sandbox(tmp_path, monkeypatch):
    """Inputs under <tmp>/in, an empty working directory <tmp>/cwd, and a Ray that refuses to start."""
    import ray

    def no_ray(*args, **kwargs):
        raise AssertionError("Ray started: bad input must be refused before ray_session")

    monkeypatch.setattr(ray, "init", no_ray)
    monkeypatch.setattr(ray, "is_initialized", lambda: False)  # a Ray this worker kept from another module: ignored
    monkeypatch.delenv("CIFAR100_ROOT", raising=False)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    return Inputs(tmp_path / "in"), cwd, tmp_path / "out"


def invoke(sandbox, args: list[str]):
    inputs, cwd, out = sandbox
    if args[0] in WITH_OUTPUT and "--output" not in args and "--resume" not in args:
        args = [*args, "--output", str(out)]
    result = runner.invoke(app, args)
    assert "Traceback" not in result.output + result.stderr, result.output + result.stderr
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert result.exit_code == 2, (result.exit_code, result.output, result.stderr)
    assert not out.exists(), f"a refused command wrote {sorted(os.listdir(out))} in --output"
    assert not os.listdir(cwd), f"a refused command wrote {sorted(os.listdir(cwd))} in the working directory"
    return result


@pytest.mark.parametrize("build, needles", BAD_INPUT)
def test_bad_input(sandbox, build, needles):
    result = invoke(sandbox, build(sandbox[0]))
    message = result.stderr.strip()
    assert message.startswith("error:") and len(message.splitlines()) == 1, message
    missing = [n for n in needles if n not in message]
    assert not missing, f"{missing} not in {message!r}"


@pytest.mark.parametrize("args, option", USAGE_ERRORS)
def test_usage_errors(sandbox, args, option):
    result = invoke(sandbox, args)
    assert option in result.stderr and result.stderr.startswith("Usage:"), result.stderr


def test_listing_commands():
    for args in (["algorithms"], ["spaces"], ["spaces", "icarl"], ["presets"]):
        result = runner.invoke(app, args)
        assert result.exit_code == 0, result.output
    assert "lambda_aux" in runner.invoke(app, ["spaces", "icarl"]).output
    assert "cifar50-6tasks" in runner.invoke(app, ["presets"]).output
