"""gtep against upstream PyCIL on identical work, method by method, with statistics (issue 33; in progress).

For each `--algorithm` and seed s (seeds 0..N-1, interleaved gtep, PyCIL, gtep, ... so that machine load hits both
alike): the first `--classes` classes of the npz dataset, split by `--increments`, in gtep's class order of
ordering 0 for seed s (PyCIL gets that order); one recipe for every task (`--epochs`, SGD at `--lr`, momentum 0.9,
decayed 10x at 50% and 75% of the epochs, `--weight-decay`, `--batch`), `--memory` exemplars in total, the PyCIL
CIFAR pipeline (gtep's `pycil-cifar`, PyCIL's iCIFAR100 transforms), ResNet-32. gtep runs its engine's ordering
(benchmarks/fidelity.py's job); PyCIL runs in a subprocess from a checkout given by `--pycil`
(benchmarks/pycil_side.py says what it sets from outside PyCIL's files, and why).

Prints, per method: Acc after each task and AvgAcc as mean +- std over seeds for both, the difference (gtep - PyCIL)
with its 95% interval and Welch's p, training images per second for both (training images x epochs over the
seconds of the whole ordering, counted the same way for both); the last line is the verdict: the largest |difference|
of final Acc over methods and whether any is significant at 5%.

    .venv/bin/python benchmarks/reference_compare.py --pycil /path/to/PyCIL --algorithm replay --seeds 5 \\
        --classes 30 --increments 10x3 --epochs 30
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

for _key, _value in (("RAY_AUTH_MODE", "disabled"), ("HF_HUB_OFFLINE", "1")):
    os.environ.setdefault(_key, _value)

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import torch  # noqa: E402
from fidelity import job_for  # noqa: E402
from scipy import stats  # noqa: E402

from gtep.data import resolve_dataset  # noqa: E402
from gtep.engine.runner import OrderingRun  # noqa: E402
from gtep.protocol.scenarios import parse_increments  # noqa: E402

PYCIL_NAMES = {"beef": "beefiso"}  # gtep's method name -> PyCIL's factory name where they differ
NME_METHODS = {"icarl"}  # methods whose reported accuracy is the nearest-mean classifier's, in both toolboxes


def training_images(counts: list[int], memory: int, epochs: int) -> int:
    """Images through training over an ordering: each task's images plus the exemplars replayed, times the epochs."""
    total, seen = 0, 0
    for n in counts:
        total += (n + min(memory, seen)) * epochs
        seen += n
    return total


def run_gtep(args: argparse.Namespace, data, seed: int) -> tuple[list[float], list[int], float]:
    """(Acc_t in %, the class order, seconds) of gtep's ordering 0 for `seed`."""
    job = job_for(args, seed)
    run = OrderingRun(job, data)
    order = [c for task in run.tasks for c in task.new_classes]
    tic = time.perf_counter()
    for task in run.tasks:
        run.train_task(task)
    outcome = run.finish()
    return [100 * a for a in outcome.metrics.get("acc_t", [])], order, time.perf_counter() - tic


def run_pycil(args: argparse.Namespace, method: str, seed: int, order: list[int],
              npz: str) -> tuple[list[float], float]:
    """(Acc_t in %, seconds) of PyCIL's method on the same classes, order and recipe."""
    milestones = [max(1, args.epochs // 2), max(1, args.epochs * 3 // 4)]
    increments = parse_increments(args.increments)
    job = {"method": PYCIL_NAMES.get(method, method), "backbone": "resnet32", "npz": npz, "class_order": order,
           "increments": [increments[0], increments[1] if len(increments) > 1 else increments[0]],
           "memory": args.memory, "seed": seed, "threads": args.threads,
           "init_epochs": args.epochs, "init_lr": args.lr, "init_milestones": milestones, "init_lr_decay": 0.1,
           "init_weight_decay": args.weight_decay, "epochs": args.epochs, "lr": args.lr, "milestones": milestones,
           "lr_decay": 0.1, "batch_size": args.batch, "weight_decay": args.weight_decay}
    with tempfile.TemporaryDirectory() as scratch:
        job_file, result_file = Path(scratch) / "job.json", Path(scratch) / "result.json"
        job_file.write_text(json.dumps(job))
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(args.pycil).resolve()), str(HERE)])}
        done = subprocess.run([sys.executable, str(HERE / "pycil_side.py"), str(job_file), str(result_file)],
                              cwd=scratch, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"PyCIL's {method} failed (seed {seed}):\n{done.stderr[-3000:]}")
        result = json.loads(result_file.read_text())
    acc = result["nme_t"] if method in NME_METHODS else result["acc_t"]
    return [float(a) for a in acc], float(result["seconds"])


def mean_std(values: list[float]) -> str:
    spread = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):6.2f} +- {spread:5.2f}"


def difference(ours: list[float], theirs: list[float]) -> tuple[float, float, float, float]:
    """(mean difference, 95% interval low, high, Welch's p) of ours - theirs."""
    diff = statistics.mean(ours) - statistics.mean(theirs)
    if len(ours) < 2 or len(theirs) < 2:
        return diff, math.nan, math.nan, math.nan
    va, vb = statistics.variance(ours) / len(ours), statistics.variance(theirs) / len(theirs)
    se = math.sqrt(va + vb)
    if se == 0:
        return diff, diff, diff, 1.0 if diff == 0 else 0.0
    dof = (va + vb) ** 2 / (va ** 2 / (len(ours) - 1) + vb ** 2 / (len(theirs) - 1))
    half = stats.t.ppf(0.975, dof) * se
    p = stats.ttest_ind(ours, theirs, equal_var=False).pvalue
    return diff, diff - half, diff + half, float(p)


def compare(args: argparse.Namespace, method: str, data, npz: str) -> tuple[float, float]:
    """One method over the seeds; prints its rows and returns (final-Acc difference, Welch's p)."""
    args.algorithm = method
    rows: dict[str, list[list[float]]] = {"gtep": [], "PyCIL": []}
    seconds: dict[str, list[float]] = {"gtep": [], "PyCIL": []}
    for seed in range(args.seeds):
        acc_t, order, took = run_gtep(args, data, seed)
        rows["gtep"].append(acc_t)
        seconds["gtep"].append(took)
        theirs, took = run_pycil(args, method, seed, order, npz)
        rows["PyCIL"].append(theirs)
        seconds["PyCIL"].append(took)
        print(f"{method} seed {seed}: gtep " + " ".join(f"{a:5.1f}" for a in acc_t) + " | PyCIL "
              + " ".join(f"{a:5.1f}" for a in theirs), flush=True)
    increments = parse_increments(args.increments)
    per_class = [int((data.y_train == c).sum()) for c in range(args.classes)]
    counts = [sum(per_class[sum(increments[:t]):sum(increments[:t + 1])]) for t in range(len(increments))]
    images = training_images(counts, args.memory, args.epochs)
    for t in range(len(increments)):
        ours, theirs = [r[t] for r in rows["gtep"]], [r[t] for r in rows["PyCIL"]]
        print(f"  after task {t + 1}: gtep {mean_std(ours)}  PyCIL {mean_std(theirs)}")
    finals = {k: [r[-1] for r in v] for k, v in rows.items()}
    averages = {k: [statistics.mean(r) for r in v] for k, v in rows.items()}
    for name, values in (("final Acc", finals), ("AvgAcc", averages)):
        diff, low, high, p = difference(values["gtep"], values["PyCIL"])
        print(f"  {name}: gtep {mean_std(values['gtep'])}  PyCIL {mean_std(values['PyCIL'])}  "
              f"difference {diff:+.2f} [{low:+.2f}, {high:+.2f}] (95%), Welch p = {p:.3f}")
    rates = {k: images / statistics.mean(v) for k, v in seconds.items()}
    print(f"  training images/s: gtep {rates['gtep']:.0f}, PyCIL {rates['PyCIL']:.0f}", flush=True)
    diff, _, _, p = difference(finals["gtep"], finals["PyCIL"])
    return diff, p


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pycil", required=True, help="a checkout of upstream PyCIL (G-U-N/PyCIL)")
    parser.add_argument("--algorithm", action="append", help="gtep method name; repeat for several (default replay)")
    parser.add_argument("--dataset", default="npz:../shared/data/tinyimagenet200_32.npz")
    parser.add_argument("--classes", type=int, default=30)
    parser.add_argument("--increments", default="10x3")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--weight-decay", type=float, default=5e-4)
    parser.add_argument("--memory", type=int, default=300)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    if not (Path(args.pycil) / "utils" / "data_manager.py").is_file():
        parser.error(f"--pycil {args.pycil} is not a PyCIL checkout (no utils/data_manager.py); give its folder")
    if not args.dataset.startswith("npz:"):
        parser.error("--dataset: the PyCIL side reads npz files only (npz:PATH)")
    args.backbone, args.device, args.augment = "resnet32", "cpu", "pycil-cifar"
    torch.set_num_threads(args.threads)
    npz = str(Path(args.dataset[len("npz:"):]).resolve())
    data = resolve_dataset(args.dataset).load().subset(list(range(args.classes)))
    verdict = []
    for method in args.algorithm or ["replay"]:
        verdict.append((method, *compare(args, method, data, npz)))
    worst = max(verdict, key=lambda row: abs(row[1]))
    significant = [m for m, _, p in verdict if not math.isnan(p) and p < 0.05]
    print(f"verdict: largest |final Acc difference| {abs(worst[1]):.2f} points ({worst[0]}); "
          + (f"significant at 5% for {', '.join(significant)}" if significant else "none significant at 5%"))


if __name__ == "__main__":
    main()
