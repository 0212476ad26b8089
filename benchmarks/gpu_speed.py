"""gtep's speed on a GPU, each side measured beside its reference in the same run (issue 47).

(a) trainer: gtep's Trainer against a bare PyTorch loop on the same network, batches and augmentation
    (benchmarks/trainer_overhead.py's `compare_sides`): ResNet-32 at batch 128 and 1,024, fp32 and bf16, eager and
    torch.compile. Per row: images/s of each side, the ratio gtep / bare (target >= 0.95), and the share of the
    GPU's dense bf16 peak that gtep's images/s reach with the network's training FLOPs (counted as
    benchmarks/gpu_throughput.py counts them; n/a on a CPU or an unlisted GPU).
(b) pycil: gtep against upstream PyCIL on identical work (benchmarks/reference_compare.py's recipes, run through
    benchmarks/reference_side.py): Replay and DER on ResNet-32, the same classes in the same order, epochs, batch and
    memory, one seed; the two sides run one after the other, each alone on the device. PyCIL gets 8 DataLoader
    workers on a GPU (DER's default; 0 with --quick). Per row: training seconds of each side and
    gtep / PyCIL (target <= 0.5). Skipped, with a message, when no PyCIL checkout is given or at .pycil/.
(c) vit: ViT-B/16 at 224 px (random weights made here and saved as the weights file gtep reads: nothing is
    downloaded) for SimpleCIL, L2P, DualPrompt and CODA-Prompt: a few hundred training steps each through the
    engine (`run_ordering`, LAMDA-PILOT's crops at 224 px), images through the backbone per second and peak GPU
    memory, to size a study of the paper's ViT methods.

    python benchmarks/gpu_speed.py                        # on CUDA: everything (about 6 minutes on an H100)
    python benchmarks/gpu_speed.py --device cpu --quick   # the same code at toy size on the CPU (a minute)
    python benchmarks/gpu_speed.py --parts trainer vit --no-compile

Results: a table per part on stdout and `<out>/gpu_speed.json` (default benchmarks/results/gpu_speed/). What the
device call runs: benchmarks/gpu_speed.sh (docs/speed.md, "On a GPU").
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, cast

for _key, _value in (("RAY_AUTH_MODE", "disabled"), ("HF_HUB_OFFLINE", "1")):
    os.environ.setdefault(_key, _value)
HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(ROOT), str(HERE)]  # gtep from this checkout; the sibling benchmarks as modules

import gpu_throughput  # noqa: E402
import numpy as np  # noqa: E402
import reference_compare  # noqa: E402
import torch  # noqa: E402
import trainer_overhead  # noqa: E402
from gpu_check import SHORT_STAGES, BackboneImages, device_facts, peak_mib, reset_peak  # noqa: E402

from gtep.data import resolve_dataset  # noqa: E402
from gtep.engine import FirstTaskSpec, OrderingJob, run_ordering  # noqa: E402
from gtep.engine.device import resolve_device  # noqa: E402
from gtep.engine.images import StoredImages  # noqa: E402
from gtep.engine.loop import Precision  # noqa: E402
from gtep.engine.pretrain import save_weights  # noqa: E402
from gtep.engine.runner import OrderingRun  # noqa: E402
from gtep.models.vit import create_timm_vit  # noqa: E402

PARTS = ("trainer", "pycil", "vit")
PYCIL_METHODS = ("replay", "der")
VIT_METHODS = ("simplecil", "l2p", "dualprompt", "coda_prompt")
DEFAULT_PYCIL = ROOT / ".pycil"  # where docs/speed.md unpacks the checkout (ignored by git, carried to the device)


@dataclass(frozen=True)
class Size:
    """How much work each part does: a GPU's worth, or a toy on a CPU (--quick)."""

    resnet: str
    trainer_images: int  # (a): training images per repetition
    trainer_batches: tuple[int, ...]
    trainer_precisions: tuple[str, ...]
    trainer_repeats: int
    pycil_classes: int  # (b): five or more in the first task (PyCIL reports top-5 accuracy)
    pycil_increments: str
    pycil_train: int  # (b): training images per class
    pycil_epochs: int
    pycil_batch: int
    pycil_memory: int
    vit: str
    vit_pipeline_side: int
    vit_classes: tuple[int, ...]  # (c): the increments
    vit_train: int
    vit_epochs: int
    vit_batch: int


FULL = Size(resnet="resnet32", trainer_images=10240, trainer_batches=(128, 1024), trainer_precisions=("fp32", "bf16"),
            trainer_repeats=3, pycil_classes=20, pycil_increments="10x2", pycil_train=500, pycil_epochs=3,
            pycil_batch=128, pycil_memory=500, vit="vit_base_patch16_224", vit_pipeline_side=224,
            vit_classes=(5, 5), vit_train=200, vit_epochs=4, vit_batch=32)
QUICK = Size(resnet="resnet8", trainer_images=64, trainer_batches=(16, 32), trainer_precisions=("fp32",),
             trainer_repeats=1, pycil_classes=10, pycil_increments="5x2", pycil_train=4, pycil_epochs=1,
             pycil_batch=16, pycil_memory=10, vit="vit_micro_patch4_32", vit_pipeline_side=32, vit_classes=(2, 2),
             vit_train=6, vit_epochs=1, vit_batch=8)


def finite_ratio(numerator: float, denominator: float) -> float:
    return numerator / denominator if denominator > 0 else math.nan


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# ---------------------------------------------------------------- (a) the trainer against a bare loop

class Progress:
    """The report so far, written to --out after every row: a device call cut short by its time limit still
    leaves what it measured."""

    def __init__(self, out: Path, report: dict[str, Any]) -> None:
        self.path, self.report = out / "gpu_speed.json", report
        out.mkdir(parents=True, exist_ok=True)
        self.save()

    def save(self) -> None:
        self.path.write_text(json.dumps(self.report, indent=1))

    def rows(self, part: str) -> list[dict[str, Any]]:
        return cast(list, self.report.setdefault(part, []))


# (precision, batch) of the compiled row the first H200 calls measured: --compiled-only runs the other three
COMPILED_MEASURED = (("fp32", 128),)


def trainer_rows(size: Size, device: torch.device, compiled: bool, peak: float | None, progress: Progress,
                 skip: tuple[tuple[str, int], ...] = ()) -> None:
    """Every (batch, precision) the size asks for, eager or compiled, both sides in one call each."""
    for precision_name in size.trainer_precisions:
        for batch in size.trainer_batches:
            if (precision_name, batch) in skip:
                continue
            row = trainer_row(size, device, batch, precision_name, compiled, peak)
            progress.rows("trainer").append(row)
            progress.save()
            print(f"  trainer batch {batch} {precision_name} compile={compiled}: ratio {row['ratio']:.2f}", flush=True)


def trainer_row(size: Size, device: torch.device, batch: int, precision_name: str, compiled: bool,
                peak: float | None) -> dict[str, Any]:
    per_class = max(1, size.trainer_images // 10)
    # the bare loop applies gtep's batch transform (the same augmentation), so that only the loops differ
    args = argparse.Namespace(dataset=f"synthetic:classes=10,train={per_class},test=1,size=32",
                              images=size.trainer_images, algorithm="replay", backbone=size.resnet, batch=batch,
                              epochs=1, lr=0.05, repeats=size.trainer_repeats, bare_augment="batched")
    precision = Precision.for_device(device, precision_name == "bf16")
    sides = trainer_overhead.compare_sides(args, device, precision, compile=compiled)
    # the FLOP counter takes float images: the stored uint8 ones through the pipeline's test view
    stored = cast(StoredImages, sides.task.x[:64])
    sample = replace(sides.task, x=stored.as_tensor(), y=sides.task.y[:64])
    flops = gpu_throughput.flops_per_image(sides.learner, sample, precision)
    gtep, bare = sides.images_per_second("gtep"), sides.images_per_second("bare")
    return {"batch": batch, "precision": precision_name, "compile": compiled, "gtep_images_per_s": gtep,
            "bare_images_per_s": bare, "ratio": finite_ratio(gtep, bare), "gflop_per_image": flops / 1e9,
            "peak_share": gtep * flops / 1e12 / peak if peak else None, "loss": sides.loss}


def print_trainer(rows: list[dict[str, Any]], peak: float | None) -> None:
    print(f"\n(a) gtep's trainer against a bare loop (replay's network, same batches and augmentation)"
          f"{f'; bf16 peak {peak:.0f} TFLOP/s' if peak else ''}")
    header = f"{'batch':>6} {'precision':<9} {'compile':<7} {'gtep img/s':>11} {'bare img/s':>11} {'gtep/bare':>9} " \
             f"{'GFLOP/img':>9} {'of peak':>8}"
    print(header + "\n" + "-" * len(header))
    for r in rows:
        share = f"{100 * r['peak_share']:7.1f}%" if r["peak_share"] is not None else f"{'n/a':>8}"
        print(f"{r['batch']:>6} {r['precision']:<9} {str(r['compile']):<7} {r['gtep_images_per_s']:11.0f} "
              f"{r['bare_images_per_s']:11.0f} {r['ratio']:9.2f} {r['gflop_per_image']:9.3f} {share}")


# ---------------------------------------------------------------- (b) gtep against PyCIL

def pycil_settings(size: Size, npz: Path, device: str) -> argparse.Namespace:
    """The settings reference_compare's recipes and jobs read, at this size."""
    return argparse.Namespace(dataset=f"npz:{npz}", classes=size.pycil_classes, increments=size.pycil_increments,
                              epochs=size.pycil_epochs, lr=0.05, batch=size.pycil_batch, weight_decay=5e-4,
                              memory=size.pycil_memory, vit="", vit_weights=None, rp_dim=0, gtep_set=[],
                              device=device)


def write_npz(size: Size, folder: Path) -> Path:
    """gtep's synthetic images as an npz file: the one format both toolboxes read."""
    data = resolve_dataset(f"synthetic:classes={size.pycil_classes},train={size.pycil_train},test=10,size=32").load()
    path = folder / "synthetic.npz"
    np.savez(path, x_train=data.x_train, y_train=data.y_train, x_test=data.x_test, y_test=data.y_test)
    return path


SCIPY_SHIM = '''"""scipy.spatial.distance.cdist as PyCIL's models/base.py calls it, for a device without scipy."""
import numpy as np


def cdist(a, b, metric="euclidean"):
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    squared = np.maximum((a * a).sum(1)[:, None] + (b * b).sum(1)[None, :] - 2 * a @ b.T, 0)
    if metric == "sqeuclidean":
        return squared
    if metric == "euclidean":
        return np.sqrt(squared)
    raise ValueError(f"gpu_speed's cdist shim: metric {metric!r} is not PyCIL's")
'''


def scipy_shim(folder: Path) -> list[str]:
    """PyCIL imports scipy for one function (cdist, its NME classifier); the device has no scipy, so its PyCIL
    subprocess gets this shim on its path. Where scipy is installed nothing is added."""
    if importlib.util.find_spec("scipy") is not None:
        return []
    package = folder / "shim" / "scipy"
    (package / "spatial").mkdir(parents=True, exist_ok=True)
    (package / "__init__.py").write_text("")
    (package / "spatial" / "__init__.py").write_text("")
    (package / "spatial" / "distance.py").write_text(SCIPY_SHIM)
    return [str(folder / "shim")]


def gtep_seconds(settings: argparse.Namespace, method: str, data: Any) -> tuple[float, list[int]]:
    """gtep's ordering of seed 0 (tasks and their evaluations, as reference_compare times it) and its class order."""
    job = replace(reference_compare.gtep_job(settings, method, 0), device=settings.device)
    run = OrderingRun(job, data)
    synchronize(run.device)
    tic = time.perf_counter()
    for task in run.tasks:
        run.train_task(task)
    run.finish()
    synchronize(run.device)
    return time.perf_counter() - tic, [c for task in run.tasks for c in task.new_classes]


def pycil_seconds(settings: argparse.Namespace, method: str, checkout: Path, order: list[int], npz: Path,
                  data: Any, workers: int) -> float:
    """PyCIL's method on the same classes in the same order (reference_side.py in a subprocess), its own timing."""
    run = OrderingRun(reference_compare.gtep_job(settings, method, 0), data)  # the normalisation gtep divides by
    normalise = (run.images.pipeline.mean.flatten().tolist(), run.images.pipeline.std.flatten().tolist())
    job = {**reference_compare.reference_job(settings, method, 0, order, str(npz), normalise),
           "device": settings.device, "num_workers": workers, "threads": torch.get_num_threads()}
    with tempfile.TemporaryDirectory(prefix="gtep-gpu-speed-pycil-") as folder:
        scratch = Path(folder)
        (scratch / "job.json").write_text(json.dumps(job))
        path = [str(checkout.resolve()), str(HERE), *scipy_shim(scratch)]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
        done = subprocess.run([sys.executable, str(HERE / "reference_side.py"), "job.json", "result.json"],
                              cwd=scratch, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"PyCIL's {method} failed:\n{done.stderr[-3000:]}")
        return float(json.loads((scratch / "result.json").read_text())["seconds"])


def pycil_rows(size: Size, device: str, checkout: Path, workers: int, methods: list[str],
               progress: Progress) -> None:
    rows = progress.rows("pycil_rows")
    with tempfile.TemporaryDirectory(prefix="gtep-gpu-speed-data-") as folder:
        npz = write_npz(size, Path(folder))
        settings = pycil_settings(size, npz, device)
        data = resolve_dataset(settings.dataset).load().subset(list(range(size.pycil_classes)))
        for method in methods:
            ours, order = gtep_seconds(settings, method, data)
            theirs = pycil_seconds(settings, method, checkout, order, npz, data, workers)
            rows.append({"method": method, "gtep_seconds": ours, "pycil_seconds": theirs,
                         "ratio": finite_ratio(ours, theirs), "classes": size.pycil_classes,
                         "increments": size.pycil_increments, "epochs": size.pycil_epochs,
                         "batch": size.pycil_batch, "memory": size.pycil_memory, "pycil_workers": workers})
            progress.save()
            print(f"  pycil {method}: gtep {ours:.1f} s, PyCIL {theirs:.1f} s", flush=True)


def print_pycil(part: dict[str, Any]) -> None:
    print("\n(b) gtep against upstream PyCIL on identical work (ResNet-32, one seed, training seconds)")
    if "skipped" in part:
        print(f"skipped: {part['skipped']}")
        return
    header = f"{'method':<8} {'classes':>7} {'epochs':>6} {'batch':>5} {'memory':>6} {'gtep s':>8} {'PyCIL s':>8} " \
             f"{'gtep/PyCIL':>10}"
    print(header + "\n" + "-" * len(header))
    for r in part["rows"]:
        print(f"{r['method']:<8} {r['classes']:>7} {r['epochs']:>6} {r['batch']:>5} {r['memory']:>6} "
              f"{r['gtep_seconds']:8.1f} {r['pycil_seconds']:8.1f} {r['ratio']:10.2f}")


# ---------------------------------------------------------------- (c) the paper's ViT methods at 224 px

def random_vit_weights(name: str, folder: Path) -> str:
    """Random weights of the ViT, saved as gtep pretrain saves them (safetensors with the normalisation in its
    metadata): speed does not depend on what the weights learned, and nothing can be downloaded."""
    out = folder / f"{name}-random.safetensors"
    torch.manual_seed(0)
    save_weights(create_timm_vit(name), out, {"gtep.backbone": name, "gtep.mean": "0.5,0.5,0.5",
                                             "gtep.std": "0.5,0.5,0.5"})
    return str(out)


def vit_job(size: Size, method: str, device: str, weights: str, dataset: str) -> OrderingJob:
    tasks = len(size.vit_classes)
    stages = {**SHORT_STAGES, "coda_prompt": {"pool_size": 5 * tasks, "n_tasks": tasks}}.get(method, {})
    hparams = {"epochs": size.vit_epochs, "batch_size": size.vit_batch, "lr": 0.01, "scheduler": "cosine", **stages}
    pipeline = f"{'pilot-coda' if method == 'coda_prompt' else 'pilot'}@{size.vit_pipeline_side}"
    return OrderingJob(method, hparams, size.vit, size.vit_classes, tuple(range(sum(size.vit_classes))), seed=0,
                       ordering=0, memory_size=0, first_task=FirstTaskSpec(epochs=size.vit_epochs,
                                                                           batch_size=size.vit_batch),
                       augment=pipeline, device=device, weights=weights, dataset=dataset, mixed_precision=True)


def vit_rows(size: Size, device: str, progress: Progress) -> None:
    dataset = f"synthetic:classes={sum(size.vit_classes)},train={size.vit_train},test=4,size=32"
    data = resolve_dataset(dataset).load()
    torch_device = torch.device(device)
    rows = progress.rows("vit")
    with tempfile.TemporaryDirectory(prefix="gtep-gpu-speed-vit-") as folder:
        weights = random_vit_weights(size.vit, Path(folder))
        for method in VIT_METHODS:
            job = vit_job(size, method, device, weights, dataset)
            reset_peak(torch_device)
            with BackboneImages() as images:
                tic = time.perf_counter()
                outcome = run_ordering(job, data)
                synchronize(torch_device)
                seconds = time.perf_counter() - tic
            training = len(data.y_train)  # every class of the scenario is trained on once per epoch
            steps = sum(math.ceil(n * size.vit_train / size.vit_batch) for n in size.vit_classes) * size.vit_epochs
            rows.append({"method": method, "backbone": size.vit, "pipeline": str(job.augment),
                         "status": outcome.status, "seconds": seconds, "training_images": training * size.vit_epochs,
                         "training_steps": 0 if method == "simplecil" else steps, "backbone_images": images.count,
                         "images_per_s": images.count / seconds if seconds else 0.0,
                         "peak_memory_mib": peak_mib(torch_device)})
            progress.save()
            print(f"  vit {method}: {outcome.status} in {seconds:.1f} s", flush=True)


def print_vit(rows: list[dict[str, Any]]) -> None:
    print("\n(c) the paper's ViT methods (random weights; images through the backbone, tests included)")
    header = f"{'method':<12} {'backbone':<22} {'pipeline':<16} {'status':<9} {'steps':>6} {'s':>7} {'img/s':>8} " \
             f"{'peak MiB':>9}"
    print(header + "\n" + "-" * len(header))
    for r in rows:
        memory = f"{r['peak_memory_mib']:9.0f}" if r["peak_memory_mib"] is not None else f"{'n/a':>9}"
        print(f"{r['method']:<12} {r['backbone']:<22} {r['pipeline']:<16} {r['status']:<9} {r['training_steps']:>6} "
              f"{r['seconds']:7.1f} {r['images_per_s']:8.0f} {memory}")


# ---------------------------------------------------------------- the command

def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda", help="the device to measure on (default cuda)")
    parser.add_argument("--quick", action="store_true", help="toy sizes (ResNet-8, fp32, a micro ViT at 32 px)")
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS))
    parser.add_argument("--no-compile", action="store_true", help="(a) without its torch.compile rows")
    parser.add_argument("--compiled-only", action="store_true",
                        help="only (a)'s compiled rows not yet measured (fp32 at 1,024, bf16 at both batches)")
    parser.add_argument("--pycil", type=Path, default=None,
                        help=f"a checkout of upstream PyCIL (G-U-N/PyCIL) for (b); default {DEFAULT_PYCIL} if there")
    parser.add_argument("--pycil-workers", type=int, default=None,
                        help="PyCIL's DataLoader workers (default 8 on a GPU, its DER's and its configs' value; "
                             "0 with --quick: one process, in reach of a CPU test)")
    parser.add_argument("--pycil-methods", nargs="+", choices=PYCIL_METHODS, default=list(PYCIL_METHODS),
                        help="(b)'s methods: replay and one expansion method")
    parser.add_argument("--peak-tflops", type=float, default=None, help="the GPU's dense bf16 peak, if unlisted")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "gpu_speed")
    args = parser.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error(f"--device {args.device}: CUDA is not available here (use --device cpu --quick for a dry run)")
    if args.pycil is not None and not (args.pycil / "utils" / "data_manager.py").is_file():
        parser.error(f"--pycil {args.pycil}: not a PyCIL checkout (no utils/data_manager.py); give its folder")
    return args


def pycil_part(args: argparse.Namespace, size: Size, progress: Progress) -> None:
    checkout = args.pycil or (DEFAULT_PYCIL if (DEFAULT_PYCIL / "utils" / "data_manager.py").is_file() else None)
    if checkout is None:
        progress.report["pycil"] = {"skipped": f"no PyCIL checkout: give --pycil PATH or unpack G-U-N/PyCIL into "
                                               f"{DEFAULT_PYCIL} (docs/speed.md, 'On a GPU')"}
        progress.save()
        return
    # PyCIL decodes and augments in PIL behind its DataLoader: on a GPU it gets the workers it ships with
    workers = args.pycil_workers if args.pycil_workers is not None else (0 if args.quick else 8)
    progress.report["pycil"] = {"checkout": str(checkout), "rows": progress.rows("pycil_rows")}
    pycil_rows(size, args.device, checkout, workers, args.pycil_methods, progress)
    progress.report.pop("pycil_rows")  # the same list, now under "pycil"
    progress.save()


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    size = QUICK if args.quick else FULL
    device = resolve_device(args.device)
    peak = gpu_throughput.peak_tflops(device, args.peak_tflops)
    report: dict[str, Any] = {"facts": device_facts(args.device), "size": asdict(size), "peak_bf16_tflops": peak}
    progress = Progress(args.out, report)
    if args.compiled_only:
        trainer_rows(size, device, True, peak, progress, skip=COMPILED_MEASURED)
        args.parts, args.no_compile = [], True
    # the compiled rows last: the longest (compilation) and the first to drop if a device call runs out of time
    if "trainer" in args.parts:
        trainer_rows(size, device, False, peak, progress)
    if "pycil" in args.parts:
        pycil_part(args, size, progress)
    if "vit" in args.parts:
        vit_rows(size, args.device, progress)
    if "trainer" in args.parts and not (args.no_compile or args.quick):
        trainer_rows(size, device, True, peak, progress)
    where = report["facts"].get("gpu") or f"{args.device} ({report['facts']['threads']} threads)"
    print(f"\ngtep gpu speed on {where}, torch {torch.__version__}{' (--quick: toy sizes)' if args.quick else ''}")
    if report.get("trainer"):
        print_trainer(report["trainer"], peak)
    if "pycil" in report:
        print_pycil(report["pycil"])
    if "vit" in report:
        print_vit(report["vit"])
    progress.save()
    print(f"results: {args.out / 'gpu_speed.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
