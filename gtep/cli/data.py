"""gtep data prepare: a dataset as distributed, in any of its layouts (gtep/data/layouts/), written as the .npz
file that presets and benchmarks name (gtep/data/prepare.py). Studies read the trees in place (docs/datasets.md)
and need no step; a broken tree is one line naming the file and the fix, and nothing is written."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from gtep.cli.common import console, run_guarded
from gtep.config import ConfigError

app = typer.Typer(help="Datasets: write a distributed dataset as an .npz file (docs/datasets.md).")


@app.command("prepare")
def prepare(name: str = typer.Argument(..., help="the dataset's layout: tinyimagenet, cifar100, cub, imagenet, "
                                                  "imagenet-kaggle, split or classes"),
            src: str = typer.Argument(..., help="the folder as released (tiny-imagenet-200/), or the one holding it; "
                                                "?split=SEED|FILE for classes and cub"),
            dest: Path = typer.Argument(..., help="the .npz file to write"),
            size: int = typer.Option(32, "--size", min=8, help="the stored square, in pixels"),
            train_per_class: Optional[int] = typer.Option(None, "--train-per-class", min=1,
                                                          help="a seeded draw of this many training images a class "
                                                               "[default: all]"),
            test_per_class: Optional[int] = typer.Option(None, "--test-per-class", min=1,
                                                         help="the same for the test (val/) images [default: all]"),
            seed: int = typer.Option(0, "--seed", help="the seed of those draws")) -> None:
    """Write the dataset in layout NAME, unpacked in SRC as its authors distribute it, as the .npz file DEST: uint8
    images x_train, y_train, x_test, y_test and class_names (what `npz:` reads: TINYIMAGENET_NPZ)."""
    def go() -> None:
        from gtep.data.layouts import LAYOUTS
        from gtep.data.prepare import prepare as write_npz

        if name not in LAYOUTS:
            raise ConfigError("NAME", f"{name!r} is not a dataset layout; choose {', '.join(LAYOUTS)} "
                              "(docs/datasets.md shows each tree)")
        done = write_npz(name, src, dest.expanduser(), size, train_per_class, test_per_class, seed)
        console.print(f"wrote {done.path}: {done.classes} classes, {done.train} training and {done.test} test "
                      f"images at {size} px")

    run_guarded(go)
