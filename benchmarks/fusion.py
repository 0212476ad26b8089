"""Images/s of a fused trial (gtep/engine/fusion.py) against its orderings trained one after another (issue 59).

For S = 1, 2, 3, 5, 8 and 16 orderings: S Replay learners on ResNet-32 (a 100-class head), each with its own
random images and labels (crop-and-flip augmentation on the device, as the trainer does for image tensors), batch
128. "alone" trains each learner's fit in turn (the engine's Trainer.fit, as S separate runs would); "fused"
trains the S fits as one (fusion.fit_fused, what a fused trial's lockstep runs). Rows: fp32 and bf16 autocast
(bf16 on CUDA only), eager and torch.compile(mode="reduce-overhead") (CUDA graphs; on CUDA only). Per row: the
images/s of each side, fused / alone (the speed-up), and the time of a fused trial over the time of its
orderings one after another (the CPU target is <= 1.1). One warm-up epoch of each side is not timed.

    python benchmarks/fusion.py                          # on CUDA: every row
    python benchmarks/fusion.py --device cpu             # fp32 eager on the CPU, S up to 5 unless --sizes says
    python benchmarks/fusion.py --device cpu --quick     # toy size (resnet8, 16 px, batch 32): the test's run

It imports only gtep's engine, models and algorithms (torch and numpy; no Ray, MLflow, Optuna or pydantic), so it
runs on the GPU image as it is. Results: a table on stdout and `<out>/fusion.json` after every row.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # gtep from this checkout

import torch  # noqa: E402

from gtep.algorithms import ALGORITHMS, FitRecipe  # noqa: E402
from gtep.engine.fusion import FusedFit, fit_fused  # noqa: E402
from gtep.engine.loop import FitCall, PlainFit, Precision, Trainer  # noqa: E402

SIZES = (1, 2, 3, 5, 8, 16)


@dataclass(frozen=True)
class Setting:
    backbone: str = "resnet32"
    image: int = 32
    classes: int = 100
    batch: int = 128
    steps: int = 8  # timed steps per ordering (one epoch)


QUICK = Setting("resnet8", 16, 10, 32, 3)


@dataclass
class Row:
    orderings: int
    precision: str
    mode: str
    alone_images_per_s: float
    fused_images_per_s: float
    speedup: float  # fused / alone images per second
    time_ratio: float  # fused trial's seconds / its orderings' seconds one after another
    device: str
    note: str = ""


def _requests(s: int, setting: Setting, device: torch.device, precision: Precision, compiled: bool,
              fused: bool) -> list[FitCall]:
    """S Replay learners, each with its own images and labels, and the fit each would call."""
    replay = ALGORITHMS.get("replay")
    recipe = FitRecipe(epochs=1, lr=0.05, batch_size=setting.batch, weight_decay=5e-4, scheduler="constant",
                       milestones=(), lr_decay=0.1)
    n = setting.batch * setting.steps
    out = []
    for k in range(s):
        torch.manual_seed(k)
        learner = replay(replay.Params(), setting.backbone, 0, device)
        learner.net.head.expand(setting.classes)
        learner.known, learner.total = 0, setting.classes
        g = torch.Generator().manual_seed(100 + k)
        x = torch.randn(n, 3, setting.image, setting.image, generator=g).to(device)
        y = torch.randint(0, setting.classes, (n,), generator=g).to(device)
        trainer = Trainer(device, seed=k, augment=True, precision=precision)
        loss = learner.loss
        if compiled and fused:
            trainer.compile_backend = "inductor"
            trainer.compile_mode = "reduce-overhead"  # type: ignore[attr-defined]
        elif compiled:
            loss = torch.compile(learner.loss, mode="reduce-overhead")
        out.append(FitCall(trainer, list(learner.trainable_parameters()), loss, x, y, recipe, modules=[learner.net],
                           owner=learner))
    return out


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _time(fn: Any, device: torch.device) -> float:
    fn()  # warm-up: kernels, the allocator, compilation and CUDA graphs' recording
    _sync(device)
    tic = time.perf_counter()
    fn()
    _sync(device)
    return time.perf_counter() - tic


def measure(s: int, setting: Setting, device: torch.device, precision: Precision,
            compiled: bool) -> tuple[float, float]:
    """Seconds of one epoch of S orderings one after another, and of the same S fused."""
    alone = _requests(s, setting, device, precision, compiled, fused=False)
    fused = _requests(s, setting, device, precision, compiled, fused=True)

    def run_alone() -> None:
        for call in alone:
            PlainFit().fit(call)

    seconds_alone = _time(run_alone, device)
    seconds_fused = _time(lambda: fit_fused(FusedFit(), fused), device)
    return seconds_alone, seconds_fused


def rows_to_run(device: torch.device, no_compile: bool) -> list[tuple[str, str]]:
    precisions = ["fp32", "bf16"] if device.type == "cuda" else ["fp32"]
    modes = ["eager"] + (["reduce-overhead"] if device.type == "cuda" and not no_compile else [])
    return [(p, m) for m in modes for p in precisions]


def main(argv: list[str] | None = None) -> list[Row]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--quick", action="store_true", help="toy size (resnet8, 16 px, batch 32, S 1-3)")
    parser.add_argument("--sizes", type=int, nargs="+", help="the S to measure (default 1 2 3 5 8 16; CPU: to 5)")
    parser.add_argument("--steps", type=int, help="timed steps per ordering")
    parser.add_argument("--no-compile", action="store_true")
    parser.add_argument("--threads", type=int, help="torch threads (CPU)")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "fusion")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    setting = QUICK if args.quick else Setting()
    if args.steps:
        setting = Setting(setting.backbone, setting.image, setting.classes, setting.batch, args.steps)
    sizes = args.sizes or ((1, 2, 3) if args.quick else SIZES if device.type == "cuda" else (1, 2, 3, 5))
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    args.out.mkdir(parents=True, exist_ok=True)
    rows: list[Row] = []
    print(f"# fused orderings on {name}: {setting.backbone}, batch {setting.batch}, {setting.steps} steps per ordering")
    print(f"{'S':>3} {'precision':>9} {'mode':>15} {'alone img/s':>12} {'fused img/s':>12} {'speed-up':>9} "
          f"{'time ratio':>10}")
    for precision_name, mode in rows_to_run(device, args.no_compile):
        precision = (Precision(device.type, torch.bfloat16, True) if precision_name == "bf16"
                     else Precision(device.type))
        for s in sizes:
            images = s * setting.batch * setting.steps
            try:
                alone, fused = measure(s, setting, device, precision, mode != "eager")
                row = Row(s, precision_name, mode, images / alone, images / fused, alone / fused, fused / alone, name)
            except Exception as err:  # noqa: BLE001 - a row that cannot run says why and the others go on
                row = Row(s, precision_name, mode, float("nan"), float("nan"), float("nan"), float("nan"), name,
                          f"{type(err).__name__}: {err}"[:200])
            rows.append(row)
            print(f"{s:>3} {precision_name:>9} {mode:>15} {row.alone_images_per_s:>12,.0f} "
                  f"{row.fused_images_per_s:>12,.0f} {row.speedup:>9.2f} {row.time_ratio:>10.2f} {row.note}",
                  flush=True)
            (args.out / "fusion.json").write_text(json.dumps({"setting": asdict(setting),
                                                              "rows": [asdict(r) for r in rows]}, indent=1))
    return rows


if __name__ == "__main__":
    main()
