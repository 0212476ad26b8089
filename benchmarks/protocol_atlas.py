"""Which tuning shortcut is safe, across many studies (issue 49, item 3; issue 60).

Runs a matrix of CPU-sized studies, each with every tuned set evaluated on D^E (`evaluation.sets: all`), and keeps
each study's regret table (gtep/protocol/regret.py: the set each protocol picks, its compute relative to the full
study, its regret) as one JSON file in benchmarks/results/protocol_atlas/. Then, over every stored study, it prints
per protocol: the median and worst regret (points below the best evaluated set), the share of studies whose pick
is within 1 point of the full study's H* on D^E, the median compute fraction, and the verdict: which protocols
reach an H* within 1 point at no more than 0.4 of the compute in at least 90% of the studies.

Two blocks (BLOCKS):

- `r6s3` (22 studies, R = 6 sets, S = 3 orderings, every epoch count as the presets scale it times 0.4):
  class-incremental ResNet-8 learners (replay, icarl, wa) on two scenarios (5x3, 3x5) and two dataset pairings
  (Tiny ImageNet split in two: high similarity; Tiny ImageNet then Omniglot: low), two ViT learners (l2p, ranpac on
  a micro ViT pretrained by the study's pretrain section), and two learners of each other family (fscil, iirc,
  cfsl, fluid) on their CPU presets;
- `paper` (8 studies at the paper's R = 30, S = 5): replay, icarl, wa and bic on ResNet-8, 5x3, both pairings,
  at 0.2 of the preset's epochs (PAPER_SHARE: 300 units a study, sized so the block fits a few hours of the
  shared 2-core CPU).

Every study draws its own sets and orderings: its `seed` is search_seed(its name), stored with it. Each stored
file (benchmarks/results/protocol_atlas/<study>.json, standard JSON: null where a number is undefined, with the
reason beside it) keeps the study's config and seed and its raw results (`raw`): every set's per-ordering tuning
and evaluation scores (Acc, AvgAcc, HM, the criterion's components, and the accuracy matrix with its test counts
where the family has tasks), each tuning unit's training seconds per task, whether it trained or reused its
first task, and its arrival order. Its `ranking`, `protocols` and `floors` are derived from `raw` by gtep's
replay code (derive); tests/benchmarks/test_protocol_atlas.py recomputes every cell of the docs tables from `raw` alone,
without that code. The 22 files of the first atlas, which kept no raw results, are in legacy/.

Resumable: a study whose result file exists is skipped; one whose folder exists is resumed (`gtep run --resume`),
so the atlas can run a few studies per session in the background and grow until it has them all.

    .venv/bin/python benchmarks/protocol_atlas.py --block paper --max-studies 1   # one more paper-shape study
    .venv/bin/python benchmarks/protocol_atlas.py --rederive        # the derived rows again from the raw results

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
import zlib
from pathlib import Path
from statistics import median
from typing import Any, Callable

import yaml

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "protocol_atlas"
DATA = Path(os.environ.get("GTEP_SHARED_DATA", ROOT.parent / "shared" / "data"))
TINY = f"npz:{DATA / 'tinyimagenet200_32.npz'}"
LEGACY = RESULTS / "legacy"  # the first atlas's 22 files: summary rows only, no raw results (issue 60)
SCHEMA = 2  # a stored file with raw results
R, S = 6, 3
# Every study trains at this share of its preset's epochs (training.epoch_scale x EPOCH_SHARE): on the shared 2-core
# machine the first study, at the preset's own scale, took 818 s and an IIRC one about 1.5 h; at 0.4 the matrix fits
# a few sessions. Each result records the scale it ran at.
EPOCH_SHARE = 0.4
# The paper's shape: R = 30 sets over S = 5 orderings, 150 tuning and 150 evaluation units a study (8.3 times the
# r6s3 block's 36); at 0.2 of the presets' epochs (Tiny ImageNet's smoke preset at 0.05, so 0.01 of the paper's
# epochs: a first task of 2 epochs) a study is about 20-40 minutes of the shared 2-core machine, the block 3-5 hours.
PAPER_SHARE = 0.2
BLOCKS = {"r6s3": {"trials": R, "orderings": S, "epoch_share": EPOCH_SHARE,
                   "title": "R = 6, S = 3: the atlas's matrix (22 studies)",
                   "label": "R = 6, S = 3"},
          "paper": {"trials": 30, "orderings": 5, "epoch_share": PAPER_SHARE,
                    "title": "R = 30, S = 5: the paper's shape (8 class-incremental ResNet-8 studies)",
                    "label": "R = 30, S = 5"}}
PAPER_ALGORITHMS = ("replay", "icarl", "wa", "bic")
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


def search_seed(study: str) -> int:
    """The study's own seed (its sets and orderings): a hash of its name, so no two studies draw the same sets."""
    return zlib.crc32(study.encode()) % 100_000


def sized(config: dict[str, Any], study: str, algorithm: str, block: str = "r6s3") -> dict[str, Any]:
    """Every study: the block's R sets over S orderings, two trials at once, every set evaluated, its own seed."""
    shape = BLOCKS[block]
    training = config.get("training", {})
    return {**config, "study": study, "algorithm": algorithm, "seed": search_seed(study),
            "search": {**config.get("search", {}), "trials": shape["trials"], "orderings": shape["orderings"]},
            "training": {**training,
                         "epoch_scale": float(training.get("epoch_scale", 1.0)) * float(shape["epoch_share"])},
            "compute": {**config.get("compute", {}), "cpus_per_trial": 1, "max_concurrent": 2},
            "evaluation": {"sets": "all"}}


def class_incremental(algorithm: str, increments: str, pairing: str, block: str = "r6s3") -> dict[str, Any]:
    base = preset("tinyimagenet-smoke")
    base["scenario"] = {**base["scenario"], "increments": increments}
    if pairing == "low":  # two datasets: 15 Tiny ImageNet classes for tuning, 15 Omniglot characters to evaluate
        base["datasets"] = {"tuning": {"dataset": TINY, "classes": list(range(15))},
                            "evaluation": {"dataset": "omniglot-small", "classes": list(range(15))}}
    prefix = "atlas" if block == "r6s3" else "paper"
    return sized(base, f"{prefix}-ci-{algorithm}-{increments}-{pairing}", algorithm, block)


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


def block_of(study: str) -> str:
    return "paper" if study.startswith("paper-") else "r6s3"


def matrix(runs: Path = ROOT / "gtep-runs" / "protocol-atlas") -> dict[str, Callable[[], dict[str, Any]]]:
    """Study name -> its config (built when run, so --list needs no data): the r6s3 block, then the paper block."""
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
    for pairing in ("low", "high"):  # low first: its studies are the cheaper
        for algorithm in PAPER_ALGORITHMS:
            cells[f"paper-ci-{algorithm}-5x3-{pairing}"] = (
                lambda a=algorithm, p=pairing: class_incremental(a, "5x3", p, "paper"))
    return cells


# ---------------------------------------------------------------- running a study

def gtep(*argv: str, log: Path) -> None:
    exe = Path(sys.executable).with_name("gtep")
    command = [str(exe)] if exe.exists() else [sys.executable, "-m", "gtep.cli"]
    with open(log, "a") as out:
        subprocess.run([*command, *argv], check=True, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)


# what each tuning unit keeps in the stored file (with the criterion's components); names as gtep records them
UNIT_FIELDS = ("set_index", "ordering", "status", "acc", "avg_acc", "hmean", "acc_t", "acc_matrix", "test_counts",
               "task_seconds", "train_seconds", "first_task", "unit_file", "finished_at")


def kept(unit: dict[str, Any], components: tuple[str, ...]) -> dict[str, Any]:
    return finite_or_null({k: unit[k] for k in (*UNIT_FIELDS, *components) if unit.get(k) is not None},
                          f"no score: the unit's status is {unit.get('status')!r}")


def finite_or_null(record: dict[str, Any], why: str) -> dict[str, Any]:
    """A record as standard JSON allows it: a NaN score (a diverged unit or set has one) becomes null, and `nulls`
    beside it says why, so the stored file parses everywhere (JavaScript's JSON.parse refuses NaN)."""
    missing = [k for k, v in record.items() if isinstance(v, float) and not math.isfinite(v)]
    if not missing:
        return record
    return {**{k: None if k in missing else v for k, v in record.items()}, "nulls": {k: why for k in missing}}


def raw_results(folder: Path) -> dict[str, Any]:
    """A finished study folder's raw results: every set's per-ordering tuning units (with their arrival order:
    the order the study finished them, which ASHA and the pruners replay) and evaluation units, the evaluation
    phases' per-set summaries, S, the sets with their values, H*, the criterion and the selection rule."""
    from gtep.orchestration.replay import load_study
    from gtep.orchestration.study import full_units
    from gtep.protocol.phases import EVALUATE_SETS
    from gtep.protocol.replay import arrival_order

    study = load_study(folder)
    manifest = json.loads((folder / "manifest.json").read_text())
    components = tuple(study.criterion.components)
    arrival = {(int(u["set_index"]), int(u["ordering"])): n for n, u in enumerate(arrival_order(study.units))}
    tuning = [{**kept(u, components), "arrival": arrival[(int(u["set_index"]), int(u["ordering"]))]}
              for u in sorted(study.units, key=lambda u: (int(u["set_index"]), int(u["ordering"])))]
    evaluation: dict[int, list[dict[str, Any]]] = {}
    for phase in ("evaluate", EVALUATE_SETS.name):
        record = manifest.get("phases", {}).get(phase, {})
        units = full_units(folder, phase, str(record.get("attempt", "")),
                           [u for key, u in manifest.get("units", {}).items() if key.startswith(f"{phase}/")])
        for u in units:  # H*'s orderings are the evaluate phase's; evaluate_sets adds every other set's
            index = int(study.best_index if phase == "evaluate" else u["set_index"])
            if phase == "evaluate" or index != study.best_index:
                evaluation.setdefault(index, []).append({**kept(u, components), "set_index": index})
    hparams = {int(s["index"]): s.get("hparams") for s in manifest.get("sets", [])}
    return {"criterion": study.criterion.name, "components": list(components),
            "combine": "harmonic_mean" if len(components) == 2 else "identity", "selection": study.selection,
            "orderings": study.orderings, "tasks": study.tasks, "sets": study.sets, "best_index": study.best_index,
            "hparams": {str(i): hparams.get(i) for i in study.sets},
            "tuning": tuning,
            "evaluation": {str(i): {"units": sorted(units, key=lambda u: int(u["ordering"])),
                                    "summary": finite_or_null(
                                        {k: study.evaluated[i].get(k) for k in ("diverged", *components)},
                                        "no score: the set diverged on an evaluation ordering")}
                           for i, units in sorted(evaluation.items()) if i in study.evaluated}}


def evaluation_scores(raw: dict[str, Any]) -> dict[int, float]:
    """Each set's evaluation score as gtep computes it: the criterion of its evaluation summary (NaN: diverged)."""
    from gtep.protocol.criteria import CRITERIA

    criterion = CRITERIA.get(raw["criterion"])
    out = {}
    for i, record in raw["evaluation"].items():
        summary = record["summary"]
        out[int(i)] = (math.nan if float(summary.get("diverged") or 0) > 0 else
                       criterion.combine([float(summary.get(c) if summary.get(c) is not None else math.nan)
                                          for c in criterion.components]))
    return out


def floors(raw: dict[str, Any]) -> dict[str, float]:
    """Each protocol's least possible compute at the study's R and S (and T), whatever the data: the fraction of
    the full study it spends on the most favourable results, every unit (and, for first_task, every task) costing
    the same. The stopping rules run (gtep's replay code) over R x S equal-cost units arriving one set after
    another with falling scores, which lets each rule stop every set it can: ASHA, successive halving and Hyperband
    promote at least the first set to reach each rung (of each bracket), the median pruner lets its startup sets
    finish. first_task k decides nothing from the scores (every set trains its first k tasks), so its least
    possible compute is the compute it measured: the seconds of those tasks over the full study's."""
    from gtep.config import PrunerOptions
    from gtep.orchestration.pruning import PrunerBook, make_pruner
    from gtep.orchestration.replay import TABLE_PRUNERS
    from gtep.protocol.regret import ASHA_SETTINGS, FIRST_TASK_K
    from gtep.protocol.replay import replay

    sets, orderings = list(raw["sets"]), int(raw["orderings"])
    synthetic = [{"set_index": i, "ordering": o, "status": "finished", "acc": 1 - 0.01 * n, "avg_acc": 1 - 0.01 * n,
                  "train_seconds": 1.0, "finished_at": n * orderings + o}
                 for n, i in enumerate(sets) for o in range(orderings)]
    for unit in synthetic:  # any criterion's components take the same falling value
        unit.update({c: unit["acc"] for c in raw["components"]})
    out = {"gtep (full)": 1.0, "conventional": 1.0, "random": 0.0}
    for grace, factor in ASHA_SETTINGS:
        if grace < orderings:
            out[f"asha (grace {grace}, reduction {factor:g})"] = replay(
                synthetic, orderings, sets, "asha", grace_period=grace, reduction_factor=factor).fraction
    for name, pruner in TABLE_PRUNERS:
        book = PrunerBook(make_pruner(pruner, PrunerOptions(), orderings), orderings)
        out[f"{name} (defaults)"] = replay(synthetic, orderings, sets, name, stop_rule=book.report).fraction
    tasks = raw.get("tasks")
    for k in FIRST_TASK_K:  # it stops nothing by score: what it spent is all it can spend
        if tasks and k < tasks:
            out[f"first_task (k={k})"] = replay(raw["tuning"], orderings, sets, "first_task", protocol_tasks=k).fraction
    return out


def derive(raw: dict[str, Any]) -> dict[str, Any]:
    """The study's set ranking, protocol rows (picks, compute, regret; a pick decided by a tie reads null) and
    floors, from its raw results by gtep's replay code (gtep/protocol/regret.py, gtep/orchestration/pruning.py)."""
    from gtep.config import PrunerOptions
    from gtep.orchestration.pruning import PrunerBook, make_pruner
    from gtep.orchestration.replay import TABLE_PRUNERS
    from gtep.protocol.criteria import CRITERIA
    from gtep.protocol.regret import json_ready, protocol_rows, rank_sets
    from gtep.protocol.replay import replay

    criterion = CRITERIA.get(raw["criterion"])
    units, orderings, sets = raw["tuning"], int(raw["orderings"]), list(raw["sets"])
    evaluation = evaluation_scores(raw)
    rules = [(name, "defaults", PrunerBook(make_pruner(pruner, PrunerOptions(), orderings), orderings).report)
             for name, pruner in TABLE_PRUNERS]
    rows = protocol_rows(units, orderings, sets, evaluation, best_index=raw["best_index"], criterion=criterion,
                         selection=raw["selection"], tasks=raw["tasks"], stop_rules=rules)
    tuning = replay(units, orderings, sets, "none", criterion=criterion, selection=raw["selection"]).scores
    ranking = rank_sets(tuning, evaluation, raw["best_index"])
    return json_ready({"criterion": raw["criterion"], "ranking": ranking.as_dict(),
                       "protocols": [row.as_dict() for row in rows], "floors": floors(raw)})


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
    return stored_result(name, config, folder, round(time.perf_counter() - start, 1))


def stored_result(name: str, config: dict[str, Any], folder: Path, wall_seconds: float) -> dict[str, Any]:
    raw = raw_results(folder)
    return {"schema": SCHEMA, "study": name, "block": block_of(name),
            "family": config["scenario"].get("family", "class_incremental"),
            "algorithm": config["algorithm"], "backbone": config["backbone"],
            "scenario": config["scenario"].get("increments", config["scenario"].get("family")),
            "datasets": config["datasets"], "trials": config["search"]["trials"],
            "orderings": config["search"]["orderings"], "search_seed": config.get("seed"),
            "epoch_scale": config.get("training", {}).get("epoch_scale"),
            "space_changes": CPU_SIZED.get(config["algorithm"], {}),
            "wall_seconds": wall_seconds, "config": config, **derive(raw), "raw": raw}


# ---------------------------------------------------------------- the table

def number(value: Any) -> float | None:
    """A stored number; None for null (or a NaN of a file written before issue 60)."""
    if value is None:
        return None
    value = float(value)
    return None if math.isnan(value) else value


def key_of(row: dict[str, Any]) -> str:
    return row["protocol"] if row["protocol"] in REFERENCE else f"{row['protocol']} ({row['options']})"


def rows_by_protocol(results: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """'protocol (options)' -> per study where it applies: its regret (None: no pick, a tie among them), its loss
    against the full study's H*, compute fraction, whether its pick is a tie, and its least possible compute."""
    out: dict[str, list[dict[str, Any]]] = {}
    for result in results:
        full = number(next(r for r in result["protocols"] if r["protocol"] == "gtep (full)")["regret"])
        for row in result["protocols"]:
            fraction = number(row["fraction"])
            if fraction is None:
                continue  # not applicable to this study (first_task k >= T, a family without tasks)
            regret = number(row["regret"])
            out.setdefault(key_of(row), []).append({
                "regret": regret, "fraction": fraction, "tie": regret is None and int(row.get("tied") or 0) > 1,
                "loss": None if regret is None or full is None else regret - full,
                "floor": (result.get("floors") or {}).get(key_of(row))})
    return out


def summary(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per protocol: the studies it applies to, those where its pick is a tie (no pick: not within 1 point), median
    and worst regret (points, over its picks), share within 1 point of the full study's H*, median compute, least
    possible compute (the lowest over the studies; None where not recorded) and the share of studies where it is
    within 1 point at <= 0.4 of the compute (the verdict's test)."""
    table = []
    for key, values in rows_by_protocol(results).items():
        regrets = [v["regret"] for v in values if v["regret"] is not None]
        within = [v["loss"] is not None and v["loss"] <= WITHIN + 1e-12 for v in values]
        floor_values = [v["floor"] for v in values if v["floor"] is not None]
        table.append({"protocol": key, "studies": len(values), "ties": sum(v["tie"] for v in values),
                      "median_regret": 100 * median(regrets) if regrets else None,
                      "worst_regret": 100 * max(regrets) if regrets else None,
                      "within_1_point": sum(within) / len(values),
                      "median_compute": median(v["fraction"] for v in values),
                      "least_compute": min(floor_values) if len(floor_values) == len(values) else None,
                      "safe_and_cheap": sum(w and v["fraction"] <= MAX_COMPUTE for w, v in zip(within, values))
                      / len(values)})
    return table


def counted(n: int) -> str:
    return f"{n} {'study' if n == 1 else 'studies'}"


def verdict(table: list[dict[str, Any]], studies: int) -> str:
    passing = [r["protocol"] for r in table if r["protocol"] not in REFERENCE and r["studies"] == studies
               and r["safe_and_cheap"] >= SHARE]
    if passing:
        return (f"within 1 point of the full study's H* at <= {MAX_COMPUTE} of its compute in >= {SHARE:.0%} of the "
                f"{counted(studies)}: {', '.join(passing)}")
    return (f"no protocol reaches an H* within 1 point of the full study's at <= {MAX_COMPUTE} of its compute in "
            f">= {SHARE:.0%} of the {counted(studies)}")


def premise(results: list[dict[str, Any]]) -> dict[str, Any]:
    """GTEP's own premise over the studies: how well a set's tuning score predicts its evaluation score (Kendall's
    tau and Spearman's rho over the sets of each study) and where H* ranks on D^E (1 = the best set)."""
    ranked = [r["ranking"] for r in results if number(r["ranking"].get("kendall_tau")) is not None]
    if not ranked:
        return {"studies": 0}
    taus = [r["kendall_tau"] for r in ranked]
    return {"studies": len(ranked), "median_kendall_tau": median(taus), "lowest_kendall_tau": min(taus),
            "median_spearman_rho": median(r["spearman_rho"] for r in ranked),
            "h_star_best": sum(r["best_rank"] == 1 for r in ranked) / len(ranked),
            "h_star_rank_median": median(r["best_rank"] for r in ranked),
            "median_h_star_regret": 100 * median(number(r["regret"]) or 0.0 for r in ranked)}


DOC_NAMES = {"gtep (full)": "full GTEP", "conventional": "conventional (tuned on D^E)", "random": "random choice"}


def cell(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def markdown(results: list[dict[str, Any]], block: str | None = None) -> str:
    """A block's table as docs/tuning-protocols.md shows it (a test keeps them equal to the stored results, and
    recomputes every cell from the raw results): the reference rows first, the shortcuts, the random floor last;
    then the premise, the verdict and which studies it covers. Without `block`, the first atlas's legacy files
    (no raw results: no ties or least compute recorded, so those columns are left out)."""
    legacy = block is None
    if not results:
        pending = [n for n in matrix() if block_of(n) == block]
        return f"No study of this block is stored yet; to run ({len(pending)}): {', '.join(pending)}."
    table = summary(results)
    first = ["gtep (full)", "conventional"]
    rows = sorted(table, key=lambda r: (r["protocol"] not in first, r["protocol"] == "random",
                                        first.index(r["protocol"]) if r["protocol"] in first else 0))
    if legacy:
        lines = ["| protocol | studies | median regret | worst | within 1 point | median compute "
                 "| within 1 point at <= 0.4 compute |", "|---|---:|---:|---:|---:|---:|---:|"]
        lines += [f"| {DOC_NAMES.get(r['protocol'], r['protocol'])} | {r['studies']} | "
                  f"{cell(r['median_regret'], '.2f')} | {cell(r['worst_regret'], '.2f')} | "
                  f"{100 * r['within_1_point']:.0f} % | {r['median_compute']:.2f} | "
                  f"{100 * r['safe_and_cheap']:.0f} % |" for r in rows]
    else:
        lines = ["| protocol | studies | ties (no pick) | median regret | worst | within 1 point | median compute "
                 "| least possible compute | within 1 point at <= 0.4 compute |",
                 "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        lines += [f"| {DOC_NAMES.get(r['protocol'], r['protocol'])} | {r['studies']} | {r['ties']} | "
                  f"{cell(r['median_regret'], '.2f')} | {cell(r['worst_regret'], '.2f')} | "
                  f"{100 * r['within_1_point']:.0f} % | {r['median_compute']:.2f} | "
                  f"{cell(r['least_compute'], '.2f')} | "
                  f"{100 * r['safe_and_cheap']:.0f} % |" for r in rows]
    trials = results[0]["trials"] if results else R
    p = premise(results)
    if p["studies"]:
        lines += ["", f"Over the {counted(p['studies'])}, Kendall's tau between the sets' tuning and evaluation scores "
                  f"has median {p['median_kendall_tau']:.2f} (lowest {p['lowest_kendall_tau']:.2f}) and Spearman's "
                  f"rho median {p['median_spearman_rho']:.2f}; H\\* is the best set on D^E in "
                  f"{100 * p['h_star_best']:.0f} % of them (median rank {p['h_star_rank_median']:g} of {trials}) and "
                  f"{p['median_h_star_regret']:.2f} points (median) below the best set."]
    lines += ["", f"Verdict: {verdict(table, len(results))}."]
    partial = verdict_where_it_applies(table, len(results))
    if partial:
        lines[-1] += f" {partial[0].upper()}{partial[1:]}."
    if not legacy:
        names = [r["study"] for r in results]
        pending = [n for n in matrix() if block_of(n) == block and n not in names]
        lines += ["", f"Studies with raw results ({len(names)}): {', '.join(names) or 'none yet'}."]
        if pending:
            lines[-1] += f" Not run yet ({len(pending)}): {', '.join(pending)}."
    return "\n".join(lines).replace("H*", "H\\*")


def comparison(by_block: dict[str, list[dict[str, Any]]]) -> str:
    """What changes between the blocks, per shortcut (the stopping rules and first_task): its median compute with the
    least possible beside it, its share within 1 point and within 1 point at <= 0.4 of the compute, in each block;
    cells are the blocks' own tables' (a test keeps them equal), so the docs restate no figure by hand."""
    stored_blocks = [b for b in BLOCKS if by_block.get(b)]
    if len(stored_blocks) < 2:
        return "Not both blocks are stored yet."
    tables = {b: {r["protocol"]: r for r in summary(by_block[b])} for b in stored_blocks}
    shortcuts = [p for p in tables[stored_blocks[0]] if p not in REFERENCE]
    shortcuts += [p for b in stored_blocks[1:] for p in tables[b] if p not in REFERENCE and p not in shortcuts]
    head = " | ".join(f"{label} {BLOCKS[b]['label']}" for b in stored_blocks
                      for label in ("median compute (least possible),", "within 1 point,", "at <= 0.4 compute,"))
    lines = [f"| protocol | {head} |", "|---|" + "---:|" * (3 * len(stored_blocks))]
    for protocol in shortcuts:
        cells = []
        for b in stored_blocks:
            r = tables[b].get(protocol)
            cells += (["-"] * 3 if r is None else
                      [f"{r['median_compute']:.2f} ({cell(r['least_compute'], '.2f')})",
                       f"{100 * r['within_1_point']:.0f} % of {r['studies']}", f"{100 * r['safe_and_cheap']:.0f} %"])
        lines.append(f"| {protocol} | {' | '.join(cells)} |")
    counts = ", ".join(f"{counted(len(by_block[b]))} at {BLOCKS[b]['label']}" for b in stored_blocks)
    lines += ["", f"Over the studies stored: {counts}; '-': the protocol applies to no study of that block."]
    return "\n".join(lines)


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


def print_table(results: list[dict[str, Any]], title: str, legacy: bool = False) -> None:
    """The block's table on the terminal; `legacy`: files that recorded no ties (shown as '?')."""
    table = summary(results)
    print(f"\n{title}: {len(results)} studies; regret in points below the best evaluated set; 'within 1': share of "
          "studies whose pick is within 1 point of the full study's H* on D^E (a tie is no pick)")
    print(f"{'protocol':44s} {'studies':>7s} {'ties':>4s} {'median regret':>13s} {'worst':>7s} {'within 1':>8s} "
          f"{'median compute':>14s} {'least':>6s} {'<=1 pt & <=0.4':>14s}")
    for r in table:
        ties = "?" if legacy else str(r["ties"])
        print(f"{r['protocol']:44s} {r['studies']:7d} {ties:>4s} {cell(r['median_regret'], '13.2f'):>13s} "
              f"{cell(r['worst_regret'], '7.2f'):>7s} {r['within_1_point']:8.0%} {r['median_compute']:14.2f} "
              f"{cell(r['least_compute'], '6.2f'):>6s} {r['safe_and_cheap']:14.0%}")
    print(f"verdict: {verdict(table, len(results))}")
    partial = verdict_where_it_applies(table, len(results))
    if partial:
        print(f"         {partial}")


def stored(block: str | None = None) -> list[dict[str, Any]]:
    """The stored studies with raw results, of one block (or all); block None and legacy: the first atlas's."""
    return [r for r in (json.loads(p.read_text()) for p in sorted(RESULTS.glob("*.json")))
            if block is None or r.get("block") == block]


def legacy() -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted(LEGACY.glob("*.json"))]


def portable(text: str) -> str:
    """Paths of this machine written relative to the repository (its data beside it: `../shared/data/...`), so that a
    stored result names no folder of the machine that made it (tests/benchmarks/test_stored_paths.py)."""
    for prefix, relative in ((f"{ROOT}/", ""), (f"{ROOT.parent}/", "../")):
        text = text.replace(prefix, relative)
    return text


def dump(result: dict[str, Any]) -> str:
    """Standard JSON (allow_nan=False: a NaN left anywhere is an error, not a file JSON.parse refuses), with the
    machine's paths made relative to the repository."""
    return portable(json.dumps(result, indent=1, default=str, allow_nan=False))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=Path, default=ROOT / "gtep-runs" / "protocol-atlas",
                        help="where the studies' folders and MLflow store go")
    parser.add_argument("--max-studies", type=int, default=None, help="run at most this many studies now")
    parser.add_argument("--only", nargs="*", default=None,
                        help="study names to run, in this order (default: the whole matrix)")
    parser.add_argument("--block", choices=sorted(BLOCKS), default=None, help="run only this block's studies")
    parser.add_argument("--table-only", action="store_true", help="print the tables over the stored studies")
    parser.add_argument("--list", action="store_true", help="list the matrix and what is stored")
    parser.add_argument("--markdown", action="store_true",
                        help="print the stored studies' tables as docs/tuning-protocols.md shows them")
    parser.add_argument("--rederive", action="store_true",
                        help="recompute every stored study's derived rows from its raw results (gtep's code)")
    args = parser.parse_args()
    cells = matrix(args.runs.resolve())
    RESULTS.mkdir(parents=True, exist_ok=True)
    if args.markdown:
        for block in BLOCKS:
            print(f"<!-- atlas-table {block} -->\n{markdown(stored(block), block)}\n<!-- /atlas-table {block} -->\n")
        print(f"<!-- atlas-table change -->\n{comparison({b: stored(b) for b in BLOCKS})}\n"
              "<!-- /atlas-table change -->\n")
        print(f"<!-- atlas-table legacy -->\n{markdown(legacy())}\n<!-- /atlas-table legacy -->")
        return
    if args.rederive:
        for path in sorted(RESULTS.glob("*.json")):
            result = json.loads(path.read_text())
            path.write_text(dump({**result, **derive(result["raw"])}))
            print(f"rederived {path.name}")
        return
    if args.list:
        for name in cells:
            print(f"{'done' if (RESULTS / f'{name}.json').exists() else '    '}  {name}")
        return
    ran = 0
    order = args.only if args.only else list(cells)
    for name in order:
        if args.table_only or (args.max_studies is not None and ran >= args.max_studies):
            break
        if name not in cells or (args.block and block_of(name) != args.block) or (RESULTS / f"{name}.json").exists():
            continue
        print(f"running {name} ...", flush=True)
        try:
            result = run_study(name, cells[name](), args.runs.resolve())
        except (subprocess.CalledProcessError, OSError, ValueError, KeyError, TypeError) as err:
            print(f"  {name} failed ({err!r}); its log: {args.runs / f'{name}.log'}", flush=True)
            ran += 1
            continue
        (RESULTS / f"{name}.json").write_text(dump(result))
        print(f"  {name}: {result['wall_seconds']:.0f} s, H* regret "
              f"{100 * (number(result['ranking']['regret']) or 0.0):.2f} points", flush=True)
        ran += 1
    for block, shape in BLOCKS.items():
        results = stored(block)
        if results:
            print_table(results, shape["title"])
    if legacy():
        print_table(legacy(), "the first atlas (legacy/, no raw results)", legacy=True)


if __name__ == "__main__":
    main()
