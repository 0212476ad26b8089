"""The pre-flight pass (gtep/preflight/, issue 31): every input the data, the files or the paths cannot satisfy is
refused before compute. PREFLIGHT is one table of command lines, checked as tests/cli/test_cli_errors.py checks its
own (the same sandbox): exit status 2, one `error:` line holding the field or option and the fix, nothing written
in --output or the working directory, and Ray never started. The rows cover the loaders (dtype, range, NaN,
shapes, labels), each family's needs of a phase's classes (FSCIL shots and shot index files, CFSL samples),
weights files, study paths, pipelines, schedulers, pruners, pretraining, matrices and `gtep check` itself.

The tests after the table check what is accepted: float pixels converted and said so, a shot index file in the
dataset's index space, draw_missing_shots, and what `gtep check` prints."""
from __future__ import annotations

import json
from typing import Callable

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from gtep.cli import app
from tests.cli.test_cli_errors import BASE, MATRIX, C, Inputs, invoke, runner, sandbox  # noqa: F401 - the fixture

GOOD = {"x_train": np.random.default_rng(0).integers(0, 255, (24, 8, 8, 3), dtype=np.uint8),
        "y_train": np.arange(24) % 12,
        "x_test": np.random.default_rng(1).integers(0, 255, (12, 8, 8, 3), dtype=np.uint8),
        "y_test": np.arange(12)}
FSCIL = {"family": "fscil", "fscil": {"base_classes": 2, "ways": 2, "shots": 2, "sessions": 2}}
CFSL = {"family": "cfsl", "cfsl": {"support_sets": 2, "ways": 2, "shots": 1, "target_shots": 2,
                                   "tasks_per_ordering": 2}}


def npz(**arrays: np.ndarray | None) -> Callable[[Inputs], str]:
    """An npz file: GOOD with arrays replaced (None drops one); returns 'npz:PATH'."""
    return lambda i: "npz:" + i.npz("data.npz", **{k: v for k, v in {**GOOD, **arrays}.items() if v is not None})


def on(dataset: Callable[[Inputs], str], **changes) -> Callable[[Inputs], str]:
    """An experiment file on a dataset written by `dataset` (dotted keys in `changes`)."""
    return lambda i: i.cfg(**{"datasets.split.dataset": dataset(i), **changes})


def fscil(shots: int = 2, dataset: Callable[[Inputs], str] = npz(), **more) -> Callable[[Inputs], str]:
    section = {**FSCIL["fscil"], "shots": shots, **more}
    return lambda i: i.cfg(**{"datasets.split.dataset": dataset(i), "scenario": {"family": "fscil",
                                                                                  "fscil": section}})


def shot_file(content: dict, **more) -> Callable[[Inputs], str]:
    """An FSCIL config whose shot_index file holds `content` (class id -> positions in the dataset's arrays)."""
    return lambda i: fscil(shot_index=i.text("shots.json", json.dumps(content)), **more)(i)


def cfsl(**more) -> Callable[[Inputs], str]:
    section = {**CFSL["cfsl"], **more}
    return lambda i: i.cfg(algorithm="cfsl_prototypes", **{"datasets.split.dataset": npz()(i),
                                                             "scenario": {"family": "cfsl", "cfsl": section}})


def weights_file(kind: str) -> Callable[[Inputs], str]:
    """Files that are not weights for resnet8: text, another network's tensors, a pickle that is no state dict,
    an empty safetensors file."""
    def build(i: Inputs) -> str:
        if kind == "text":
            return i.text("w.pt", "these are not weights")
        if kind == "resnet32":
            from gtep.models import create_backbone

            path = i.root / "resnet32.safetensors"
            save_file({k: v.contiguous() for k, v in create_backbone("resnet32").state_dict().items()}, str(path))
            return str(path)
        if kind == "list":
            path = i.root / "list.pt"
            torch.save([torch.zeros(2)], path)
            return str(path)
        path = i.root / "empty.safetensors"
        path.write_bytes(b"")
        return str(path)
    return build


def with_weights(kind: str) -> Callable[[Inputs], str]:
    return lambda i: i.cfg(weights=weights_file(kind)(i))


def imagefolder(damaged: bool = False, empty_val: bool = False) -> Callable[[Inputs], str]:
    """A tiny ImageFolder tree (12 classes, PNGs); one damaged file, or one class without validation images."""
    def build(i: Inputs) -> str:
        from PIL import Image

        root = i.root / "tree"
        for split, per_class in (("train", 2), ("val", 1)):
            for c in range(12):
                folder = root / split / f"c{c:02d}"
                folder.mkdir(parents=True, exist_ok=True)
                if split == "val" and empty_val and c == 3:
                    continue
                for k in range(per_class):
                    Image.fromarray(GOOD["x_train"][2 * c + k % 2]).save(folder / f"{k}.png")
        if damaged:
            (root / "train" / "c05" / "0.png").write_bytes(b"\x89PNG broken")
        return "imagefolder:" + str(root)
    return build


LONG = "s" * 300


def MATRIX_ON(dataset: Callable[[Inputs], str]) -> Callable[[Inputs], str]:
    return lambda i: i.yaml({**MATRIX, "pairings": {"syn": {"similarity": "high", "datasets": {"split": {
        "dataset": dataset(i), "classes_per_phase": 6}}}}}, "m.yaml")


# (command line, needles the one error line must contain)
PREFLIGHT: list = [
    # ---- the issue's own inputs: pixels, NaN, sizes a class cannot fill, index files, weights, paths, pipelines
    pytest.param(C("run", "-c", on(npz(x_train=np.full((24, 8, 8, 3), np.nan, np.float32)))),
                 ["datasets.split.dataset", "data.npz", "x_train", "NaN", "uint8"], id="npz-nan-pixels"),
    pytest.param(C("run", "-c", on(npz(x_test=np.where(np.eye(8)[None, :, :, None] > 0, np.inf, 0.5).repeat(
        12, 0).repeat(3, -1).astype(np.float32)))), ["datasets.split.dataset", "x_test", "infinite"],
        id="npz-infinite-pixels"),
    pytest.param(C("run", "-c", on(npz(x_train=np.random.default_rng(0).normal(0, 1, (24, 8, 8, 3))))),
                 ["datasets.split.dataset", "x_train", "normalised", "floats in [0, 1]"], id="npz-normalised-floats"),
    pytest.param(C("run", "-c", on(npz(x_train=np.full((24, 8, 8, 3), 300.0)))),
                 ["datasets.split.dataset", "x_train", "300", "uint8"], id="npz-floats-above-255"),
    pytest.param(C("run", "-c", on(npz(x_train=np.full((24, 8, 8, 3), 4000, np.int16)))),
                 ["datasets.split.dataset", "x_train", "4000"], id="npz-int16-above-255"),
    pytest.param(C("run", "-c", on(npz(x_train=np.ones((24, 8, 8, 3), bool)))),
                 ["datasets.split.dataset", "x_train", "bool", "uint8"], id="npz-bool-pixels"),
    pytest.param(C("run", "-c", on(npz(x_test=np.full((12, 8, 8, 3), "a")))),
                 ["datasets.split.dataset", "x_test", "not image pixels"], id="npz-string-pixels"),
    pytest.param(C("run", "-c", on(npz(x_test=np.zeros((12, 16, 16, 3), np.uint8)))),
                 ["datasets.split.dataset", "x_test", "one size"], id="npz-train-test-sizes-differ"),
    pytest.param(C("run", "-c", on(npz(y_test=np.arange(12) + 1))),
                 ["datasets.split.dataset", "y_test", "class id 12"], id="npz-test-class-never-trained"),
    pytest.param(C("run", "-c", on(npz(y_train=(np.arange(24) % 12).astype(float)))),
                 ["datasets.split.dataset", "y_train", "integer"], id="npz-float-labels"),
    pytest.param(C("run", "-c", on(npz(y_train=np.arange(24) % 12 - 1))),
                 ["datasets.split.dataset", "y_train", "from 0"], id="npz-negative-labels"),
    pytest.param(C("run", "-c", on(npz(class_names=np.array(["a", "b"])))),
                 ["datasets.split.dataset", "class_names lists 2"], id="npz-fewer-names-than-labels"),
    pytest.param(C("run", "-c", on(npz(y_test=np.arange(12) % 11))),
                 ["datasets.split.dataset", "no test images", "add their images"], id="class-without-test-images"),
    pytest.param(C("run", "-c", on(npz(y_train=np.arange(24) % 11, class_names=np.array([f"c{k}" for k in range(12)]),
                                        y_test=np.arange(12)))),
                 ["datasets.split.dataset", "no training images"], id="class-without-training-images"),
    pytest.param(C("run", "-c", fscil(shots=3)),
                 ["scenario.fscil.shots", "3 shots", "has 2", "(6 classes short)", "lower shots"],
                 id="fscil-shots-above-class-images"),
    pytest.param(C("tune", "-c", fscil(shots=3, fixed_order=True)), ["scenario.fscil.shots", "(4 classes short)"],
                 id="fscil-fixed-order-session-class-short"),
    pytest.param(C("run", "-c", cfsl(shots=2)), ["scenario.cfsl", "4 images of each class", "has 3"],
                 id="cfsl-shots-above-class-images"),
    pytest.param(C("run", "-c", cfsl(target_shots=3)), ["scenario.cfsl", "target_shots 3", "lower shots"],
                 id="cfsl-target-shots-above-class-images"),
    pytest.param(C("run", "-c", cfsl(support_sets=4, class_change_interval=2)),
                 ["scenario.cfsl", "class_change_interval 2"], id="cfsl-class-block-above-class-images"),
    pytest.param(C("run", "-c", shot_file({str(c): [c, c + 12] for c in range(12)} | {"4": [5, 17]})),
                 ["scenario.fscil.shot_index", "class 4", "not of that class", "dataset's training arrays"],
                 id="shot-index-other-class"),
    pytest.param(C("run", "-c", shot_file({str(c): [c, c + 12] for c in range(12)} | {"4": [4, 99]})),
                 ["scenario.fscil.shot_index", "outside the training arrays"], id="shot-index-outside-arrays"),
    pytest.param(C("run", "-c", shot_file({str(c): [c, c + 12] for c in range(11)})),
                 ["scenario.fscil.shot_index", "not in the file", "draw_missing_shots"], id="shot-index-missing-class"),
    pytest.param(C("run", "-c", shot_file({str(c): [c] for c in range(12)})),
                 ["scenario.fscil.shot_index", "fewer than 2"], id="shot-index-too-few"),
    pytest.param(C("run", "-c", shot_file({str(c): [c, c] for c in range(12)})),
                 ["scenario.fscil.shot_index", "twice"], id="shot-index-duplicate"),
    pytest.param(C("run", "-c", lambda i: i.cfg(), "--weights", weights_file("text")),
                 ["--weights", "not a readable weights file for resnet8"], id="opt-weights-text-file"),
    pytest.param(C("run", "-c", lambda i: i.cfg(), "--weights", weights_file("resnet32")),
                 ["--weights", "resnet8", "state dict"], id="opt-weights-of-another-network"),
    pytest.param(C("tune", "-c", with_weights("list")), ["weights", "not a readable weights file"],
                 id="cfg-weights-pickle-not-a-state-dict"),
    pytest.param(C("tune", "-c", with_weights("empty")), ["weights", "not a readable"], id="cfg-weights-empty-file"),
    pytest.param(C("run", "-c", lambda i: i.cfg(study=LONG)), ["study", "300 bytes", "shorten it"],
                 id="cfg-study-name-too-long"),
    pytest.param(C("run", "-c", lambda i: i.cfg(), "--study", LONG), ["--study", "shorten it"],
                 id="opt-study-name-too-long"),
    pytest.param(C("run", "-c", lambda i: i.cfg(), "--output", lambda i: str(i.root) + ("/" + "d" * 250) * 17),
                 ["--output", "shorter"], id="opt-output-path-too-long"),
    pytest.param(C("run", "-c", lambda i: i.cfg(), "--output", lambda i: str(i.root / ("e" * 300))),
                 ["--output", "folder name", "shorter path"], id="opt-output-name-too-long"),
    pytest.param(C("tune", "-c", lambda i: i.cfg(**{"training.augment": "pycil"})),
                 ["training.augment", "pycil-cifar", "pycil-imagenet", "pilot-coda"], id="cfg-augment-near-miss"),
    pytest.param(C("tune", "-c", lambda i: i.cfg(**{"training.augment": 3})), ["training.augment", "not a data pipe"],
                 id="cfg-augment-number"),
    # ---- more loaders: ImageFolder trees
    pytest.param(C("run", "-c", on(imagefolder(damaged=True))),
                 ["datasets.split.dataset", "0.png", "not a readable image", "remove or replace"],
                 id="imagefolder-damaged-image"),
    pytest.param(C("run", "-c", on(imagefolder(empty_val=True))),
                 ["datasets.split.dataset", "val/c03", "class c03 has no test images"],
                 id="imagefolder-class-without-val-images"),
    # ---- every command that trains runs the same pass: evaluate, tune, check, matrix
    pytest.param(C("evaluate", "-c", fscil(shots=3), "--hparams", "original"), ["scenario.fscil.shots"],
                 id="evaluate-runs-preflight"),
    pytest.param(C("check", "-c", fscil(shots=3)), ["scenario.fscil.shots"], id="check-refuses-like-run"),
    pytest.param(C("check", "-c", lambda i: i.cfg(), "--weights", weights_file("text")), ["--weights", "resnet8"],
                 id="check-weights"),
    pytest.param(C("check", "-c", on(npz(x_train=np.full((24, 8, 8, 3), np.nan)))), ["x_train", "NaN"],
                 id="check-nan"),
    pytest.param(C("matrix", "-c", MATRIX_ON(npz(x_train=np.full((24, 8, 8, 3), np.nan)))),
                 ["pairings.syn", "NaN"], id="matrix-cell-data-nan"),
    pytest.param(C("matrix", "-c", MATRIX_ON(npz(y_test=np.arange(12) % 11))),
                 ["pairings.syn", "no test images"], id="matrix-cell-class-without-tests"),
    # ---- schedulers, pruners, protocols, replay: refused before compute like the rest
    pytest.param(C("run", "-c", lambda i: i.cfg(**{"search.scheduler": "asha", "search.pruner": "median"})),
                 ["search"], id="scheduler-and-pruner"),
    pytest.param(C("run", "-c", lambda i: i.cfg(**{"search.pruner": "median"})), ["search", "optuna"],
                 id="pruner-without-optuna-searcher"),
    pytest.param(C("run", "-c", lambda i: i.cfg(**{"search.scheduler": "asha", "search.fidelity": "tasks",
                                                  "search.orderings": 2, "scenario": FSCIL})),
                 ["search.fidelity", "orderings"],
                 id="fidelity-tasks-on-fscil"),
    pytest.param(C("run", "-c", lambda i: i.cfg(**{"search.protocol": "first_task", "search.protocol_tasks": 3})),
                 ["search.protocol_tasks", "not below"], id="first-task-k-too-large"),
    pytest.param(C("replay", lambda i: i.folder("runs/none"), "--scheduler", "asha"), ["manifest"],
                 id="replay-without-manifest"),
    # ---- pretraining and families' sections
    pytest.param(C("run", "-c", lambda i: i.cfg(**{
        "datasets.split.classes": list(range(2, 12)), "datasets.split.classes_per_phase": 5,
        "scenario.increments": [5], "pretrain": {"classes": [0, 1], "epochs": 1},
        "datasets.split.dataset": npz(y_train=np.where(np.arange(24) % 12 == 0, 1, np.arange(24) % 12),
                                      class_names=np.array([f"c{k}" for k in range(12)]))(i)})),
                 ["pretrain.classes", "no training images"], id="pretrain-class-without-images"),
    pytest.param(C("run", "-c", lambda i: i.cfg(**{"scenario": {**FSCIL, "fscil": {**FSCIL["fscil"],
                                                                                   "shot_index": "/no/shots.json"}}})),
                 ["scenario.fscil.shot_index", "does not exist"], id="shot-index-file-missing"),
    pytest.param(C("run", "-c", lambda i: i.cfg(**{"scenario": {**FSCIL, "fscil": {
        **FSCIL["fscil"], "shot_index": i.text("s.json", "[1, 2]")}}})), ["scenario.fscil.shot_index", "JSON object"],
        id="shot-index-not-an-object"),
    # ---- FLUID (issue 31): what a stream cannot be drawn from, and the section's new options (fluid() below)
    pytest.param(C("run", "-c", lambda i: fluid(i, npz(y_test=np.where(np.arange(12) == 0, 1, np.arange(12))))),
                 ["scenario.fluid.pretrain_classes", "[0]", "no test images", "list classes that have some"],
                 id="fluid-pretrain-class-without-test-images"),
    pytest.param(C("run", "-c", lambda i: fluid(i, npz(y_train=np.arange(24) % 11, y_test=np.arange(12) % 11,
                                                       class_names=np.array([f"c{k}" for k in range(12)])))),
                 ["datasets.split.dataset", "[11]", "no images", "leave them out"],
                 id="fluid-novel-class-without-images"),
    pytest.param(C("run", "-c", lambda i: fluid(i, pretrain=True, pretrain_holdout=0.2)),
                 ["scenario.fluid.pretrain_holdout", "holds out none", "class 0 has 2", "raise pretrain_holdout"],
                 id="fluid-holdout-holds-out-none"),
    pytest.param(C("run", "-c", lambda i: fluid(i, pretrain_holdout=0.2)),
                 ["scenario.fluid.pretrain_holdout", "pretrain section", "set it to 0"],
                 id="fluid-holdout-without-pretrain-section"),
    pytest.param(C("run", "-c", lambda i: fluid(i, unseen_positives="seen")),
                 ["scenario.fluid.unseen_positives", "'novel' or 'all'"], id="fluid-unseen-positives-unknown"),
    pytest.param(C("check", "-c", lambda i: fluid(i, npz(y_test=np.where(np.arange(12) == 0, 1, np.arange(12))))),
                 ["scenario.fluid.pretrain_classes", "no test images"], id="fluid-check-refuses-like-run"),
]


def fluid(i: Inputs, dataset: Callable[[Inputs], str] = npz(), pretrain: bool = False, **section) -> str:
    """A FLUID config on `dataset` (GOOD: 2 training and 1 test image a class): pretrain classes 0-1, the phases'
    novel classes out of 2-11; `section` changes scenario.fluid, `pretrain` adds a pretrain section."""
    stream = {"pretrain_classes": [0, 1], "n_pretrain_classes": 1, "n_novel_classes": 3, "total_samples": 10,
              "per_class_cap": 3, **section}
    more = {"pretrain": {"classes": [0, 1], "epochs": 1}} if pretrain else {}
    return i.cfg(algorithm="fluid_ncm", scenario={"family": "fluid", "fluid": stream}, **more, **{
        "datasets.split.dataset": dataset(i), "datasets.split.classes": list(range(2, 12)),
        "datasets.split.classes_per_phase": 5})


@pytest.mark.parametrize("build, needles", PREFLIGHT)
def test_refused_before_compute(sandbox, build, needles):  # noqa: F811 - sandbox is the imported fixture
    result = invoke(sandbox, build(sandbox[0]))
    message = result.stderr.strip()
    assert message.startswith("error:") and len(message.splitlines()) == 1, message
    missing = [n for n in needles if n not in message]
    assert not missing, f"{missing} not in {message!r}"


def test_the_table_covers_the_issue_and_thirty_more():
    assert len(PREFLIGHT) >= 50


# ---------------------------------------------------------------- what is accepted, and said

def test_float_pixels_are_converted_and_said(sandbox):  # noqa: F811
    """Floats in [0, 1] were cast to 0 or 1 (a black dataset); now they are scaled by 255, and gtep check and the
    loader say so."""
    from gtep.data import resolve_dataset

    inputs = sandbox[0]
    scaled = GOOD["x_train"].astype(np.float32) / 255.0
    dataset = npz(x_train=scaled)(inputs)
    images = resolve_dataset(dataset).load()
    assert np.array_equal(images.x_train, GOOD["x_train"])  # the very pixels, not 0/1
    assert "scaled by 255" in images.conversion and "x_train" in images.conversion
    result = runner.invoke(app, ["check", "-c", inputs.cfg(**{"datasets.split.dataset": dataset}),
                                 "--output", str(sandbox[2])])
    assert result.exit_code == 0, result.output + result.stderr
    said = " ".join(result.output.split())  # as read: rich wraps the note where the temporary path makes it long
    assert "converted" in said and "scaled by 255 to uint8" in said, result.output


def test_floats_in_0_255_are_rounded():
    from gtep.data.datasets import to_uint8_pixels

    pixels, note = to_uint8_pixels(np.array([[0.4, 254.6, 17.0]]), "x")
    assert pixels.tolist() == [[0, 255, 17]] and "rounded" in note
    assert to_uint8_pixels(GOOD["x_test"], "x") == (GOOD["x_test"], "")


def test_draw_missing_shots_accepts_a_partial_index(sandbox):  # noqa: F811
    inputs = sandbox[0]
    path = shot_file({str(c): [c, c + 12] for c in range(11)}, draw_missing_shots=True)(inputs)
    result = runner.invoke(app, ["check", "-c", path, "--output", str(sandbox[2])])
    assert result.exit_code == 0, result.output + result.stderr
    assert "2 shots each: 4 images" in result.output  # a few-shot session of 2 ways x 2 shots


def test_check_prints_the_plan(sandbox):  # noqa: F811
    """What a person reads: the phases' classes and images, the tasks of ordering 0, the units and the estimate."""
    inputs = sandbox[0]
    result = runner.invoke(app, ["check", "-c", inputs.cfg(), "--output", str(sandbox[2]), "--calibrate"],
                           env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output + result.stderr
    out = result.output
    assert "tune tasks (ordering 0): 2 x (3 classes: 90 images)" in out  # synthetic: 30 per class, counted once
    assert "units: tuning R x S = 2 x 1 = 2" in out and "evaluation S = 1" in out
    assert "ms per training image" in out and "tuning about" in out
    assert "nothing was trained or written" in out
    assert not sandbox[2].exists()
