"""Which tuning shortcut is safe, across many studies (issue 49, item 3).

Runs a matrix of CPU-sized studies, each with every tuned set evaluated on D^E (`evaluation.sets: all`), and keeps
each study's regret table (gtep/protocol/regret.py: the set each protocol picks, its compute relative to the full
study, its regret) as one JSON file in benchmarks/results/protocol_atlas/. Then, over every stored study, it prints
per protocol: the median and worst regret (points below the best evaluated set), the share of studies whose pick
is within 1 point of the full study's H* on D^E, the median compute fraction, and the verdict: which protocols
reach an H* within 1 point at no more than 0.4 of the compute in at least 90% of the studies.

The matrix (22 studies): class-incremental ResNet-8 learners (replay, icarl, wa) on two scenarios (5x3, 3x5) and two
dataset pairings (Tiny ImageNet split in two: high similarity; Tiny ImageNet then Omniglot: low), two ViT learners
(l2p, ranpac on a micro ViT pretrained by the study's pretrain section), and two learners of each other family
(fscil, iirc, cfsl, fluid) on their CPU presets. R = 6 sets, S = 3 orderings, every epoch count as the presets
scale it, times EPOCH_SHARE.

Resumable: a study whose result file exists is skipped; one whose folder exists is resumed (`gtep run --resume`),
so the atlas can run a few studies per session in the background and grow until it has them all.

    .venv/bin/python benchmarks/protocol_atlas.py --max-studies 3      # run up to 3 more studies, then the table
    .venv/bin/python benchmarks/protocol_atlas.py --table-only          # the table over the stored studies
    .venv/bin/python benchmarks/protocol_atlas.py --list                # the matrix and what is done
    .venv/bin/python benchmarks/protocol_atlas.py --markdown            # the table as the docs show it
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from statistics import median
from typing import Any, Callable

import yaml

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "protocol_atlas"
DATA = Path(os.environ.get("GTEP_SHARED_DATA", ROOT.parent / "shared" / "data"))
TINY = f"npz:{DATA / 'tinyimagenet200_32.npz'}"
R, S = 6, 3
# Every study trains at this share of its preset's epochs (training.epoch_scale x EPOCH_SHARE): on the shared 2-core
# machine the first study, at the preset's own scale, took 818 s and an IIRC one about 1.5 h; at 0.4 the matrix fits
# a few sessions. Each result records the scale it ran at.
EPOCH_SHARE = 0.4
WITHIN = 0.01  # 1 point, in the scores' fraction units
MAX_COMPUTE, SHARE = 0.4, 0.9  # the verdict's bar: <= 0.4 of the compute in >= 90% of the studies
REFERENCE = ("gtep (full)", "conventional", "random")  # not shortcuts: the reference, the optimistic, the floor


# ---------------------------------------------------------------- the matrix

def preset(name: str) -> dict[str, Any]:
    """A shipped preset as a plain mapping (its ${TINYIMAGENET_NPZ} pointed at the shared data)."""
    from gtep.config import load_preset

    os.environ.setdefault("TINYIMAGENET_NPZ", str(DATA / "tinyimagenet200_32.npz"))
    os.environ.setdefault("VIT_MICRO_WEIGHTS", "replaced-by-a-pretrain-section")  # the ViT preset's; dropped below
    return json.loads(load_preset(name).model_dump_json(exclude_none=True))


def sized(config: dict[str, Any], study: str, algorithm: str) -> dict[str, Any]:
    """Every study: R sets over S orderings, two trials at once, every set evaluated."""
    training = config.get("training", {})
    return {**config, "study": study, "algorithm": algorithm,
            "search": {**config.get("search", {}), "trials": R, "orderings": S},
            "training": {**training, "epoch_scale": float(training.get("epoch_scale", 1.0)) * EPOCH_SHARE},
            "compute": {**config.get("compute", {}), "cpus_per_trial": 1, "max_concurrent": 2},
            "evaluation": {"sets": "all"}}


def class_incremental(algorithm: str, increments: str, pairing: str) -> dict[str, Any]:
    base = preset("tinyimagenet-smoke")
    base["scenario"] = {**base["scenario"], "increments": increments}
    if pairing == "low":  # two datasets: 15 Tiny ImageNet classes for tuning, 15 Omniglot characters to evaluate
        base["datasets"] = {"tuning": {"dataset": TINY, "classes": list(range(15))},
                            "evaluation": {"dataset": "omniglot-small", "classes": list(range(15))}}
    return sized(base, f"atlas-ci-{algorithm}-{increments}-{pairing}", algorithm)


# Hyperparameters whose shipped values size a learner for a GPU: on the micro ViT (96 features) RanPAC's
# random projection of 5,000-20,000 units made each trial an 8 GiB process solving 17 ridge systems of up to
# 20,000 x 20,000 a task (hours a unit on one core). The atlas keeps the grid's shape at a tenth of its width.
CPU_SIZED = {"ranpac": {"M": [500, 1000, 1500, 2000]}}


def cpu_sized_space(algorithm: str, runs: Path) -> Path | None:
    """The shipped search space with CPU_SIZED's values in place, written beside the study; None if unchanged."""
    if algorithm not in CPU_SIZED:
        return None
    space = yaml.safe_load((ROOT / "search_spaces" / f"{algorithm}.yaml").read_text())
    space["space"] = {**space["space"], **CPU_SIZED[algorithm]}
    path = runs / f"{algorithm}-cpu-space.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(space, sort_keys=False))
    return path


def vision_transformer(algorithm: str, runs: Path) -> dict[str, Any]:
    """The ViT preset with its backbone pretrained by the study (classes 100-199, kept out of both phases)."""
    base = preset("tinyimagenet-vit-smoke")
    base.pop("weights", None)
    base["pretrain"] = {"dataset": TINY, "classes": list(range(100, 200)), "epochs": 3}
    space = cpu_sized_space(algorithm, runs)
    if space is not None:
        base["search"] = {**base.get("search", {}), "space": str(space)}
    return sized(base, f"atlas-vit-{algorithm}", algorithm)


def family(name: str, algorithm: str) -> dict[str, Any]:
    return sized(preset(name), f"atlas-{preset(name)['scenario']['family']}-{algorithm}", algorithm)


def matrix(runs: Path = ROOT / "gtep-runs" / "protocol-atlas") -> dict[str, Callable[[], dict[str, Any]]]:
    """Study name -> its config (built when run, so --list needs no data)."""
    cells: dict[str, Callable[[], dict[str, Any]]] = {}
    for pairing in ("high", "low"):
        for increments in ("5x3", "3x5"):
            for algorithm in ("replay", "icarl", "wa"):
                cells[f"atlas-ci-{algorithm}-{increments}-{pairing}"] = (
                    lambda a=algorithm, i=increments, p=pairing: class_incremental(a, i, p))
    for algorithm in ("l2p", "ranpac"):
        cells[f"atlas-vit-{algorithm}"] = lambda a=algorithm: vision_transformer(a, runs)
    # IIRC last: its studies are the longest (every task of a long hierarchy, multi-label evaluation)
    for name, family_name, algorithms in (("tinyimagenet-fscil", "fscil", ("replay", "frozen_prototypes")),
                                          ("omniglot-cfsl", "cfsl", ("cfsl_prototypes", "cfsl_finetune")),
                                          ("tinyimagenet-fluid", "fluid", ("fluid_et", "fluid_ncm")),
                                          ("omniglot-iirc", "iirc", ("iirc_replay", "iirc_finetune"))):
        for algorithm in algorithms:
            cells[f"atlas-{family_name}-{algorithm}"] = lambda n=name, a=algorithm: family(n, a)
    return cells


# ---------------------------------------------------------------- running a study

def gtep(*argv: str, log: Path) -> None:
    exe = Path(sys.executable).with_name("gtep")
    command = [str(exe)] if exe.exists() else [sys.executable, "-m", "gtep.cli"]
    with open(log, "a") as out:
        subprocess.run([*command, *argv], check=True, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)


def run_study(name: str, config: dict[str, Any], runs: Path) -> dict[str, Any]:
    """Run (or resume) one study with every set evaluated; its result as the file stores it."""
    runs.mkdir(parents=True, exist_ok=True)
    folder, log = runs / name, runs / f"{name}.log"
    start = time.perf_counter()
    if (folder / "manifest.json").exists():
        gtep("run", "--resume", str(folder), log=log)
    else:
        path = runs / f"{name}.yaml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        gtep("run", "--config", str(path), "--output", str(runs), log=log)
    table = json.loads((folder / "protocol_regret.json").read_text())
    return {"study": name, "family": config["scenario"].get("family", "class_incremental"),
            "algorithm": config["algorithm"], "backbone": config["backbone"],
            "scenario": config["scenario"].get("increments", config["scenario"].get("family")),
            "datasets": config["datasets"], "trials": R, "orderings": S,
            "epoch_scale": config.get("training", {}).get("epoch_scale"),
            "space_changes": CPU_SIZED.get(config["algorithm"], {}),
            "wall_seconds": round(time.perf_counter() - start, 1), **table}


# ---------------------------------------------------------------- the table

def rows_by_protocol(results: list[dict[str, Any]]) -> dict[str, list[tuple[float, float, float]]]:
    """'protocol (options)' -> per study (regret, loss against the full study's H*, compute fraction)."""
    out: dict[str, list[tuple[float, float, float]]] = {}
    for result in results:
        full = next(r for r in result["protocols"] if r["protocol"] == "gtep (full)")
        for row in result["protocols"]:
            if row["regret"] is None or math.isnan(float(row["regret"])):
                continue  # not applicable to this study (first_task k >= T, a family without tasks)
            key = row["protocol"] if row["protocol"] in REFERENCE else f"{row['protocol']} ({row['options']})"
            out.setdefault(key, []).append((float(row["regret"]), float(row["regret"]) - float(full["regret"]),
                                            float(row["fraction"])))
    return out


def summary(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per protocol: median and worst regret (points), share within 1 point of the full study's H*, median compute,
    and the share of studies where it is within 1 point at <= 0.4 of the compute (the verdict's test)."""
    table = []
    for key, values in rows_by_protocol(results).items():
        regrets, losses, fractions = zip(*values)
        table.append({"protocol": key, "studies": len(values), "median_regret": 100 * median(regrets),
                      "worst_regret": 100 * max(regrets),
                      "within_1_point": sum(loss <= WITHIN + 1e-12 for loss in losses) / len(values),
                      "median_compute": median(fractions),
                      "safe_and_cheap": sum(loss <= WITHIN + 1e-12 and f <= MAX_COMPUTE
                                            for loss, f in zip(losses, fractions)) / len(values)})
    return table


def verdict(table: list[dict[str, Any]], studies: int) -> str:
    passing = [r["protocol"] for r in table if r["protocol"] not in REFERENCE and r["studies"] == studies
               and r["safe_and_cheap"] >= SHARE]
    if passing:
        return (f"within 1 point of the full study's H* at <= {MAX_COMPUTE} of its compute in >= {SHARE:.0%} of the "
                f"{studies} studies: {', '.join(passing)}")
    return (f"no protocol reaches an H* within 1 point of the full study's at <= {MAX_COMPUTE} of its compute in "
            f">= {SHARE:.0%} of the {studies} studies")


def premise(results: list[dict[str, Any]]) -> dict[str, Any]:
    """GTEP's own premise over the studies: how well a set's tuning score predicts its evaluation score (Kendall's
    tau and Spearman's rho over the sets of each study) and where H* ranks on D^E (1 = the best set)."""
    ranked = [r["ranking"] for r in results if r["ranking"].get("kendall_tau") is not None]
    if not ranked:
        return {"studies": 0}
    taus = [r["kendall_tau"] for r in ranked]
    return {"studies": len(ranked), "median_kendall_tau": median(taus), "lowest_kendall_tau": min(taus),
            "median_spearman_rho": median(r["spearman_rho"] for r in ranked),
            "h_star_best": sum(r["best_rank"] == 1 for r in ranked) / len(ranked),
            "h_star_rank_median": median(r["best_rank"] for r in ranked)}


DOC_NAMES = {"gtep (full)": "full GTEP", "conventional": "conventional (tuned on D^E)", "random": "random choice"}


def markdown(results: list[dict[str, Any]]) -> str:
    """The table docs/tuning-protocols.md and README show (a test keeps them equal to the stored results): the
    reference rows first, the shortcuts, the random floor last; then the premise and the verdict."""
    table = summary(results)
    first = ["gtep (full)", "conventional"]
    rows = sorted(table, key=lambda r: (r["protocol"] not in first, r["protocol"] == "random",
                                        first.index(r["protocol"]) if r["protocol"] in first else 0))
    lines = ["| protocol | studies | median regret | worst | within 1 point | median compute "
             "| within 1 point at <= 0.4 compute |", "|---|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {DOC_NAMES.get(r['protocol'], r['protocol'])} | {r['studies']} | {r['median_regret']:.2f} | "
              f"{r['worst_regret']:.2f} | {100 * r['within_1_point']:.0f} % | {r['median_compute']:.2f} | "
              f"{100 * r['safe_and_cheap']:.0f} % |" for r in rows]
    p = premise(results)
    if p["studies"]:
        lines += ["", f"Over the {p['studies']} studies, Kendall's tau between the sets' tuning and evaluation scores "
                  f"has median {p['median_kendall_tau']:.2f} (lowest {p['lowest_kendall_tau']:.2f}) and Spearman's "
                  f"rho median {p['median_spearman_rho']:.2f}; H\\* is the best set on D^E in "
                  f"{100 * p['h_star_best']:.0f} % of them (median rank {p['h_star_rank_median']:g} of {R})."]
    lines += ["", f"Verdict: {verdict(table, len(results))}."]
    partial = verdict_where_it_applies(table, len(results))
    if partial:
        lines[-1] += f" {partial[0].upper()}{partial[1:]}."
    return "\n".join(lines).replace("H*", "H\\*")


def verdict_where_it_applies(table: list[dict[str, Any]], studies: int) -> str | None:
    """The bar among only the studies a protocol applies to (first_task cuts the tasks of class-incremental
    orderings; the other families report once per ordering), for the protocols the verdict leaves out so."""
    partial = [r for r in table if r["protocol"] not in REFERENCE and r["studies"] < studies]
    passing = [f"{r['protocol']} ({r['studies']} {'study' if r['studies'] == 1 else 'studies'})" for r in partial
               if r["safe_and_cheap"] >= SHARE]
    if not partial:
        return None
    if passing:
        return f"among the studies it applies to, {', '.join(passing)} reaches the bar"
    return "no protocol that applies to only some studies reaches the bar among those either"


def print_table(results: list[dict[str, Any]]) -> None:
    table = summary(results)
    print(f"\n{len(results)} studies (R={R}, S={S}); regret in points below the best evaluated set; 'within 1': "
          "share of studies whose pick is within 1 point of the full study's H* on D^E")
    print(f"{'protocol':44s} {'studies':>7s} {'median regret':>13s} {'worst':>7s} {'within 1':>8s} "
          f"{'median compute':>14s} {'<=1 pt & <=0.4':>14s}")
    for r in table:
        print(f"{r['protocol']:44s} {r['studies']:7d} {r['median_regret']:13.2f} {r['worst_regret']:7.2f} "
              f"{r['within_1_point']:8.0%} {r['median_compute']:14.2f} {r['safe_and_cheap']:14.0%}")
    print(f"verdict: {verdict(table, len(results))}")
    partial = verdict_where_it_applies(table, len(results))
    if partial:
        print(f"         {partial}")


def stored() -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted(RESULTS.glob("*.json"))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=Path, default=ROOT / "gtep-runs" / "protocol-atlas",
                        help="where the studies' folders and MLflow store go")
    parser.add_argument("--max-studies", type=int, default=None, help="run at most this many studies now")
    parser.add_argument("--only", nargs="*", default=None, help="study names to run (default: the whole matrix)")
    parser.add_argument("--table-only", action="store_true", help="print the table over the stored studies")
    parser.add_argument("--list", action="store_true", help="list the matrix and what is stored")
    parser.add_argument("--markdown", action="store_true",
                        help="print the stored studies' table as docs/tuning-protocols.md shows it")
    args = parser.parse_args()
    cells = matrix(args.runs.resolve())
    RESULTS.mkdir(parents=True, exist_ok=True)
    if args.markdown:
        print(markdown(stored()))
        return
    if args.list:
        for name in cells:
            print(f"{'done' if (RESULTS / f'{name}.json').exists() else '    '}  {name}")
        return
    ran = 0
    for name, build in cells.items():
        if args.table_only or (args.max_studies is not None and ran >= args.max_studies):
            break
        if (args.only and name not in args.only) or (RESULTS / f"{name}.json").exists():
            continue
        print(f"running {name} ...", flush=True)
        try:
            result = run_study(name, build(), args.runs.resolve())
        except subprocess.CalledProcessError as err:
            print(f"  {name} failed ({err}); its log: {args.runs / f'{name}.log'}", flush=True)
            ran += 1
            continue
        (RESULTS / f"{name}.json").write_text(json.dumps(result, indent=1, default=str))
        print(f"  {name}: {result['wall_seconds']:.0f} s, H* regret "
              f"{100 * result['ranking']['regret']:.2f} points", flush=True)
        ran += 1
    results = stored()
    if results:
        print_table(results)
    else:
        print("no stored studies yet")


if __name__ == "__main__":
    main()
