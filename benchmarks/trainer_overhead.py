"""Training throughput of gtep's Trainer against a bare PyTorch loop on the same model, batches and data.

gtep side: a registered learner (default Replay) learns one task through `Trainer.fit`, exactly as the
engine drives it (`learner.learn_task(task, trainer.fit)`: its loss, optimiser and schedule built per call,
epoch permutation, the phase pipeline's training transform of the stored uint8 images per batch (for 32 px
data PyCIL's CIFAR pipeline: black-padded crop, flip, brightness jitter, normalisation), the once-per-epoch
divergence check).
Bare side: the plain loop anyone would write: SGD with the same momentum and weight decay, cross-entropy,
the same transform written per sample (`--bare-augment batched`: gtep's batch transform, fairer on CUDA), on
the same network from the same initial weights. Both sides draw the epoch permutation and the pipeline's
per-image parameters from one generator seeded alike, so they train on identical batches; their final
losses are printed as a check that the work is the same. On CUDA both sides use the same bf16 autocast and
channels-last.

Repetitions alternate (gtep, bare, bare, gtep, ...) after one warm-up each and the medians are compared,
so the ratio holds on a noisy machine; the ratio by this process's CPU time is printed too (on a machine
shared with other jobs it moves less than the wall-clock one; `--clock cpu` makes it the last line). Prints each
side's images/s and, as the last line, the ratio
(target >= 0.95).

    .venv/bin/python benchmarks/trainer_overhead.py [--backbone resnet20 --batch 128 --repeats 5]
"""
from __future__ import annotations

import argparse
import os
import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable

for _key, _value in (("RAY_AUTH_MODE", "disabled"), ("MLFLOW_SERVER_ENABLE_JOB_EXECUTION", "false"),
                     ("HF_HUB_OFFLINE", "1")):
    os.environ.setdefault(_key, _value)

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from gtep.algorithms import ALGORITHMS, CommonParams, TaskData  # noqa: E402
from gtep.data import resolve_dataset  # noqa: E402
from gtep.engine.device import resolve_device  # noqa: E402
from gtep.engine.images import StoredImages  # noqa: E402
from gtep.engine.loop import Precision, Trainer  # noqa: E402
from gtep.engine.runner import FirstTaskSpec, PhaseTensors, task_recipe  # noqa: E402


def task_of(args: argparse.Namespace, device: torch.device) -> tuple[TaskData, CommonParams]:
    """One task of `--images` images drawn from every class, stored on the device as the runner stores them,
    with the recipe a learner gets on task 2 and later (the sampled set's)."""
    data = resolve_dataset(args.dataset).load()
    classes = sorted(set(data.y_train.tolist()))
    keep = np.sort(np.random.default_rng(0).permutation(len(data.y_train))[: args.images])
    mask = np.zeros(len(data.y_train), dtype=bool)
    mask[keep] = True
    x = PhaseTensors(data, classes, device).images("train", mask)
    label = {c: i for i, c in enumerate(classes)}
    y = torch.tensor([label[c] for c in data.y_train[mask].tolist()], device=device)
    params = ALGORITHMS.get(args.algorithm).Params.from_mapping({
        "epochs": args.epochs, "lr": args.lr, "batch_size": args.batch, "weight_decay": 5e-4,
        "scheduler": "steplr", "milestones": (max(1, args.epochs // 2),)})
    recipe = task_recipe(1, params, FirstTaskSpec(), 1.0)
    return TaskData(index=1, known=0, total=len(classes), x=x, y=y, recipe=recipe), params


def textbook_transform(pixels: torch.Tensor, x: StoredImages, draws, start: int) -> torch.Tensor:
    """The pipeline's training transform as one writes it per image: black padding, a crop at the image's
    offsets, its flip and brightness factor, then the normalisation (torchvision's RandomCrop, RandomHorizontalFlip,
    ColorJitter, Normalize on tensors)."""
    pipeline, pad = x.pipeline, x.pipeline.spec.pad
    h, w = pixels.shape[2:]
    images = F.pad(pixels.float() / 255, (pad, pad, pad, pad))
    out = []
    for i in range(len(pixels)):
        dy, dx = (int(v) for v in draws.offsets[start + i])
        image = images[i, :, dy : dy + h, dx : dx + w]
        if draws.flips[start + i]:
            image = image.flip(2)
        out.append((image * draws.brightness[start + i]).clamp(0, 1))
    return (torch.stack(out) - pipeline.mean) / pipeline.std


def bare_loop(net: torch.nn.Module, task: TaskData, seed: int, precision: Precision, augment: str,
              compile: bool = False) -> None:
    """A plain PyTorch loop over the same batches as Trainer.fit (the same draws from the same generator).
    augment 'per-sample' transforms image by image (the textbook way); 'batched' uses gtep's batch transform,
    so that only the loop around it is compared (on CUDA the per-sample crop launches kernels per image).
    `compile`: torch.compile the forward and loss, as `training.compile` does for gtep's step."""
    recipe, x, y = task.recipe, task.x, task.y
    generator = torch.Generator().manual_seed(seed)
    net.train()
    if precision.channels_last:
        net.to(memory_format=torch.channels_last)
    optimizer = torch.optim.SGD(net.parameters(), lr=recipe.lr, momentum=recipe.momentum,
                                weight_decay=recipe.weight_decay)
    scheduler = torch.optim.lr_scheduler.MultiStepLR(optimizer, list(recipe.milestones), gamma=recipe.lr_decay)
    n, batch = len(x), recipe.batch_size

    def step_loss(xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(net(xb)["logits"], yb)

    step = torch.compile(step_loss) if compile else step_loss
    for _ in range(recipe.epochs):
        order = torch.randperm(n, generator=generator).to(x.device)
        draws = x.pipeline.draw(n, generator, x.pixels.shape[-1], x.device)
        for start in range(0, n, batch):
            idx = order[start : start + batch]
            pixels = x.pixels[idx]
            if augment == "batched":
                xb = x.pipeline.train(pixels, draws, start)
            else:
                xb = textbook_transform(pixels, x, draws, start)
            if precision.channels_last:
                xb = xb.contiguous(memory_format=torch.channels_last)
            with precision.autocast():
                loss = step(xb, y[idx])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        scheduler.step()


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dataset", default="synthetic:classes=10,train=120,test=1,size=32")
    parser.add_argument("--images", type=int, default=640, help="training images per epoch")
    parser.add_argument("--algorithm", default="replay")
    parser.add_argument("--backbone", default="resnet20")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--epochs", type=int, default=2, help="epochs per repetition")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--repeats", type=int, default=7, help="timed repetitions per side (after one warm-up)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (a trial with one CPU uses 1)")
    parser.add_argument("--no-mixed-precision", action="store_true", help="CUDA: fp32 on both sides")
    parser.add_argument("--bare-augment", choices=["per-sample", "batched"], default="per-sample",
                        help="the bare loop's transform: image by image, or gtep's batch transform (fairer on CUDA)")
    parser.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                        help="the last line's clock; 'cpu' (this process's CPU time, CPU runs only) resists a busy "
                             "machine")
    parser.add_argument("--profile", action="store_true", help="print torch.profiler's table of one gtep repetition")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    precision = Precision.for_device(device, not args.no_mixed_precision)
    sides = compare_sides(args, device, precision)
    task, times, check = sides.task, sides.times, sides.loss

    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU], record_shapes=False) as prof:
            sides.run_gtep(0)
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))

    images = len(task.x) * task.recipe.epochs
    rate = {clock: {name: images / statistics.median(values) for name, values in by_side.items()}
            for clock, by_side in times.items()}
    print(f"{args.algorithm} on {args.backbone}, {len(task.x)} images x {task.recipe.epochs} epochs, batch "
          f"{task.recipe.batch_size}, {device}, {torch.get_num_threads()} thread(s), {args.repeats} repetitions")
    for name in SIDES:
        spread = ", ".join(f"{images / t:.0f}" for t in times["wall"][name])
        print(f"{name:5s} {rate['wall'][name]:8.1f} images/s (median of wall times: {spread}); "
              f"{rate['cpu'][name]:8.1f} per CPU second")
    print(f"loss after training on the same batches: gtep {check['gtep']:.6f}, bare {check['bare']:.6f} "
          f"(bare crop: {args.bare_augment})")
    other = "cpu" if args.clock == "wall" else "wall"
    print(f"ratio by {other} time: {rate[other]['gtep'] / rate[other]['bare']:.2f}")
    print(f"ratio: {rate[args.clock]['gtep'] / rate[args.clock]['bare']:.2f} (target >= 0.95)")


SIDES = ("gtep", "bare")


@dataclass
class SideBySide:
    """What compare_sides measured: each side's times per clock (seconds per repetition), the loss each network
    ends at (the same work gives the same loss), and what ran (the gtep side again, for a profile)."""

    task: TaskData
    learner: Any
    times: dict[str, dict[str, list[float]]]
    loss: dict[str, float]
    run_gtep: Callable[[int], None]

    def images_per_second(self, side: str, clock: str = "wall") -> float:
        return len(self.task.x) * self.task.recipe.epochs / statistics.median(self.times[clock][side])


def compare_sides(args: argparse.Namespace, device: torch.device, precision: Precision,
                  compile: bool = False) -> SideBySide:
    """gtep's Trainer and the bare loop on one task (task_of: args.dataset, images, algorithm, backbone, batch,
    epochs, lr), from the same weights on the same batches, args.repeats timed repetitions each after a warm-up,
    alternated; `compile` on both sides (gtep: training.compile; bare: its step compiled alike)."""
    task, params = task_of(args, device)

    torch.manual_seed(0)
    learner = ALGORITHMS.get(args.algorithm)(params, args.backbone, 0, device)
    learner.begin_task(task)
    initial = {k: v.clone() for k, v in learner.net.state_dict().items()}
    bare_net = type(learner)(learner.params, args.backbone, 0, device).net
    bare_net.expand(task.total)
    bare_net.to(device)

    def run_gtep(seed: int) -> None:
        learner.net.load_state_dict(initial)
        learner.learn_task(task, Trainer(device, seed, augment=True, precision=precision, compile=compile).fit)

    def run_bare(seed: int) -> None:
        bare_net.load_state_dict(initial)
        bare_loop(bare_net, task, seed, precision, args.bare_augment, compile=compile)

    sides = {"gtep": run_gtep, "bare": run_bare}
    times: dict[str, dict[str, list[float]]] = {clock: {name: [] for name in sides} for clock in ("wall", "cpu")}
    for repeat in range(args.repeats + 1):
        order = ("gtep", "bare") if repeat % 2 == 0 else ("bare", "gtep")
        for name in order:
            synchronize(device)
            wall, cpu = time.perf_counter(), time.process_time()
            sides[name](args.repeats)  # one seed: every repetition trains on the same batches
            synchronize(device)
            if repeat > 0:  # repetition 0 warms up both sides (allocator, kernels, caches, compilation)
                times["wall"][name].append(time.perf_counter() - wall)
                times["cpu"][name].append(time.process_time() - cpu)
    with torch.no_grad():  # both networks trained from the same weights on the same batches: the same loss
        check = {name: float(F.cross_entropy(net.eval()(task.x[:256])["logits"], task.y[:256]))
                 for name, net in (("gtep", learner.net), ("bare", bare_net))}
    return SideBySide(task, learner, times, check, run_gtep)


if __name__ == "__main__":
    main()
