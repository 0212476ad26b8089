"""gtep pretrain: backbone weights (a ViT or a ResNet) trained on held-out classes, so studies run without downloads."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from gtep.cli.common import console, run_guarded
from gtep.config import ConfigError, check_device

app = typer.Typer()


def parse_classes(text: str) -> list[int]:
    """'0-99', '0,5,7' or '@file' (ids separated by commas, spaces or newlines)."""
    if text.startswith("@"):
        path = Path(text[1:])
        if not path.exists():
            raise ConfigError("--classes", f"{path} does not exist")
        text = path.read_text().replace("\n", ",").replace(" ", ",")
    ids: list[int] = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        try:
            if "-" in part:
                low, high = part.split("-")
                ids += list(range(int(low), int(high) + 1))
            else:
                ids.append(int(part))
        except ValueError:
            raise ConfigError("--classes", f"cannot read {part!r}; write e.g. 0-99 or 0,5,7 or @file") from None
    if not ids:
        raise ConfigError("--classes", "no classes given")
    return ids


@app.command()
def pretrain(dataset: str = typer.Option(..., "--dataset", help="e.g. npz:~/data/tinyimagenet200_32.npz"),
             classes: str = typer.Option(..., "--classes",
                                         help="classes to pretrain on, kept out of both phases: 100-199"),
             backbone: str = typer.Option("vit_micro_patch4_32", "--backbone",
                                          help="a timm ViT name or a registered CNN (resnet8, resnet20, resnet32 ...)"),
             out: Path = typer.Option(..., "--out", help="the .safetensors file to write"),
             epochs: int = typer.Option(30, "--epochs", min=1),
             lr: Optional[float] = typer.Option(None, "--lr", help="default: 1e-3 (ViT, AdamW), 0.05 (CNN, SGD)"),
             batch_size: int = typer.Option(64, "--batch-size", min=1), seed: int = typer.Option(0, "--seed"),
             device: str = typer.Option("auto", "--device"),
             threads: int = typer.Option(0, "--threads", help="0: torch default")) -> None:
    """Train a backbone on held-out classes and save its weights (no downloads needed)."""
    def go():
        import torch
        from rich.progress import Progress

        from gtep.data import DatasetError, resolve_dataset
        from gtep.engine.device import DeviceUnavailableError, choose_device
        from gtep.engine.pretrain import default_spec
        from gtep.engine.pretrain import pretrain as run_pretrain
        from gtep.models import BACKBONES, backbone_exists

        if not backbone_exists(backbone):
            raise ConfigError("--backbone", f"unknown backbone {backbone!r}; use vit_micro_patch4_32, a timm ViT name "
                              f"or one of {BACKBONES.names()}")
        if out.suffix != ".safetensors":
            raise ConfigError("--out", f"{out} should end in .safetensors")
        if lr is not None and not lr > 0:
            raise ConfigError("--lr", f"must be > 0, got {lr:g}")
        check_device(device, "--device")
        try:  # outside a trial: 'auto' is CUDA where torch sees it, as the pretraining resolves it
            choose_device(device, torch.cuda.is_available())
        except DeviceUnavailableError:
            raise ConfigError("--device", f"{device} was asked for but CUDA is not available here; use cpu or "
                              "auto") from None
        ids = parse_classes(classes)
        try:
            source = resolve_dataset(dataset)
            names = source.class_names
        except DatasetError as err:
            raise ConfigError("--dataset", str(err)) from None
        bad = [c for c in ids if not 0 <= c < len(names)]
        if bad:
            raise ConfigError("--classes", f"ids {bad[:5]} are outside 0..{len(names) - 1}")
        if threads:
            torch.set_num_threads(threads)
        spec = default_spec(backbone, tuple(ids), epochs=epochs, lr=lr, batch_size=batch_size, seed=seed, device=device)
        with Progress(console=console) as progress:
            bar = progress.add_task(f"pretrain {backbone} on {len(ids)} classes", total=epochs)
            result = run_pretrain(spec, source.load(), source.name, out, on_epoch=lambda e: progress.advance(bar))
        console.print(f"wrote {out}: {result.parameters:,} parameters, train acc {100 * result.train_accuracy:.1f}%, "
                      f"test acc {100 * result.test_accuracy:.1f}% on the {len(ids)} pretraining classes, "
                      f"{result.seconds:.0f} s")
    run_guarded(go)
