"""Every registered learner, of every scenario family, for one short ordering on a device: does it run there?

For each learner of gtep.algorithms' registry this trains one ordering of a small synthetic scenario of its
family (class-incremental, FSCIL, IIRC, FLUID, CFSL: the family's own example options) on `--device`, through the
engine exactly as a trial runs it (`run_ordering`, the trainer's mixed precision on, the dataset's pipeline on
the device), and records per learner: status, seconds, training images/s through the backbone, peak GPU memory,
Acc, and a failure's traceback. Pipelines: ResNet learners train through PyCIL's CIFAR pipeline
(`pycil-cifar`, 32 px); pretrained-ViT learners through LAMDA-PILOT's crops at the ViT's input side (224 px on
a GPU: `pilot@224`, `pilot-coda@224` for CODA-Prompt); one extra row trains Replay on a ResNet-18 through
PyCIL's ImageNet pipeline (RandomResizedCrop to 224 px). Weights that a learner needs (ViTs, CFSL's
meta-learners) are pretrained here first, on classes kept out of the scenario: nothing is downloaded.

Finite and the same as on CPU. Every result must be finite (Acc, AvgAcc, the accuracy matrix). The learners
whose result is a deterministic function of the data and the seeded initial weights, with no training whose
rounding the device changes (DETERMINISTIC below: prototype classifiers over frozen features), are also run in
fp32 on the device (TF32 off) and on the CPU: their Acc must agree within COMPARE_IMAGES test images (rounding
can move a test image lying on a decision boundary; a wrong device placement or dtype moves many).

Then, unless --no-tests, it runs the `gpu` test group's modules that import neither Ray nor MLflow (pytest is
all they need), with GTEP_GPU_TEST_DEVICE set to the device.

    python benchmarks/gpu_check.py                       # on CUDA: the full check (a few minutes on an H100)
    python benchmarks/gpu_check.py --device cpu --quick  # the same code at toy size on the CPU (minutes)
    python benchmarks/gpu_check.py --learners replay simplecil --no-tests

Results: a table on stdout and `<out>/gpu_check.json` (default benchmarks/results/gpu_check/). Exit status 1 when
any learner or test failed. What the device call runs, wheels included: benchmarks/gpu_check.sh.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

for _key, _value in (("RAY_AUTH_MODE", "disabled"), ("HF_HUB_OFFLINE", "1")):
    os.environ.setdefault(_key, _value)
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from gtep.algorithms import ALGORITHMS  # noqa: E402
from gtep.data import ImageSet, resolve_dataset  # noqa: E402
from gtep.engine import FirstTaskSpec, OrderingJob, OrderingOutcome, run_ordering  # noqa: E402
from gtep.engine.pretrain import default_spec, pretrain  # noqa: E402
from gtep.protocol.families import FAMILIES  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
# Prototype classifiers over frozen features: their result does not depend on training's rounding.
DETERMINISTIC = ("simplecil", "fluid_ncm", "cfsl_prototypes")
COMPARE_IMAGES = 2
# Their engine flow's family; learners of gtep.algorithms.fscil run in the FSCIL family.
FAMILY_OF_FLOW = {"class_incremental": "class_incremental", "multi_label": "iirc", "stream": "fluid",
                  "continual_few_shot": "cfsl"}
# Learners' own extra stages, shortened (their defaults run 20-170 epochs whatever `epochs` says).
SHORT_STAGES: dict[str, dict[str, Any]] = {
    "bic": {"bias_epochs": 1}, "podnet": {"ft_epochs": 1}, "foster": {"compression_epochs": 1},
    "beef": {"fusion_epochs": 1}, "ranpac": {"M": 256}, "coda_prompt": {"pool_size": 6, "n_tasks": 3},
    "fluid_ewc": {"fisher_samples": 16}, "fluid_oltr": {"early_every": 5, "early_until": 20},
    "fluid_imprinting": {"switch_after": 20}, "cfsl_protonet": {"episodes": 5}, "cfsl_fomaml": {"episodes": 5},
    "cfsl_proto_tune": {"episodes": 5}, "cec": {"meta_epochs": 1, "episodes": 5},
}
# Not the device's doing: at FOMAML's default inner step (Finn et al.'s 0.4, one of its space's three) the last
# stage of a ResNet-32 diverges on this synthetic data in fp32 on the CPU too, which tuning records as diverged.
# The check runs the space's middle value so that it checks the device.
SHORT_STAGES["cfsl_fomaml"]["lr"] = 0.1


@dataclass(frozen=True)
class Size:
    """How big the check's scenarios are: toy on a CPU (--quick), a few seconds a learner on a GPU."""

    resnet: str
    vit: str
    vit_side: int
    imagenet_side: int  # the side PyCIL's ImageNet pipeline crops to in the extra Replay row
    train: int  # training images per class
    test: int
    epochs: int
    pretrain_epochs: int


FULL = Size(resnet="resnet32", vit="vit_tiny_patch16_224", vit_side=224, imagenet_side=224, train=100, test=20,
            epochs=2, pretrain_epochs=1)
QUICK = Size(resnet="resnet8", vit="vit_micro_patch4_32", vit_side=32, imagenet_side=32, train=12, test=6,
             epochs=1, pretrain_epochs=1)
# CFSL's meta-learners pretrain on 5-way episodes: six classes kept out of the scenario
PHASE_CLASSES, PRETRAIN_CLASSES = tuple(range(12)), tuple(range(12, 18))


@dataclass
class LearnerResult:
    learner: str
    family: str
    backbone: str
    pipeline: str
    status: str = "failed"  # finished | diverged | failed
    seconds: float = 0.0
    backbone_images: int = 0  # images through a backbone: every forward of every stage, tests included
    images_per_second: float = 0.0
    peak_memory_mib: float | None = None
    acc: float | None = None
    cpu_acc: float | None = None  # DETERMINISTIC learners: fp32 on CPU, against `fp32_acc` on the device
    fp32_acc: float | None = None
    problems: list[str] = field(default_factory=list)
    traceback: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "finished" and not self.problems


class BackboneImages:
    """Counts the images every network's stem sees (training, feature extraction and testing alike), through a
    global forward hook on convolutions of RGB input (a ResNet's first conv, a ViT's patch embedding): each image a
    backbone processes passes one, however the learner calls it, so learners that train only a head, or nothing,
    show their work too."""

    def __init__(self) -> None:
        self.count = 0
        self._handle: Any = None

    def __enter__(self) -> BackboneImages:
        def hook(module: torch.nn.Module, args: tuple, _output: Any) -> None:
            # the input may be a tensor or gtep's StoredImages view of one: both have a shape
            if isinstance(module, torch.nn.Conv2d) and module.in_channels == 3 and args and hasattr(args[0], "shape"):
                self.count += int(args[0].shape[0])

        self._handle = torch.nn.modules.module.register_module_forward_hook(hook)
        return self

    def __exit__(self, *_: Any) -> None:
        self._handle.remove()


def dataset_spec(size: Size) -> str:
    classes = len(PHASE_CLASSES) + len(PRETRAIN_CLASSES)
    return f"synthetic:classes={classes},train={size.train},test={size.test},size=32,noise=60"


def family_of(name: str) -> str:
    algorithm = ALGORITHMS.get(name)
    if algorithm.__module__.startswith("gtep.algorithms.fscil"):
        return "fscil"
    return FAMILY_OF_FLOW[sorted(algorithm.data_flows)[0]]


def scenario(family: str) -> tuple[tuple[int, ...], tuple[int, ...], dict[str, Any]]:
    """Increments, the phase's classes and the family options of a small scenario of the family."""
    if family == "class_incremental":
        return (4, 4, 4), PHASE_CLASSES, {}
    f = FAMILIES.get(family)
    options = {k: v for k, v in f.example_options().items() if k != "increments"}
    extra = f.data_classes(options)
    increments = tuple(f.increments(options))
    classes = tuple(int(c) for c in options.get("classes", range(sum(increments))) if c not in extra)
    return increments, classes, options


def pretrained_weights(backbone: str, data: ImageSet, dataset: str, device: str, epochs: int, folder: Path) -> str:
    out = folder / f"{backbone}.safetensors"
    if not out.exists():
        pretrain(default_spec(backbone, PRETRAIN_CLASSES, epochs=epochs, batch_size=32, device=device), data, dataset,
                 out)
    return str(out)


def job_for(name: str, size: Size, device: str, data: ImageSet, dataset: str, folder: Path,
            pipeline: str | None = None, backbone: str | None = None) -> OrderingJob:
    algorithm = ALGORITHMS.get(name)
    family = family_of(name)
    increments, classes, options = scenario(family)
    vit = algorithm.uses_pretrained
    backbone = backbone or (size.vit if vit else size.resnet)
    if pipeline is None:
        pipeline = (f"{'pilot-coda' if name == 'coda_prompt' else 'pilot'}@{size.vit_side}" if vit
                    else "pycil-cifar")
    needs_weights = vit or family == "cfsl"
    weights = None
    if needs_weights:
        weights = pretrained_weights(backbone, data, dataset, device, size.pretrain_epochs, folder)
    hparams: dict[str, Any] = {"epochs": size.epochs, "batch_size": 32, "lr": 0.01 if vit else 0.05,
                               "scheduler": "cosine", **SHORT_STAGES.get(name, {})}
    if family == "fluid":
        hparams = {**SHORT_STAGES.get(name, {}), "update_every": 20, "epochs": size.epochs, "batch_size": 16}
    if family == "cfsl":
        hparams = dict(SHORT_STAGES.get(name, {}))
    known = set(algorithm.Params.__dataclass_fields__)
    hparams = {k: v for k, v in hparams.items() if k in known}
    return OrderingJob(name, hparams, backbone, increments, classes, seed=0, ordering=0, memory_size=24,
                       first_task=FirstTaskSpec(epochs=size.epochs, milestones=(max(1, size.epochs // 2),),
                                                batch_size=32),
                       augment=pipeline, device=device, weights=weights, dataset=dataset, mixed_precision=True,
                       family=family, family_options=tuple(sorted(options.items())))


def finite_problems(outcome: OrderingOutcome) -> list[str]:
    problems = []
    for key in ("acc", "avg_acc"):
        value = outcome.metrics.get(key)
        if not isinstance(value, (int, float)) or not math.isfinite(value):
            problems.append(f"{key} is {value!r}, not a finite number")
    # row i: accuracy on tasks 0..i after task i (the tasks not yet seen are NaN by design)
    if any(not math.isfinite(v) for i, row in enumerate(outcome.acc_matrix) for v in row[:i + 1]):
        problems.append("the accuracy matrix holds a non-finite value where a task was seen")
    return problems


def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)


def peak_mib(device: torch.device) -> float | None:
    return torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None


def fp32_acc(job: OrderingJob, data: ImageSet) -> float:
    """Acc of the job without mixed precision, TF32 off on CUDA: the run the CPU's is compared with."""
    previous = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    try:
        outcome = run_ordering(replace(job, mixed_precision=False), data)
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = previous
    if outcome.status != "finished":
        raise RuntimeError(f"the fp32 run {outcome.status}: {outcome.message}")
    return float(outcome.metrics["acc"])


def test_images(job: OrderingJob, data: ImageSet) -> int:
    return int(sum((data.y_test == c).sum() for c in job.classes))


def check_learner(name: str, size: Size, device: str, data: ImageSet, dataset: str, folder: Path,
                  pipeline: str | None = None, backbone: str | None = None, label: str | None = None) -> LearnerResult:
    job = job_for(name, size, device, data, dataset, folder, pipeline, backbone)
    result = LearnerResult(label or name, job.family, job.backbone, str(job.augment))
    torch_device = torch.device(device)
    try:
        reset_peak(torch_device)
        with BackboneImages() as images:
            tic = time.perf_counter()
            outcome = run_ordering(job, data)
            if torch_device.type == "cuda":
                torch.cuda.synchronize(torch_device)
            result.seconds = time.perf_counter() - tic
        result.status, result.backbone_images = outcome.status, images.count
        result.images_per_second = images.count / result.seconds if result.seconds else 0.0
        result.peak_memory_mib = peak_mib(torch_device)
        result.acc = outcome.metrics.get("acc")
        if outcome.status != "finished":
            result.problems.append(f"{outcome.status}: {outcome.message}")
        result.problems += finite_problems(outcome)
        if name in DETERMINISTIC and label is None:
            result.fp32_acc = fp32_acc(job, data)
            result.cpu_acc = fp32_acc(replace(job, device="cpu"), data)
            allowed = COMPARE_IMAGES / test_images(job, data)
            if abs(result.fp32_acc - result.cpu_acc) > allowed + 1e-9:
                result.problems.append(f"fp32 Acc {result.fp32_acc:.4f} on {device} against {result.cpu_acc:.4f} on "
                                       f"CPU: more than {COMPARE_IMAGES} test images apart")
    except Exception as err:  # noqa: BLE001 - a failure is what this check records, with its traceback
        result.status = "failed"
        result.problems.append(f"{type(err).__name__}: {err}")
        result.traceback = traceback.format_exc()
    return result


def no_ray_gpu_tests() -> list[Path]:
    """The gpu group's modules that need only pytest (the device has no Ray or MLflow)."""
    modules = sorted((ROOT / "tests" / "gpu").glob("test_*.py"))
    return [m for m in modules if not any(f"import {lib}" in m.read_text() or f"from {lib}" in m.read_text()
                                          for lib in ("ray", "mlflow"))]


def tests_timeout(device: str, given: float | None) -> float | None:
    """The gpu test step's limit: the one given; else 240 s on CUDA (its share of the device call's box) and none
    on a CPU, where a dry run takes what the machine takes (a fixed 240 s stopped it after 12 tests on a loaded
    2-core machine, failing a dry run whose tests pass)."""
    return given or (240.0 if device.startswith("cuda") else None)


def run_gpu_tests(device: str, timeout: float | None) -> dict[str, Any]:
    modules = no_ray_gpu_tests()
    # addopts cleared: pyproject's ask for pytest-xdist and deselect the gpu group; no conftest: it sets up Ray
    command = [sys.executable, "-m", "pytest", "-o", "addopts=", "-p", "no:cacheprovider", "--noconftest", "-q",
               "-m", "gpu", *map(str, modules)]
    env = {**os.environ, "GTEP_GPU_TEST_DEVICE": device}
    tic = time.perf_counter()
    try:
        done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
        tail, code = (done.stdout + done.stderr)[-4000:], done.returncode
    except subprocess.TimeoutExpired as err:
        tail, code = f"timed out after {timeout:.0f} s: {str(err.stdout or '')[-2000:]}", -1
    lines = [line for line in tail.splitlines() if line.strip()]
    return {"modules": [str(m.relative_to(ROOT)) for m in modules], "returncode": code,
            "seconds": time.perf_counter() - tic, "summary": lines[-1] if lines else "", "tail": tail}


def device_facts(device: str) -> dict[str, Any]:
    facts = {"device": device, "torch": torch.__version__, "python": platform.python_version(),
             "machine": platform.machine(), "threads": torch.get_num_threads()}
    if device.startswith("cuda"):
        facts["gpu"] = torch.cuda.get_device_name(torch.device(device))
        facts["cuda"] = torch.version.cuda
    return facts


def print_table(results: list[LearnerResult], facts: dict[str, Any]) -> None:
    where = facts.get("gpu") or f"{facts['device']} ({facts['threads']} threads)"
    print(f"\ngtep gpu check on {where}, torch {facts['torch']}")
    header = f"{'learner':<26} {'family':<17} {'backbone':<21} {'pipeline':<18} {'status':<9} {'s':>7} " \
             f"{'img/s':>9} {'peak MiB':>9} {'Acc':>6}  problems"
    print(header)
    print("-" * len(header))
    for r in results:
        memory = f"{r.peak_memory_mib:9.0f}" if r.peak_memory_mib is not None else f"{'-':>9}"
        acc = f"{r.acc:6.3f}" if isinstance(r.acc, (int, float)) else f"{'-':>6}"
        compared = f" fp32 {r.fp32_acc:.3f} vs CPU {r.cpu_acc:.3f}" if r.cpu_acc is not None else ""
        print(f"{r.learner:<26} {r.family:<17} {r.backbone:<21} {r.pipeline:<18} {r.status:<9} {r.seconds:7.1f} "
              f"{r.images_per_second:9.0f} {memory} {acc}  {'; '.join(r.problems)[:160]}{compared}")
    failed = [r.learner for r in results if not r.ok]
    print(f"{len(results) - len(failed)} of {len(results)} learners ran"
          + (f"; failed: {', '.join(failed)}" if failed else ""))


def save_report(out: Path, facts: dict[str, Any], size: Size, results: list[LearnerResult],
                tests: dict[str, Any] | None) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    report = {"facts": facts, "size": asdict(size), "deterministic": list(DETERMINISTIC),
              "compare_images": COMPARE_IMAGES, "learners": [asdict(r) for r in results], "tests": tests}
    (out / "gpu_check.json").write_text(json.dumps(report, indent=1))
    return out / "gpu_check.json"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda", help="the device to check (default cuda)")
    parser.add_argument("--quick", action="store_true", help="toy sizes (ResNet-8, a micro ViT at 32 px)")
    parser.add_argument("--learners", nargs="*", help="only these learners (default: every registered one)")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "gpu_check")
    parser.add_argument("--no-tests", action="store_true", help="skip the gpu test group's Ray-free modules")
    parser.add_argument("--tests-timeout", type=float, default=None,
                        help="seconds for the gpu test step (default: 240 on CUDA, the device call's box for it; none "
                             "on the CPU, where a dry run takes what this machine takes: 12 tests outlasted 240 s on "
                             "a loaded 2-core machine)")
    args = parser.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error(f"--device {args.device}: CUDA is not available here (use --device cpu --quick for a dry run)")
    unknown = sorted(set(args.learners or ()) - set(ALGORITHMS.names()))
    if unknown:
        parser.error(f"--learners: {', '.join(unknown)} not registered; known: {', '.join(ALGORITHMS.names())}")
    size = QUICK if args.quick else FULL
    names = args.learners or ALGORITHMS.names()
    dataset = dataset_spec(size)
    data = resolve_dataset(dataset).load()
    results: list[LearnerResult] = []
    facts = device_facts(args.device)
    with tempfile.TemporaryDirectory(prefix="gtep-gpu-check-") as folder:
        for name in names:
            results.append(check_learner(name, size, args.device, data, dataset, Path(folder)))
            print(f"  {name}: {results[-1].status} in {results[-1].seconds:.1f} s", flush=True)
            # saved after every learner: a device call that runs out of time still returns what it checked
            save_report(args.out, facts, size, results, None)
        if not args.learners or "replay" in names:
            results.append(check_learner("replay", size, args.device, data, dataset, Path(folder),
                                         pipeline=f"pycil-imagenet@{size.imagenet_side}", backbone="resnet18",
                                         label="replay (ImageNet crops)"))
    save_report(args.out, facts, size, results, None)
    tests = None if args.no_tests else run_gpu_tests(args.device, tests_timeout(args.device, args.tests_timeout))
    print_table(results, facts)
    if tests:
        print(f"gpu test group ({', '.join(tests['modules'])}): {tests['summary']}")
    print(f"results: {save_report(args.out, facts, size, results, tests)}")
    failed = any(not r.ok for r in results) or bool(tests and tests["returncode"] != 0)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
