"""A study at the paper's ImageNet resolution, on the CPU with a tiny ResNet: ImageFolder images stored once at
256 px, trained through PyCIL's ImageNet pipeline at 224 px, the pipeline recorded with the runs."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import yaml
from mlflow.tracking import MlflowClient
from PIL import Image
from typer.testing import CliRunner

from gtep.cli import app
from gtep.config import ExperimentConfig, resolve
from gtep.data import resolve_dataset
from gtep.engine.runner import FirstTaskSpec, OrderingJob, OrderingRun


def make_tree(root: Path, classes: int = 4, train: int = 4, val: int = 2) -> Path:
    """Non-square images with a class colour, so the stored squares are cut from resized frames."""
    rng = np.random.default_rng(0)
    for split, count in (("train", train), ("val", val)):
        for c in range(classes):
            folder = root / split / f"class{c}"
            folder.mkdir(parents=True)
            for i in range(count):
                image = rng.integers(0, 60, (48, 64, 3)) + np.array([200 * (c % 2), 100 * (c // 2), 50])
                Image.fromarray(np.clip(image, 0, 255).astype(np.uint8)).save(folder / f"{i}.png")
    return root


CONFIG = {
    "study": "px224", "algorithm": "replay", "backbone": "resnet8",
    "scenario": {"increments": "1x2"},
    "search": {"trials": 1, "orderings": 1},
    "first_task": {"epochs": 1, "milestones": [1], "batch_size": 4},
    "training": {"memory_size": 2, "epoch_scale": 0.01},
    "compute": {"cpus_per_trial": 1},
    "seed": 0,
}


def test_the_training_batches_and_test_views_are_224_px(tmp_path):
    root = make_tree(tmp_path / "tree")
    config = ExperimentConfig.model_validate({**CONFIG, "datasets": {"split": {"dataset": f"imagefolder:{root}"}}})
    resolved = resolve(config)
    phase = resolved.tuning
    data = resolve_dataset(phase.dataset).load()
    assert data.x_train.shape[1:] == (256, 256, 3), "stored once at Resize(256)'s side"
    job = OrderingJob("replay", {"epochs": 1, "batch_size": 4}, "resnet8", resolved.increments, phase.classes,
                      seed=0, ordering=0, memory_size=2, first_task=FirstTaskSpec(epochs=1, milestones=(1,),
                                                                                  batch_size=4),
                      augment=resolved.pipeline("tune").describe(), dataset=phase.dataset, device="cpu")
    run = OrderingRun(job, data)
    shapes: list[tuple[int, ...]] = []
    run.learner.net.register_forward_pre_hook(lambda module, args: shapes.append(tuple(args[0].shape)))
    for task in run.tasks:
        run.train_task(task)
    assert run.outcome.status == "finished" and len(run.outcome.acc_matrix) == 2
    assert shapes and {s[1:] for s in shapes} == {(3, 224, 224)}
    test = run.images.images("test", np.ones(len(data.y_test), dtype=bool))
    assert test.pixels.shape[-1] == 256 and test.shape[-1] == 224
    view = test.as_tensor()
    low = (0 - run.images.pipeline.mean) / run.images.pipeline.std
    assert torch.all(view >= low - 1e-5) and view.shape == (len(test), 3, 224, 224)


def test_a_224_px_study_runs_end_to_end_on_the_cpu(tmp_path):
    root = make_tree(tmp_path / "tree")
    config = tmp_path / "exp.yaml"
    config.write_text(yaml.safe_dump({**CONFIG, "datasets": {"split": {"dataset": f"imagefolder:{root}"}}}))
    result = CliRunner().invoke(app, ["run", "--config", str(config), "--output", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output + str(result.exception)
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'out' / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("gtep/px224")
    runs = client.search_runs([experiment.experiment_id], max_results=100)
    orderings = [r for r in runs if r.data.tags.get("gtep.level") == "ordering"]
    assert {r.data.tags.get("gtep.phase") for r in orderings} == {"tune", "evaluate"}
    for run in orderings:
        assert run.data.params["gtep.augment"] == "pycil-imagenet@224"
        assert run.data.params["gtep.dataset"].endswith("?size=256")
        assert 0 <= run.data.metrics["acc"] <= 100  # percent (gtep.units=percent)
