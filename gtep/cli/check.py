"""gtep check: the pre-flight pass alone. Everything a study needs of its config, data, files and paths is checked
(gtep/preflight.py), and what the study will do is printed: phases, classes, tasks and images, units, orderings,
the data flow and, with --calibrate, an estimate of the training compute. Nothing is trained or written."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape
from rich.table import Table

from gtep.cli.common import (
    AlgorithmOpt,
    BackboneOpt,
    ConfigOpt,
    OrderingsOpt,
    OutputOpt,
    PresetOpt,
    SeedOpt,
    StudyOpt,
    TrialsOpt,
    WeightsOpt,
    as_option,
    build_config,
    console,
    run_guarded,
)
from gtep.config import ConfigError

app = typer.Typer()


def _duration(seconds: float) -> str:
    hours, rest = divmod(int(seconds), 3600)
    return f"{hours} h {rest // 60:02d} min" if hours else f"{rest // 60} min {rest % 60:02d} s"


def _runs(tasks: tuple[tuple[str, int], ...]) -> str:
    """Tasks as text, identical neighbours counted once: '10 x (5 ways ...: 50 images)'."""
    parts: list[list] = []
    for task in tasks:
        if parts and parts[-1][0] == task:
            parts[-1][1] += 1
        else:
            parts.append([task, 1])
    text = [f"{label}: {images} images" for (label, images), _ in parts]
    return "; ".join(t if n == 1 else f"{n} x ({t})" for t, (_, n) in zip(text, parts))


def print_plan(plan, calibrate: bool) -> None:
    from gtep.preflight import plan_summary

    resolved = plan.resolved
    cfg = resolved.config
    family = resolved.family
    summary = plan_summary(plan)
    console.print(f"[bold]gtep check[/] study={escape(cfg.study)}: {cfg.algorithm} on {cfg.backbone}, "
                  f"{family.name} family ({escape(cfg.scenario.describe())}), data flow {family.data_flow}, "
                  f"H* by {resolved.criterion.name}", highlight=False)
    table = Table(title="Phases (disjoint classes)")
    for column in ("phase", "dataset", "classes", "train images", "test images", "stored image", "pipeline",
                   "tasks"):
        table.add_column(column)
    for phase in (plan.tuning, plan.evaluation):
        spec = phase.spec
        table.add_row(spec.phase, escape(spec.dataset), str(len(spec.classes)), str(phase.train_images),
                      str(phase.test_images), "x".join(map(str, phase.facts.image_shape)),
                      resolved.pipeline(spec.phase).describe(), str(len(phase.tasks) or "-"))
    console.print(table)
    for phase in (plan.tuning, plan.evaluation):
        if phase.tasks:
            console.print(f"{phase.spec.phase} tasks (ordering 0): {_runs(phase.tasks)}", highlight=False)
        elif resolved.increments and phase is plan.tuning:
            console.print(f"{phase.spec.phase}: labels per task {'+'.join(map(str, resolved.increments))} "
                          f"({family.description})", highlight=False)
        else:
            console.print(f"{phase.spec.phase}: {family.description}", highlight=False)
    trials, orderings = cfg.search.trials, cfg.search.orderings
    console.print(f"units: tuning R x S = {trials} x {orderings} = {summary['tuning_units']} "
                  f"(protocol {cfg.search.protocol}, scheduler {cfg.search.scheduler}), evaluation S = "
                  f"{summary['evaluation_units']}; searcher {cfg.search.searcher}, seed {cfg.seed}", highlight=False)
    console.print(f"data flow: {family.data_flow}; every ordering of a phase starts afresh "
                  f"(weights: {escape(str(resolved.weights or cfg.pretrain and 'the pretrain section' or 'none'))})",
                  highlight=False)
    for phase, note in summary["conversions"].items():
        console.print(f"[yellow]note:[/] {phase} phase data converted: {escape(note)}", highlight=False)
    if not calibrate:
        console.print("compute: add --calibrate for an estimate from a short calibration on this machine")
        return
    from gtep.preflight import no_estimate_reason

    reason = no_estimate_reason(plan)
    if reason is not None:
        console.print(f"compute: no estimate for the {family.name} family: {escape(reason)}; time one unit with "
                      "`gtep tune --trials 1 --orderings 1` instead", highlight=False)
        return
    print_estimate(plan)


def print_estimate(plan) -> None:
    """The calibration's costs, what they come to per phase, and the trial slots the wall time assumes."""
    from gtep.preflight import compute_estimate, image_epochs

    cfg = plan.resolved.config
    estimate = compute_estimate(plan)
    cal, slots = estimate["calibration"], estimate["slots"]
    pipeline = plan.resolved.pipeline("tune").describe()
    console.print(f"compute: calibrated as a trial trains, on {escape(cal.device)} with {cal.threads} thread(s), "
                  f"batch size {cal.batch_size} (the sampled sets' median), pipeline {escape(pipeline)}, every stage "
                  f"of {cfg.algorithm}: {cal.first_task * 1e3:.2f} ms per training image on task 1, "
                  f"{cal.later_tasks * 1e3:.2f} ms per training image from task 2 on; "
                  f"{image_epochs(plan, plan.tuning):,.0f} image-epochs per tuning ordering, about "
                  f"{_duration(estimate['unit_seconds'])} a unit; "
                  f"tuning about {_duration(estimate['tuning_seconds'])}, "
                  f"evaluation about {_duration(estimate['evaluation_seconds'])} of training", highlight=False)
    console.print(f"trial slots: {estimate['trials_at_once']} trial(s) at a time with {slots.threads} CPU thread(s) "
                  f"each; {slots.slots} trial slot(s) on this machine ({slots.counted}) -> tuning wall about "
                  f"{_duration(estimate['tuning_wall_seconds'])}", highlight=False)


@app.command("check")
def check(config: Optional[Path] = ConfigOpt, preset: Optional[str] = PresetOpt, output: Optional[Path] = OutputOpt,
          trials: Optional[int] = TrialsOpt, orderings: Optional[int] = OrderingsOpt, seed: Optional[int] = SeedOpt,
          algorithm: Optional[str] = AlgorithmOpt, study: Optional[str] = StudyOpt,
          backbone: Optional[str] = BackboneOpt, weights: Optional[Path] = WeightsOpt,
          calibrate: bool = typer.Option(False, "--calibrate", help="time a few training steps of the learner as a "
                                         "trial runs them and estimate the study's training time")) -> None:
    """Run the pre-flight checks and print the study's plan; trains and writes nothing."""

    def go() -> None:
        from gtep.preflight import preflight

        overrides = dict(output=output, trials=trials, orderings=orderings, seed=seed, algorithm=algorithm,
                         study=study, backbone=backbone, weights=weights)
        cfg = build_config(config, preset, **overrides)
        try:
            plan = preflight(cfg)
        except ConfigError as err:
            raise as_option(err, overrides) from None
        print_plan(plan, calibrate)
        console.print("[green]ok:[/] every pre-flight check passed; nothing was trained or written")

    run_guarded(go)
