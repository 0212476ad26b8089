"""`gtep check` says which pipeline and input size a study trains at, and says in one line when the pipeline
upsamples the stored images (issue 68, item 2): `imagefolder:...?size=32` with a ResNet and no training.augment
trains with PyCIL's ImageNet pipeline at 224 px, which nothing said before. Run as a user runs it (python -m gtep
check) on a tiny ImageFolder tree; nothing is trained."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """12 classes of 40 px PNGs: 2 training images and 1 test image each."""
    from PIL import Image

    root = tmp_path_factory.mktemp("imagefolder") / "tree"
    rng = np.random.default_rng(0)
    for split, per_class in (("train", 2), ("val", 1)):
        for c in range(12):
            folder = root / split / f"c{c:02d}"
            folder.mkdir(parents=True)
            for k in range(per_class):
                Image.fromarray(rng.integers(0, 256, (40, 40, 3), dtype=np.uint8)).save(folder / f"{k}.png")
    return root


def check(tmp_path: Path, dataset: str, **training: object) -> list[str]:
    config = {"study": "sizes", "algorithm": "replay", "backbone": "resnet8", "scenario": {"increments": "3x2"},
              "datasets": {"split": {"dataset": dataset, "classes_per_phase": 6}},
              "search": {"trials": 2, "orderings": 1}, **({"training": training} if training else {})}
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(config))
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}  # a log's width: long lines would be wrapped
    done = subprocess.run([sys.executable, "-m", "gtep", "check", "--config", str(path),
                           "--output", str(tmp_path / "runs")], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert not (tmp_path / "runs").exists(), "gtep check writes nothing"
    return done.stdout.splitlines()


def test_imagefolder_at_32_px_with_a_resnet_and_no_augment_says_224_and_the_fix_in_one_line(tree, tmp_path):
    lines = check(tmp_path, f"imagefolder:{tree}?size=32")
    assert ("training input: both phases pycil-imagenet@224 (PyCIL's ImageNet pipeline) at 224 px, upsampled from "
            "images stored at 32 px") in lines
    warnings = [line for line in lines if "warning:" in line]
    assert len(warnings) == 1, lines
    warning = warnings[0]
    for needle in ("datasets.split.dataset", "stored at 32 px (?size=32)", "resnet8 trains at 224 px",
                   "pycil-imagenet@224", "training.augment: true picks for ImageFolder data", "upsampled 7x",
                   "to train at 32 px set training.augment: pycil-cifar", "training.image_size: 32",
                   "remove ?size=32 from datasets.split.dataset (stored at 256 px then)"):
        assert needle in warning, (needle, warning)


def test_the_cifar_pipeline_at_the_stored_32_px_is_said_and_not_warned_about(tree, tmp_path):
    lines = check(tmp_path, f"imagefolder:{tree}?size=32", augment="pycil-cifar")
    assert ("training input: both phases pycil-cifar (PyCIL's CIFAR-100 pipeline) at 32 px, from images stored at "
            "32 px") in lines
    assert not any("warning:" in line for line in lines), lines
