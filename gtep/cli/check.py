"""gtep check: the pre-flight pass alone. Everything a study needs of its config, data, files and paths is checked
(gtep/preflight/), and what the study will do is printed: phases, classes, tasks and images, units, orderings,
the data flow and, with --calibrate, an estimate of the training compute. Nothing is trained or written.

gtep.preflight is imported inside the functions: it imports torch and the engine, which `gtep --help` and every other
command's start need not wait for."""
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
    from gtep.preflight.calibration import no_estimate_reason, study_flow
    from gtep.preflight.checks import cuda_build_note, input_size_warnings, plan_summary, training_input_line

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
    console.print(escape(training_input_line(plan)), highlight=False, soft_wrap=True)
    for line in input_size_warnings(plan):
        console.print(f"[yellow]warning:[/] {escape(line)}", highlight=False, soft_wrap=True)  # one line, unwrapped
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
    build = cuda_build_note(cfg)
    if build is not None:
        console.print(f"[yellow]note:[/] {escape(build)}", highlight=False)
    if not calibrate:
        console.print("compute: add --calibrate for an estimate from a short calibration on this machine")
        return
    reason = no_estimate_reason(plan)
    if reason is not None:
        console.print(f"compute: no estimate for the {family.name} family: {escape(reason)}; time one unit with "
                      "`gtep tune --trials 1 --orderings 1` instead", highlight=False)
    elif study_flow(plan).by_image_epochs:
        print_estimate(plan)
    else:
        print_flow_estimate(plan)
    if cfg.pretrain is not None:
        print_pretraining(plan)


def print_estimate(plan) -> None:
    """The calibration's costs, what they come to per phase, and the trial slots the wall time assumes."""
    from gtep.preflight.calibration import compute_estimate, image_epochs

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
                  f"evaluation about {_duration(estimate['evaluation_seconds'])} of training; "
                  f"{estimate['budget'].describe()}", highlight=False)
    if cal.fusion != 1.0:
        console.print(f"fused orderings: a trial's {cfg.search.orderings} orderings trained as one network take "
                      f"{cal.fusion:.2f}x the time of training them one after another (timed); counted so above",
                      highlight=False)
    console.print(f"trial slots: {estimate['trials_at_once']} trial(s) at a time with {slots.threads} CPU thread(s) "
                  f"each; {slots.slots} trial slot(s) on this machine ({slots.counted}) -> tuning wall about "
                  f"{_duration(estimate['tuning_wall_seconds'])}", highlight=False)


def print_flow_estimate(plan) -> None:
    """A study whose flow is timed in part (multi_label, stream, continual_few_shot, a plugin's): the part of
    ordering 0 the calibration ran, its costs, the scaling rule and what it comes to per phase."""
    from gtep.preflight.calibration import compute_flow_estimate

    cfg = plan.resolved.config
    estimate = compute_flow_estimate(plan)
    cal, slots, units = estimate["calibration"], estimate["slots"], estimate["units"]
    unit = cal.unit
    fit_rule = (f"fit x ({unit}s / {cal.timed_units}) ** 2 (an update trains on every sample seen so far)"
                if cal.fit_power == 2 else f"fit x {unit}s / {cal.timed_units}")
    console.print(f"compute: calibrated as a trial runs the {plan.resolved.family.data_flow} flow, on "
                  f"{escape(cal.device)} with {cal.threads} thread(s), batch size {cal.batch_size} (the sampled "
                  f"sets' median), {cfg.algorithm} on the phase's own images: {cal.timed_units} {unit}(s) of "
                  f"tuning ordering 0 run in {cal.timed_seconds:.1f} s, each `fit` timed on "
                  f"one epoch of its first batches and counted at its images x epochs; "
                  f"{cal.outside_fit * 1e3:.1f} ms per {unit} outside `fit`; scaled to an ordering's "
                  f"{units['tune']} (tuning) and {units['evaluate']} (evaluation) {unit}s as outside x {unit}s / "
                  f"{cal.timed_units} + {fit_rule}; about {_duration(estimate['unit_seconds'])} a unit; tuning "
                  f"about {_duration(estimate['tuning_seconds'])}, evaluation about "
                  f"{_duration(estimate['evaluation_seconds'])} of training; {estimate['budget'].describe()}",
                  highlight=False)
    console.print(f"trial slots: {estimate['trials_at_once']} trial(s) at a time with {slots.threads} CPU thread(s) "
                  f"each; {slots.slots} trial slot(s) on this machine ({slots.counted}) -> tuning wall about "
                  f"{_duration(estimate['tuning_wall_seconds'])}", highlight=False)


def print_pretraining(plan) -> None:
    """The pretrain section: done once per study and cached; its cost where the cache has no file for it yet."""
    from gtep.orchestration.pretraining import pretrain_spec, pretrained_path
    from gtep.preflight.calibration import pretrain_estimate

    path = pretrained_path(plan.resolved)
    if path.exists():
        console.print(f"pretraining: cached at {escape(str(path))}; not run again", highlight=False)
        return
    spec = pretrain_spec(plan.resolved)
    cost = pretrain_estimate(plan, spec)
    work = (f"{cost.steps:,} episodes ({cost.epochs} epochs of {cost.images:,} images)" if cost.step == "episode"
            else f"{cost.images:,} images x {cost.epochs} epochs")
    console.print(f"pretraining: about {_duration(cost.seconds)} ({work} at {cost.per_step * 1e3:.2f} ms per "
                  f"{cost.step}, a few steps of the pretrain section's recipe timed); once per study, before the "
                  f"phases, then cached at {escape(str(path))} and not counted in the units above", highlight=False)


@app.command("check")
def check(config: Optional[Path] = ConfigOpt, preset: Optional[str] = PresetOpt, output: Optional[Path] = OutputOpt,
          trials: Optional[int] = TrialsOpt, orderings: Optional[int] = OrderingsOpt, seed: Optional[int] = SeedOpt,
          algorithm: Optional[str] = AlgorithmOpt, study: Optional[str] = StudyOpt,
          backbone: Optional[str] = BackboneOpt, weights: Optional[Path] = WeightsOpt,
          calibrate: bool = typer.Option(False, "--calibrate", help="time a few training steps of the learner as a "
                                         "trial runs them and estimate the study's training time")) -> None:
    """Run the pre-flight checks and print the study's plan; trains and writes nothing."""

    def go() -> None:
        from gtep.preflight.checks import preflight

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
