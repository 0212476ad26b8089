"""Tuning cost of cheaper protocols against a full GTEP study, measured on a real small study.

Records one full `gtep run` (R sets x S orderings on D^HT, then H* over S orderings of D^E) on the shared Tiny
ImageNet file (CPU), or reuses a finished study given by --study (OUTPUT/STUDY), then replays its recorded tuning
results (gtep/protocol/replay.py, nothing retrained) under ASHA on the orderings axis and under the first-task
protocol (Lee et al. 2024: sets compared on the first k tasks). For each it prints the training time spent
relative to the full study and the evaluation-phase score (H*'s criterion, %) of the set it would have chosen
beside the full study's H*; a chosen set the study did not evaluate is evaluated here (`gtep evaluate --best`,
a study of its own), unless --no-evaluate. Target: within 1 point at <= 0.4 of the compute.

ASHA is replayed in the order the full study finished its units; a live run with the scheduler frees slots
sooner, so its order can differ. With the paper's fixed first-task recipe (reused across sets) task 1 alone
tells sets apart only through what reaches it (the sampled scheduler), so k = 2 is the default here.

    .venv/bin/python benchmarks/tuning_cost.py [--trials 8 --orderings 3 --epoch-scale 0.05]
    .venv/bin/python benchmarks/tuning_cost.py --study gtep-runs/mystudy
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

DATA = Path("/work/shared/data/tinyimagenet200_32.npz")


def study_config(name: str, args: argparse.Namespace) -> dict:
    per_phase = args.tasks * args.classes_per_task
    return {
        "study": name,
        "algorithm": "replay",
        "backbone": "resnet8",
        "scenario": {"increments": f"{args.classes_per_task}x{args.tasks}"},
        "datasets": {"split": {"dataset": f"npz:{args.data}", "by": "class", "seed": 0,
                               "classes_per_phase": per_phase}},
        "search": {"trials": args.trials, "orderings": args.orderings},
        "first_task": {"epochs": 200, "lr": 0.1, "milestones": [60, 120, 170], "lr_decay": 0.1,
                       "weight_decay": 0.0005, "batch_size": 64},
        "training": {"memory_size": 10 * per_phase, "epoch_scale": args.epoch_scale},
        "compute": {"cpus_per_trial": 1, "max_concurrent": args.slots},
        "seed": 0,
    }


def gtep(*argv: str) -> None:
    exe = Path(sys.executable).with_name("gtep")
    command = [str(exe)] if exe.exists() else [sys.executable, "-m", "gtep.cli"]
    subprocess.run([*command, *argv], check=True, stdout=subprocess.DEVNULL)


def evaluation_score(study, set_index: int | None, config: Path | None, out: Path | None) -> float | None:
    """The evaluation-phase score of a set: the study's own, else a `gtep evaluate --best` of it here."""
    score = study.evaluation_score(set_index)
    if score is not None or set_index is None or config is None or out is None:
        return score
    name = f"{study.root.name}-set{set_index:03d}"
    done = out / name / "manifest.json"  # evaluated by an earlier run of this script into the same --keep folder
    if not (done.exists() and json.loads(done.read_text())["phases"].get("evaluate", {}).get("status") == "finished"):
        evaluate_set(study, set_index, config, out, name)
    summary = json.loads(done.read_text())["phases"]["evaluate"]["summary"]
    return study.criterion.combine([float(summary[c]) for c in study.criterion.components])


def evaluate_set(study, set_index: int, config: Path, out: Path, name: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    best = yaml.safe_load((study.root / "best.yaml").read_text())
    manifest = json.loads((study.root / "manifest.json").read_text())
    hparams = next(s["hparams"] for s in manifest["sets"] if int(s["index"]) == set_index)
    alt = out / f"best-set{set_index:03d}.yaml"
    alt.write_text(yaml.safe_dump({**best, "set_index": set_index, "hparams": hparams, "tuning_run_id": ""}))
    gtep("evaluate", "--config", str(config), "--best", str(alt), "--study", name, "--output", str(out))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--study", type=Path, help="a finished study folder to replay instead of recording one")
    parser.add_argument("--config", type=Path, help="with --study: its experiment file (to evaluate other sets)")
    parser.add_argument("--trials", type=int, default=8)
    parser.add_argument("--orderings", type=int, default=3)
    parser.add_argument("--tasks", type=int, default=4)
    parser.add_argument("--classes-per-task", type=int, default=5)
    parser.add_argument("--epoch-scale", type=float, default=0.05)
    parser.add_argument("--slots", type=int, default=2, help="trials at once (cores on this machine)")
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--grace-period", type=int, default=1)
    parser.add_argument("--reduction-factor", type=float, default=3.0)
    parser.add_argument("--protocol-tasks", type=int, default=2)
    parser.add_argument("--pruner", default="median", help="one of Optuna's pruners to replay too ('none': skip)")
    parser.add_argument("--pruner-startup", type=int, default=2, help="the pruner's n_startup_trials")
    parser.add_argument("--no-evaluate", action="store_true", help="do not evaluate sets the study did not")
    parser.add_argument("--keep", type=Path, help="record the study here (kept) instead of a temporary folder")
    args = parser.parse_args()
    for key, value in (("RAY_AUTH_MODE", "disabled"), ("MLFLOW_SERVER_ENABLE_JOB_EXECUTION", "false"),
                       ("HF_HUB_OFFLINE", "1")):
        os.environ.setdefault(key, value)
    from gtep.config import PrunerOptions
    from gtep.orchestration.replay import load_study, replay_pruned, replay_study

    with tempfile.TemporaryDirectory(prefix="gtep-bench-") as tmp:
        work = args.keep or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        config = args.config
        if args.study is None:
            config = work / "tuning-cost.yaml"
            config.write_text(yaml.safe_dump(study_config("tuning-cost", args)))
            print(f"recording a full study: R={args.trials} S={args.orderings} {args.tasks} tasks of "
                  f"{args.classes_per_task} classes, epoch_scale {args.epoch_scale} ...", flush=True)
            gtep("run", "--config", str(config), "--output", str(work / "out"))
            root = work / "out" / "tuning-cost"
        else:
            root = args.study
        study = load_study(root)
        out = None if args.no_evaluate else work / "out"
        full = replay_study(study, "none")
        full_score = evaluation_score(study, full.best_index, config, out)
        print(f"full study: H* = set{full.best_index:03d}, {full.seconds:.0f} s of training, evaluation score "
              f"{'n/a' if full_score is None else f'{100 * full_score:.2f}'}")
        rows = [("asha", {"grace_period": args.grace_period, "reduction_factor": args.reduction_factor},
                 f"asha (grace {args.grace_period}, rf {args.reduction_factor:g})"),
                ("first_task", {"protocol_tasks": args.protocol_tasks}, f"first_task (k = {args.protocol_tasks})")]
        if args.pruner != "none":
            rows.append(("pruner", {"n_startup_trials": args.pruner_startup},
                         f"optuna {args.pruner} (startup {args.pruner_startup})"))
        for rule, options, label in rows:
            if rule == "pruner":
                outcome = replay_pruned(study, args.pruner, PrunerOptions(**options))
            else:
                outcome = replay_study(study, rule, **options)
            score = evaluation_score(study, outcome.best_index, config, out)
            chosen = "none" if outcome.best_index is None else f"set{outcome.best_index:03d}"
            delta = (f"{100 * (score - full_score):+.2f} points" if score is not None and full_score is not None
                     else "n/a")
            print(f"{label:28s} H* = {chosen}  compute {outcome.fraction:.2f} of the full study  "
                  f"evaluation score {'n/a' if score is None else f'{100 * score:.2f}'} ({delta} vs the full H*)"
                  + (f"  stopped {len(outcome.stopped)}/{len(study.sets)} sets" if outcome.stopped else ""),
                  flush=True)
        print("target: within 1 point at <= 0.40 of the compute")


if __name__ == "__main__":
    main()
