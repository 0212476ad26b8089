"""ResNet-32 training throughput on a GPU through gtep's Trainer, set against a known-fast CIFAR trainer.

For each configuration (batch size, bf16 + channels-last or fp32, eager or torch.compile) one learner (Replay
on ResNet-32, the paper's CIFAR backbone) learns one task of 32 px images through `Trainer.fit`, exactly as
the engine drives it. After one warm-up epoch block the timed blocks give images/s (median). The training
FLOPs of one image (forward + backward, counted by torch.utils.flop_counter on the real step) turn that into
achieved TFLOP/s and a fraction of the GPU's dense bf16 peak.

How the comparison with airbench is made: airbench94 (Jordan 2024, "94% on CIFAR-10 in 3.29 seconds on a
single GPU") publishes its total training cost, 0.36 PFLOP, and its time, 3.29 s (torch.compile) on an A100,
i.e. about 109 TFLOP/s, 35% of the A100's 312 TFLOP/s bf16 peak, over ~10 epochs of 50,000 images (about
150,000 images/s). Its network is another one (a 3-block VGG-like net, ~0.24 GFLOP per image forward against
ResNet-32's ~0.07), so images/s are not comparable across the two; the fraction of the GPU's peak each keeps
busy is, and it is what this script prints last for gtep beside airbench's.

    python benchmarks/gpu_throughput.py [--images 20480 --epochs 2 --batches 128 1024]
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

for _key, _value in (("RAY_AUTH_MODE", "disabled"), ("HF_HUB_OFFLINE", "1")):
    os.environ.setdefault(_key, _value)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

from gtep.algorithms import ALGORITHMS, FitRecipe, TaskData  # noqa: E402
from gtep.engine.device import describe_device, resolve_device  # noqa: E402
from gtep.engine.loop import Precision, Trainer  # noqa: E402

AIRBENCH = {"pflop": 0.36, "seconds": 3.29, "gpu": "A100", "peak_tflops": 312.0, "images": 10 * 50_000}
# dense bf16 tensor-core peaks (no sparsity), TFLOP/s, by a substring of torch.cuda.get_device_name
PEAK_BF16_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0, "A10": 125.0, "V100": 125.0}


def peak_tflops(device: torch.device, given: float | None) -> float | None:
    if given:
        return given
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((peak for key, peak in PEAK_BF16_TFLOPS.items() if key in name), None)


def make_task(images: int, classes: int, batch: int, epochs: int, device: torch.device) -> TaskData:
    g = torch.Generator().manual_seed(0)
    y = torch.arange(images) % classes
    x = torch.randn(images, 3, 32, 32, generator=g) + 0.5 * (y % 7).float().view(-1, 1, 1, 1)
    recipe = FitRecipe(epochs=epochs, lr=0.05, batch_size=batch, weight_decay=5e-4, scheduler="cosine",
                       milestones=(), lr_decay=0.1)
    return TaskData(0, 0, classes, x.to(device), y.to(device), recipe)


def flops_per_image(learner, task: TaskData, precision: Precision) -> float:
    """Training FLOPs of one image: one forward and backward of a batch, counted, divided by its size."""
    xb, yb = task.x[:64], task.y[:64]
    with FlopCounterMode(display=False) as counter:
        with precision.autocast():
            loss = F.cross_entropy(learner.net(precision.prepare_batch(xb))["logits"], yb)
        loss.backward()
    learner.net.zero_grad(set_to_none=True)
    return counter.get_total_flops() / len(xb)


def measure(args: argparse.Namespace, device: torch.device, batch: int, mixed: bool, compile: bool) -> dict:
    algorithm = ALGORITHMS.get("replay")
    torch.manual_seed(0)
    learner = algorithm(algorithm.Params.from_mapping({}), args.backbone, 0, device)
    task = make_task(args.images, 10, batch, args.epochs, device)
    learner.begin_task(task)
    precision = Precision.for_device(device, mixed)
    flops = flops_per_image(learner, task, precision)
    trainer = Trainer(device, 0, augment=True, precision=precision, compile=compile or None)
    times = []
    for block in range(args.repeats + 1):  # block 0 warms up (allocator, cuDNN autotuning, compilation)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        tic = time.perf_counter()
        learner.learn_task(task, trainer.fit)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if block > 0:
            times.append(time.perf_counter() - tic)
    rate = args.images * args.epochs / statistics.median(times)
    return {"batch": batch, "precision": "bf16+channels-last" if precision.autocast_dtype else "fp32",
            "compile": compile, "images_per_s": rate, "gflop_per_image": flops / 1e9, "tflops": rate * flops / 1e12}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="auto")
    parser.add_argument("--backbone", default="resnet32")
    parser.add_argument("--images", type=int, default=20480, help="training images per epoch")
    parser.add_argument("--epochs", type=int, default=2, help="epochs per timed block")
    parser.add_argument("--repeats", type=int, default=3, help="timed blocks per configuration")
    parser.add_argument("--batches", type=int, nargs="+", default=[128, 1024])
    parser.add_argument("--compile", action="store_true", help="also measure training.compile: true")
    parser.add_argument("--peak-tflops", type=float, default=None, help="the GPU's dense bf16 peak, if unlisted")
    args = parser.parse_args()
    device = resolve_device(args.device)
    peak = peak_tflops(device, args.peak_tflops)
    configs = [(b, True, False) for b in args.batches] + [(args.batches[0], False, False)]
    if args.compile:
        configs += [(b, True, True) for b in args.batches]
    print(f"Replay on {args.backbone}, {args.images} images x {args.epochs} epochs per block, median of "
          f"{args.repeats} blocks, {describe_device(device)}")
    best = None
    for batch, mixed, compile in configs:
        row = measure(args, device, batch, mixed, compile)
        share = f", {100 * row['tflops'] / peak:.1f}% of the {peak:.0f} TFLOP/s peak" if peak else ""
        print(f"batch {batch:5d} {row['precision']:18s} compile={str(compile):5s} {row['images_per_s']:10.0f} images/s "
              f"({row['gflop_per_image']:.3f} GFLOP/image -> {row['tflops']:.1f} TFLOP/s{share})")
        if batch == 128 and mixed and not compile:
            best = row
    air_tflops = AIRBENCH["pflop"] * 1e3 / AIRBENCH["seconds"]
    print(f"airbench94 (published, {AIRBENCH['gpu']}): {AIRBENCH['pflop']} PFLOP in {AIRBENCH['seconds']} s = "
          f"{air_tflops:.0f} TFLOP/s = {100 * air_tflops / AIRBENCH['peak_tflops']:.0f}% of the A100's "
          f"{AIRBENCH['peak_tflops']:.0f} TFLOP/s peak, ~{AIRBENCH['images'] / AIRBENCH['seconds']:.0f} images/s")
    if best and peak:
        print(f"ResNet-32 at batch 128 (bf16): {best['images_per_s']:.0f} images/s, "
              f"{100 * best['tflops'] / peak:.1f}% of this GPU's peak against airbench94's "
              f"{100 * air_tflops / AIRBENCH['peak_tflops']:.0f}% of its own")


if __name__ == "__main__":
    main()
