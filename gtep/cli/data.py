"""gtep data prepare: a dataset as distributed, written as the .npz file that presets and benchmarks name
(gtep/data/prepare.py). The other datasets are read in place (docs/datasets.md) and need no step."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from gtep.cli.common import console, run_guarded
from gtep.config import ConfigError

app = typer.Typer(help="Datasets: write a distributed dataset as an .npz file (docs/datasets.md).")


@app.command("prepare")
def prepare(name: str = typer.Argument(..., help="the dataset: tinyimagenet"),
            src: Path = typer.Argument(..., help="the folder as released (tiny-imagenet-200/)"),
            dest: Path = typer.Argument(..., help="the .npz file to write"),
            size: int = typer.Option(32, "--size", min=8, help="the stored square, in pixels"),
            train_per_class: Optional[int] = typer.Option(None, "--train-per-class", min=1,
                                                          help="a seeded draw of this many training images a class "
                                                               "[default: all]"),
            test_per_class: Optional[int] = typer.Option(None, "--test-per-class", min=1,
                                                         help="the same for the test (val/) images [default: all]"),
            seed: int = typer.Option(0, "--seed", help="the seed of those draws")) -> None:
    """Write the dataset NAME, unpacked in SRC as its authors distribute it, as the .npz file DEST: uint8 images
    x_train, y_train, x_test, y_test and class_names (what `npz:` reads: TINYIMAGENET_NPZ)."""
    def go() -> None:
        from gtep.data.prepare import PREPARERS

        if name not in PREPARERS:
            raise ConfigError("NAME", f"{name!r} has no prepare step; choose {', '.join(PREPARERS)} (the other "
                              "datasets are read in place: docs/datasets.md)")
        done = PREPARERS[name](src.expanduser(), dest.expanduser(), size, train_per_class, test_per_class, seed)
        console.print(f"wrote {done.path}: {done.classes} classes, {done.train} training and {done.test} test "
                      f"images at {size} px")

    run_guarded(go)
