"""gtep against upstream PyCIL on identical work, method by method, with statistics (issue 33).

For each `--algorithm` and seed s (seeds 0..N-1): the first `--classes` classes of the npz dataset, split by
`--increments`, in gtep's class order of ordering 0 for seed s (PyCIL gets that order); one recipe in both
toolboxes (`recipe_for` below: `--epochs` for every task, the first included, SGD at `--lr` with momentum 0.9,
`--weight-decay`, `--batch`, decayed 10x at 50% and 75% of the epochs, or a cosine schedule for the methods whose
PyCIL code has one; the methods' extra stages scaled from PyCIL's defaults by epochs / PyCIL's epochs), `--memory`
exemplars in total, the PyCIL CIFAR pipeline (gtep's `pycil-cifar`, PyCIL's iCIFAR100 transforms), ResNet-32
(PyCIL's cosine and MEMO variants where its method needs them). gtep runs its engine's ordering in this process;
PyCIL runs at the same time in a subprocess from the checkout given by `--pycil` (benchmarks/pycil_side.py says
what it sets from outside PyCIL's files, and why), each with one thread, so that machine load hits both alike.

Every run's result is kept in `--results` (one JSON file per method, toolbox and seed, under a folder named by the
setting), so an interrupted comparison resumes where it stopped and `--table` prints the comparison from what is
there without training. Prints, per method: Acc after each task and AvgAcc as mean +- std over seeds for both, the
difference (gtep - PyCIL) with its 95% interval and Welch's p, training images per second for both (training
images x epochs over the seconds of the whole ordering, evaluations included, counted the same way for both); the
last line is the verdict: the largest |difference| of final Acc over methods and whether any is significant at 5%.
`--markdown` prints the tables README and docs/benchmarks.md show instead (final Acc, then AvgAcc and speed).

    .venv/bin/python benchmarks/reference_compare.py --pycil /path/to/PyCIL --algorithm replay --seeds 5 \\
        --classes 30 --increments 10x3 --epochs 12 --batch 32 --lr 0.05
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
from dataclasses import dataclass, field
from pathlib import Path

for _key, _value in (("RAY_AUTH_MODE", "disabled"), ("HF_HUB_OFFLINE", "1")):
    os.environ.setdefault(_key, _value)

HERE = Path(__file__).resolve().parent

import torch  # noqa: E402
import yaml  # noqa: E402

from gtep.data import resolve_dataset  # noqa: E402
from gtep.engine.runner import FirstTaskSpec, OrderingJob, OrderingRun  # noqa: E402
from gtep.protocol.scenarios import parse_increments  # noqa: E402

METHODS = ("replay", "icarl", "bic", "wa", "podnet", "der", "foster", "beef", "memo")  # against PyCIL
VIT_METHODS = ("simplecil", "ranpac")  # against LAMDA-PILOT (what of PILOT runs on a small ViT: docs/benchmarks.md)
# methods whose PyCIL reports a model other than the one it goes on with: FOSTER's teacher (the boosted model), where
# gtep reports the compressed student; their reference runs also record the student ("student_acc_t")
STUDENT_METHODS = {"foster"}
NME_METHODS = {"icarl"}  # methods whose reported accuracy is the nearest-mean classifier's, in both toolboxes


SIDES = ("gtep", "reference")


def reference_of(method: str) -> str:
    return "PILOT" if method in VIT_METHODS else "PyCIL"


@dataclass
class MethodRecipe:
    """One method's recipe in both toolboxes' terms."""

    scheduler: str = "steplr"  # every task's, the first included
    gtep: dict = field(default_factory=dict)  # hyperparameters beyond the common ones
    pycil_name: str = ""  # the reference toolbox's factory name
    pycil_backbone: str = "resnet32"
    pycil_args: dict = field(default_factory=dict)  # entries of the toolbox's args dict (its json config)
    pycil_globals: dict = field(default_factory=dict)  # module globals of the toolbox's method file


def scaled(epochs: int, pycil_stage: int, pycil_epochs: int) -> int:
    """A method's extra stage, as long relative to the main epochs as in PyCIL's defaults."""
    return max(1, round(epochs * pycil_stage / pycil_epochs))


def recipe_for(method: str, args: argparse.Namespace) -> MethodRecipe:
    """The recipe of `method` at this setting. PyCIL keeps the recipes of replay, iCaRL, BiC, WA, PODNet and DER
    in module globals and those of FOSTER, BEEF and MEMO in its json args; the values here are the same numbers."""
    e, lr, wd, batch = args.epochs, args.lr, args.weight_decay, args.batch
    steps = [max(1, e // 2), max(1, e * 3 // 4)]
    step_globals = {"init_epoch": e, "init_lr": lr, "init_milestones": steps, "init_lr_decay": 0.1,
                    "init_weight_decay": wd, "epochs": e, "lrate": lr, "milestones": steps, "lrate_decay": 0.1,
                    "batch_size": batch, "weight_decay": wd}
    if method in ("replay", "icarl", "wa", "der"):
        return MethodRecipe(pycil_name=method, pycil_globals=step_globals)
    if method == "bic":  # PyCIL's BiC trains every stage, bias correction included, for `epochs`
        return MethodRecipe(gtep={"bias_epochs": e, "split_ratio": 0.1, "T": 2.0, "lambda_kd": 0.0},
                            pycil_name="bic", pycil_globals={
                                **{k: v for k, v in step_globals.items() if not k.startswith("init_")},
                                "split_ratio": 0.1, "T": 2})
    if method == "podnet":  # cosine schedule; class-balanced fine-tuning 20 of 160 epochs at 0.005. The network is
        # gtep's resnet32 in both: PyCIL's podnet.json picks cosine_resnet32 (no last ReLU, 1x1-conv shortcuts),
        # which gtep does not have; the same network keeps the comparison on the method
        ft = scaled(e, 20, 160)
        return MethodRecipe("cosine", {"ft_epochs": ft, "ft_lr": 0.005}, "podnet", "resnet32",
                            pycil_globals={"epochs": e, "lrate": lr, "ft_epochs": ft, "ft_lrate": 0.005,
                                           "batch_size": batch, "weight_decay": wd})
    if method == "foster":  # cosine; compression 130 of 170 epochs
        squeeze = scaled(e, 130, 170)
        return MethodRecipe("cosine", {"compression_epochs": squeeze, "beta1": 0.96, "beta2": 0.97, "T": 2.0},
                            "foster", pycil_args={
                                "init_epochs": e, "init_lr": lr, "init_weight_decay": wd, "boosting_epochs": e,
                                "compression_epochs": squeeze, "lr": lr, "batch_size": batch, "weight_decay": wd,
                                "beta1": 0.96, "beta2": 0.97, "oofc": "ft", "is_teacher_wa": False,
                                "is_student_wa": False, "lambda_okd": 1, "wa_value": 1, "T": 2})
    if method == "beef":  # cosine; fusion 60 of 170 epochs
        fusion = scaled(e, 60, 170)
        return MethodRecipe("cosine", {"fusion_epochs": fusion, "energy_weight": 0.01, "logits_alignment": 1.7},
                            "beefiso", pycil_args={
                                "init_epochs": e, "init_lr": lr, "init_weight_decay": wd, "expansion_epochs": e,
                                "fusion_epochs": fusion, "lr": lr, "batch_size": batch, "weight_decay": wd,
                                "logits_alignment": 1.7, "energy_weight": 0.01, "is_compress": False,
                                "reduce_batch_size": False, "T": 2})
    if method == "memo":
        return MethodRecipe(gtep={"train_base": True}, pycil_name="memo", pycil_backbone="memo_resnet32",
                            pycil_args={"init_epoch": e, "init_lr": lr, "init_milestones": steps, "init_lr_decay": 0.1,
                                        "init_weight_decay": wd, "epochs": e, "lrate": lr, "milestones": steps,
                                        "lrate_decay": 0.1, "batch_size": batch, "weight_decay": wd,
                                        "scheduler": "steplr", "t_max": None, "train_base": True,
                                        "train_adaptive": False, "debug": False, "skip": False, "alpha_aux": 1.0})
    if method == "simplecil":  # no training: prototypes of the frozen ViT's features
        return MethodRecipe(pycil_name="simplecil", pycil_backbone=args.vit,
                            pycil_args={"tuned_epoch": 0, "init_lr": 0.01, "batch_size": 128, "weight_decay": 0.05,
                                        "min_lr": 1e-8, "optimizer": "sgd"})
    if method == "ranpac":  # no first-session adaptation (PILOT's PETL blocks are ViT-B/16's): RP + ridge only
        return MethodRecipe("constant", {"epochs": 0, "M": args.rp_dim}, "ranpac", args.vit, pycil_args={
            "tuned_epoch": 0, "init_lr": 0.01, "batch_size": 128, "weight_decay": 0.0005, "min_lr": 0.0,
            "optimizer": "sgd", "use_RP": True, "M": args.rp_dim, "use_simplecil": False})
    raise SystemExit(f"--algorithm {method}: no recipe; choose from {', '.join(METHODS + VIT_METHODS)}")


def training_images(counts: list[int], memory: int, epochs: int) -> int:
    """Images through training over an ordering: each task's images plus the exemplars replayed, times the epochs."""
    total, seen = 0, 0
    for n in counts:
        total += (n + min(memory, seen)) * epochs
        seen += n
    return total


def ablation(args: argparse.Namespace) -> dict[str, object]:
    """--gtep-set NAME=VALUE as hyperparameters (YAML scalars: 0, 0.5, true, cosine)."""
    changed = {}
    for item in getattr(args, "gtep_set", []):
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise SystemExit(f"--gtep-set {item!r}: write NAME=VALUE, e.g. nca_margin=0")
        changed[name] = yaml.safe_load(value)
    return changed


def ablation_suffix(args: argparse.Namespace) -> str:
    changed = sorted(getattr(args, "gtep_set", []))
    return "[" + ",".join(changed) + "]" if changed else ""


def gtep_job(args: argparse.Namespace, method: str, seed: int) -> OrderingJob:
    recipe = recipe_for(method, args)
    vit = method in VIT_METHODS
    milestones = (max(1, args.epochs // 2), max(1, args.epochs * 3 // 4))
    hparams = {"epochs": args.epochs, "lr": args.lr, "batch_size": args.batch, "weight_decay": args.weight_decay,
               "scheduler": recipe.scheduler, "milestones": milestones, "lr_decay": 0.1, "optimizer": "sgd",
               "momentum": 0.9, **recipe.gtep, **ablation(args)}
    first = FirstTaskSpec(epochs=args.epochs, lr=args.lr, milestones=milestones, lr_decay=0.1,
                          weight_decay=args.weight_decay, batch_size=args.batch, scheduler=recipe.scheduler)
    return OrderingJob(method, hparams, args.vit if vit else "resnet32", tuple(parse_increments(args.increments)),
                       tuple(range(args.classes)), seed=seed, ordering=0, memory_size=0 if vit else args.memory,
                       first_task=first, device="cpu", dataset=args.dataset,
                       augment="pilot@32" if vit else "pycil-cifar", weights=args.vit_weights if vit else None)


def reference_job(args: argparse.Namespace, method: str, seed: int, order: list[int], npz: str,
                  normalise: tuple[list[float], list[float]]) -> dict:
    """The job file reference_side.py runs: the reference toolbox's method on the same classes, order and recipe."""
    recipe = recipe_for(method, args)
    increments = parse_increments(args.increments)
    toolbox = reference_of(method).lower()
    job = {"toolbox": toolbox, "method": recipe.pycil_name, "backbone": recipe.pycil_backbone, "npz": npz,
           "class_order": order, "increments": [increments[0], increments[1] if len(increments) > 1 else increments[0]],
           "memory": args.memory, "seed": seed, "threads": 1, "args": recipe.pycil_args,
           "globals": recipe.pycil_globals, "mean": normalise[0], "std": normalise[1]}
    if toolbox == "pilot":
        job.update(memory=0, weights=str(Path(args.vit_weights).resolve()), image_size=32)
    return job


def start_reference(args: argparse.Namespace, method: str, seed: int, order: list[int], npz: str,
                    normalise: tuple[list[float], list[float]], scratch: Path) -> subprocess.Popen:
    """The reference toolbox's method on the same classes, order and recipe, started in a subprocess
    (reference_side.py)."""
    job = reference_job(args, method, seed, order, npz, normalise)
    toolbox = job["toolbox"]
    (scratch / "job.json").write_text(json.dumps(job))
    checkout = args.pilot if toolbox == "pilot" else args.pycil
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(checkout).resolve()), str(HERE)])}
    return subprocess.Popen([sys.executable, str(HERE / "reference_side.py"), "job.json", "result.json"],
                            cwd=scratch, env=env, stdout=subprocess.DEVNULL, stderr=open(scratch / "stderr.txt", "w"))


def run_pair(args: argparse.Namespace, method: str, seed: int, data, npz: str,
             sides: tuple[str, ...] = SIDES) -> dict[str, dict]:
    """One seed in both toolboxes at once; {"gtep" | "reference": {"acc_t": [...] in %, "seconds": s}}.
    With fewer `sides`, those alone: gtep for an ablation whose reference run is stored, the reference for a stored
    run that lacks what the table now reads (a FOSTER run without its student's accuracies)."""
    with_reference = "reference" in sides
    run = OrderingRun(gtep_job(args, method, seed), data)
    order = [c for task in run.tasks for c in task.new_classes]
    with tempfile.TemporaryDirectory() as folder:
        scratch = Path(folder)
        pipeline = run.images.pipeline  # the reference divides by what gtep's run divides by
        normalise = (pipeline.mean.flatten().tolist(), pipeline.std.flatten().tolist())
        reference = start_reference(args, method, seed, order, npz, normalise, scratch) if with_reference else None
        pair: dict[str, dict] = {}
        if "gtep" in sides:
            tic = time.perf_counter()
            for task in run.tasks:
                run.train_task(task)
            outcome = run.finish()
            pair["gtep"] = {"acc_t": [100 * a for a in outcome.metrics.get("acc_t", [])],
                            "seconds": time.perf_counter() - tic, "diverged": bool(outcome.diverged)}
        if reference is None:
            return pair
        if reference.wait() != 0:
            raise SystemExit(f"{reference_of(method)}'s {method} failed (seed {seed}):\n"
                             f"{(scratch / 'stderr.txt').read_text()[-3000:]}")
        result = json.loads((scratch / "result.json").read_text())
    acc = result["nme_t"] if method in NME_METHODS else result["acc_t"]
    pair["reference"] = {"acc_t": [float(a) for a in acc], "seconds": float(result["seconds"])}
    if "student_acc_t" in result:
        pair["reference"]["student_acc_t"] = [float(a) for a in result["student_acc_t"]]
    return pair


def setting_folder(args: argparse.Namespace) -> Path:
    name = (f"{Path(args.dataset.split(':', 1)[-1]).stem}-c{args.classes}-{args.increments}-e{args.epochs}"
            f"-lr{args.lr:g}-b{args.batch}-wd{args.weight_decay:g}-m{args.memory}")
    return Path(args.results) / name


def result_path(args: argparse.Namespace, method: str, side: str, seed: int) -> Path:
    """side: "gtep" or "reference" (stored under the toolbox's name)."""
    toolbox = "gtep" if side == "gtep" else reference_of(method).lower()
    folder = method
    if side == "gtep":  # an ablation changes gtep's side only; the reference's runs are the method's
        folder += ablation_suffix(args)
    if method in VIT_METHODS:  # the ViT and its weights are part of the setting
        folder += f"-{args.vit}-{Path(args.vit_weights or 'no-weights').stem}" + (
            f"-M{args.rp_dim}" if method == "ranpac" else "")
    return setting_folder(args) / folder / f"{toolbox}-seed{seed}.json"


def ensure_runs(args: argparse.Namespace, method: str, data, npz: str) -> None:
    """Train the seeds whose results are missing, writing each as soon as it is done."""
    torch.set_num_threads(1)
    for seed in range(args.seeds):
        paths = {t: result_path(args, method, t, seed) for t in SIDES}
        missing = tuple(t for t in SIDES if not stored_complete(paths[t], method, t))
        if not missing:
            continue
        pair = run_pair(args, method, seed, data, npz, missing)
        for toolbox, path in paths.items():
            if toolbox not in pair:
                continue
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps({"method": method, "toolbox": toolbox, "seed": seed, **pair[toolbox]}))
        names = {"gtep": "gtep", "reference": reference_of(method)}
        print(f"{method} seed {seed}: " + " | ".join(
            f"{names[t]} " + " ".join(f"{a:5.1f}" for a in pair[t]["acc_t"]) for t in SIDES if t in pair), flush=True)


def stored_complete(path: Path, method: str, side: str) -> bool:
    """A stored run with everything the table reads: a FOSTER reference run stored before the student's accuracies
    were recorded is trained again (the same seed gives the same teacher accuracies, and now the student's too)."""
    if not path.is_file():
        return False
    return not (side == "reference" and method in STUDENT_METHODS
                and "student_acc_t" not in json.loads(path.read_text()))


def load_runs(args: argparse.Namespace, method: str) -> dict[str, list[dict]]:
    runs: dict[str, list[dict]] = {t: [] for t in SIDES}
    for seed in range(args.seeds):
        for toolbox in SIDES:
            path = result_path(args, method, toolbox, seed)
            if path.is_file():
                runs[toolbox].append(json.loads(path.read_text()))
    return runs


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
    if se < 1e-9:  # no spread on either side (a deterministic method): equal or not, nothing to test
        return diff, diff, diff, 1.0 if abs(diff) < 1e-9 else 0.0
    # imported here, not at the top: benchmarks/gpu_speed.py imports this module on a device without scipy
    from scipy import stats

    dof = (va + vb) ** 2 / (va ** 2 / (len(ours) - 1) + vb ** 2 / (len(theirs) - 1))
    half = stats.t.ppf(0.975, dof) * se
    p = stats.ttest_ind(ours, theirs, equal_var=False).pvalue
    return diff, diff - half, diff + half, float(p)


@dataclass
class Comparison:
    """One method's runs in both toolboxes, summarised."""

    method: str
    seeds: int
    acc_t: dict[str, list[list[float]]]  # toolbox -> per seed, Acc after each task
    rate: dict[str, float]  # toolbox -> training images per second

    def finals(self, toolbox: str) -> list[float]:
        return [row[-1] for row in self.acc_t[toolbox]]

    def averages(self, toolbox: str) -> list[float]:
        return [statistics.mean(row) for row in self.acc_t[toolbox]]

    def final_difference(self) -> tuple[float, float, float, float]:
        return difference(self.finals("gtep"), self.finals("reference"))

    label: str = ""  # the method with its ablation, as printed

    def __post_init__(self) -> None:
        self.label = self.label or self.method

    @property
    def reference(self) -> str:
        return reference_of(self.method)


def summarise(args: argparse.Namespace, method: str, images: int, student: bool = False) -> Comparison | None:
    """The method's comparison over the seeds present in both toolboxes (None when there is none); with `student`,
    against the reference's student (STUDENT_METHODS; None unless every stored reference run recorded it)."""
    runs = load_runs(args, method)
    if student:
        if not runs["reference"] or any("student_acc_t" not in r for r in runs["reference"]):
            return None
        runs["reference"] = [{**r, "acc_t": r["student_acc_t"]} for r in runs["reference"]]
    for side in SIDES:  # a diverged run (gtep records it; its accuracies stop) is reported, not averaged
        for r in runs[side]:
            if r.get("diverged") or len(r["acc_t"]) != len(parse_increments(args.increments)):
                print(f"{method} seed {r['seed']}: {side} diverged or incomplete, left out of the statistics")
        runs[side] = [r for r in runs[side]
                      if not r.get("diverged") and len(r["acc_t"]) == len(parse_increments(args.increments))]
    seeds = sorted({r["seed"] for r in runs["gtep"]} & {r["seed"] for r in runs["reference"]})
    if not seeds:
        return None
    kept = {t: [r for r in runs[t] if r["seed"] in seeds] for t in SIDES}
    # both references report top-1 in % rounded to 2 decimals; gtep's float32 fractions are compared at that precision
    acc_t = {t: [[round(a, 2) for a in r["acc_t"]] for r in kept[t]] for t in SIDES}
    label = method + ablation_suffix(args) + (f" ({reference_of(method)}'s student)" if student else "")
    return Comparison(method, len(seeds), acc_t,
                      {t: images / statistics.mean(r["seconds"] for r in kept[t]) for t in SIDES}, label)


def print_comparison(c: Comparison) -> None:
    print(f"{c.label} ({c.seeds} seeds):")
    for t in range(len(c.acc_t["gtep"][0])):
        ours, theirs = [r[t] for r in c.acc_t["gtep"]], [r[t] for r in c.acc_t["reference"]]
        print(f"  after task {t + 1}: gtep {mean_std(ours)}  {c.reference} {mean_std(theirs)}")
    for name, pick in (("final Acc", c.finals), ("AvgAcc", c.averages)):
        diff, low, high, p = difference(pick("gtep"), pick("reference"))
        print(f"  {name}: gtep {mean_std(pick('gtep'))}  {c.reference} {mean_std(pick('reference'))}  "
              f"difference {diff:+.2f} [{low:+.2f}, {high:+.2f}] (95%), Welch p = {p:.3f}")
    print(f"  training images/s: gtep {c.rate['gtep']:.0f}, {c.reference} {c.rate['reference']:.0f}", flush=True)


def markdown_row(cells: list[str]) -> str:
    return "| " + " | ".join(" ".join(cell.replace("+-", "±").split()) for cell in cells) + " |"


def print_markdown(rows: list[Comparison]) -> None:
    """Two tables, the final Acc comparison and then AvgAcc with the speed: as one table of ten columns the
    documentation site could not show it whole at 1,400 px (issue 45)."""
    print("| method | reference | seeds | final Acc gtep | final Acc reference | difference [95%] | Welch p |")
    print("|---|---|---|---|---|---|---|")
    for c in rows:
        diff, low, high, p = c.final_difference()
        print(markdown_row([c.label, c.reference, str(c.seeds), mean_std(c.finals("gtep")),
                            mean_std(c.finals("reference")),
                            f"{diff:+.2f}" + ("" if math.isnan(low) else f" [{low:+.2f}, {high:+.2f}]"),
                            "-" if math.isnan(p) else f"{p:.3f}"]))
    print()
    print("| method | AvgAcc gtep | AvgAcc reference | images/s gtep / reference |")
    print("|---|---|---|---|")
    for c in rows:
        print(markdown_row([c.label, mean_std(c.averages("gtep")), mean_std(c.averages("reference")),
                            f"{c.rate['gtep']:.0f} / {c.rate['reference']:.0f}"]))


def like_for_like(rows: list[Comparison]) -> list[Comparison]:
    """The rows that compare the same model: a method's row against the reference's student replaces its row
    against the teacher."""
    with_student = {c.method for c in rows if c.label.endswith("'s student)")}
    return [c for c in rows if c.method not in with_student or c.label.endswith("'s student)")]


def verdict(rows: list[Comparison]) -> str:
    finals = [(c.label, *c.final_difference()) for c in like_for_like(rows)]
    worst = max(finals, key=lambda row: abs(row[1]))
    significant = [m for m, _, _, _, p in finals if not math.isnan(p) and p < 0.05]
    return (f"verdict: largest |final Acc difference| {abs(worst[1]):.2f} points ({worst[0]}); "
            + (f"significant at 5% for {', '.join(significant)}" if significant else "none significant at 5%"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pycil", help="a checkout of upstream PyCIL (G-U-N/PyCIL), for the ResNet methods")
    parser.add_argument("--pilot", help="a checkout of LAMDA-PILOT (sun-hailong/LAMDA-PILOT), for the ViT methods")
    parser.add_argument("--algorithm", action="append",
                        help=f"repeat for several; 'all' = {', '.join(METHODS)}; 'vit' = {', '.join(VIT_METHODS)}")
    parser.add_argument("--vit", default="vit_micro_patch4_32", help="the ViT methods' backbone (a timm ViT)")
    parser.add_argument("--vit-weights", help="its local weights (gtep pretrain on classes kept out of --classes)")
    parser.add_argument("--rp-dim", type=int, default=2000, help="RanPAC's random-projection width M")
    parser.add_argument("--dataset", default="npz:../shared/data/tinyimagenet200_32.npz")
    parser.add_argument("--classes", type=int, default=30)
    parser.add_argument("--increments", default="10x3")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--weight-decay", type=float, default=5e-4)
    parser.add_argument("--memory", type=int, default=300)
    parser.add_argument("--results", default=str(HERE / "results" / "reference_compare"),
                        help="folder of the runs' results (kept; a rerun trains only what is missing)")
    parser.add_argument("--table", action="store_true", help="print the comparison of the stored runs; train nothing")
    parser.add_argument("--markdown", action="store_true",
                        help="print the table of README and docs/benchmarks.md (implies --table)")
    parser.add_argument("--gtep-set", action="append", default=[], metavar="NAME=VALUE",
                        help="an ablation: this hyperparameter of gtep's method changed (repeat it); stored as "
                             "METHOD[NAME=VALUE] beside the method and compared with the same reference runs")
    args = parser.parse_args()
    groups = {"all": METHODS, "vit": VIT_METHODS}
    methods = [m for name in (args.algorithm or ["replay"]) for m in groups.get(name, (name,))]
    for method in methods:
        recipe_for(method, args)  # an unknown method is refused before anything trains
    if not args.dataset.startswith("npz:"):
        parser.error("--dataset: the PyCIL side reads npz files only (npz:PATH)")
    train = not (args.table or args.markdown)
    for option, toolbox in (("--pycil", "PyCIL"), ("--pilot", "PILOT")):
        checkout = getattr(args, option[2:])
        needed = train and any(reference_of(m) == toolbox for m in methods)
        if needed and not (checkout and (Path(checkout) / "utils" / "data_manager.py").is_file()):
            parser.error(f"{option} {checkout}: not a {toolbox} checkout (no utils/data_manager.py); give its folder")
    if train and any(m in VIT_METHODS for m in methods) and not (args.vit_weights and Path(args.vit_weights).is_file()):
        parser.error(f"--vit-weights {args.vit_weights}: give the ViT's local weights (gtep pretrain ... --out FILE)")
    npz = str(Path(args.dataset[len("npz:"):]).resolve())
    data = resolve_dataset(args.dataset).load().subset(list(range(args.classes)))
    increments = parse_increments(args.increments)
    per_class = [int((data.y_train == c).sum()) for c in range(args.classes)]
    counts = [sum(per_class[sum(increments[:t]):sum(increments[:t + 1])]) for t in range(len(increments))]
    rows = []
    for method in methods:
        if train:
            ensure_runs(args, method, data, npz)
        # the ViT methods encode each training image once (no epochs, no replay)
        images = sum(counts) if method in VIT_METHODS else training_images(counts, args.memory, args.epochs)
        comparison = summarise(args, method, images)
        if comparison is None:
            print(f"{method}: no stored runs at this setting in {setting_folder(args)}")
            continue
        method_rows = [comparison]
        if method in STUDENT_METHODS and (student := summarise(args, method, images, student=True)):
            method_rows.append(student)
        rows += method_rows
        if not args.markdown:
            for row in method_rows:
                print_comparison(row)
    if args.markdown and rows:
        print_markdown(rows)
    if rows:
        print(verdict(rows))


if __name__ == "__main__":
    main()
