"""gtep tune | evaluate | run: the protocol's two phases on Ray Tune, tracked in MLflow."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Optional

import typer

from gtep.cli.common import (
    AddressOpt,
    AlgorithmOpt,
    BackboneOpt,
    ConcurrentOpt,
    ConfigOpt,
    OrderingsOpt,
    OutputOpt,
    PresetOpt,
    ProtocolOpt,
    ProtocolTasksOpt,
    ResumeOpt,
    RunProtocolOpt,
    SchedulerOpt,
    SeedOpt,
    StudyOpt,
    TrialsOpt,
    TuneProtocolOpt,
    UriOpt,
    WeightsOpt,
    check_protocol,
    console,
    prepare,
    run_guarded,
    search_protocol,
    through_ray_client,
)
from gtep.config import ConfigError, ResolvedExperiment, read_yaml

app = typer.Typer()


def load_best_file(resolved: ResolvedExperiment, best: Optional[Path], tuning_run: Optional[str],
                   hparams: Optional[str]) -> dict[str, Any] | None:
    from gtep.spaces import SearchSpaceError, load_space, validate_values

    given = [x for x in (best, tuning_run, hparams) if x]
    if len(given) > 1:
        raise ConfigError("--best", "give one of --best, --tuning-run or --hparams")
    algorithm = resolved.config.algorithm
    if hparams:
        presets = load_space(algorithm, resolved.space_path).presets
        if hparams not in presets:
            raise ConfigError("--hparams", f"{algorithm} has no preset {hparams!r}; choose from {sorted(presets)}")
        return {"algorithm": algorithm, "set_index": -1, "hparams": presets[hparams], "source": f"preset:{hparams}"}
    if best:
        data = read_yaml(best, "--best", "the best.yaml that gtep tune wrote")
        if not isinstance(data, dict) or not isinstance(data.get("hparams"), dict) or "algorithm" not in data:
            raise ConfigError("--best", f"{best} is not a gtep best.yaml (it needs 'algorithm' and a mapping "
                              "'hparams'); give the best.yaml that gtep tune wrote")
        if data["algorithm"] != algorithm:
            raise ConfigError("--best", f"{best} holds H* of {data['algorithm']!r} but the config runs {algorithm!r}; "
                              "pass the matching best.yaml or --algorithm")
        try:
            validate_values(best, algorithm, data["hparams"])
        except SearchSpaceError as err:
            raise ConfigError("--best", str(err)) from None
        return data
    return None


def with_pretrained_weights(resolved: ResolvedExperiment) -> ResolvedExperiment:
    from gtep.orchestration.pretraining import with_pretrained_weights as pretrained

    return pretrained(resolved, console.print)


def _print_tune(outcome, resolved: ResolvedExperiment) -> None:
    from gtep.report.tables import hparams_table, phase_summary

    console.print(phase_summary(outcome.summary, resolved.tuning.dataset,
                                f"H* on the tuning phase (set {outcome.set_index})"))
    console.print(hparams_table(outcome.hparams, "H*"))
    console.print(f"best.yaml: {outcome.paths.best}\nmanifest:  {outcome.paths.manifest}\ntuning run: {outcome.run_id}")


def _print_store(resolved: ResolvedExperiment) -> None:
    cfg = resolved.config
    console.print(f"MLflow store: {cfg.tracking_uri}")
    if cfg.tracking.tracking_uri is None:
        console.print(f"Browse it with: [bold]gtep ui --output {cfg.tracking.output}[/]")


@app.command()
def tune(config: Optional[Path] = ConfigOpt, preset: Optional[str] = PresetOpt, output: Optional[Path] = OutputOpt,
         tracking_uri: Optional[str] = UriOpt, address: Optional[str] = AddressOpt, trials: Optional[int] = TrialsOpt,
         orderings: Optional[int] = OrderingsOpt, seed: Optional[int] = SeedOpt,
         algorithm: Optional[str] = AlgorithmOpt, max_concurrent: Optional[int] = ConcurrentOpt,
         study: Optional[str] = StudyOpt, backbone: Optional[str] = BackboneOpt, weights: Optional[Path] = WeightsOpt,
         resume: Optional[Path] = ResumeOpt, protocol: Optional[str] = TuneProtocolOpt,
         protocol_tasks: Optional[int] = ProtocolTasksOpt, scheduler: Optional[str] = SchedulerOpt) -> None:
    """Phase 1: sample R sets, train each over S orderings of D^HT, select H* (writes best.yaml)."""
    def go():
        from gtep.orchestration.phases import tune_phase
        from gtep.orchestration.ray_search import ray_session

        check_protocol(protocol, ("gtep", "first_task"))
        if through_ray_client(address, config):
            return
        resolved = prepare(config, preset, resume, output=output, tracking_uri=tracking_uri, address=address,
                           trials=trials, orderings=orderings, seed=seed, algorithm=algorithm,
                           max_concurrent=max_concurrent, study=study, backbone=backbone, weights=weights,
                           protocol=protocol, protocol_tasks=protocol_tasks, scheduler=scheduler)
        resolved = with_pretrained_weights(resolved)  # the pretrain section, once, before any phase
        with ray_session(resolved.config.compute.ray_address):
            outcome = tune_phase(resolved, console, resume=resume is not None)
        _print_tune(outcome, resolved)
        _print_store(resolved)
    run_guarded(go)


def resumed_set(study_dir: Path, phase: str, given: object) -> dict:
    """The set a resumed fixed-set phase ran, from the study's manifest (a resume never changes it)."""
    import json

    if given:
        raise ConfigError("--resume", "a resumed phase runs the set it started with; drop --best, --tuning-run "
                          "and --hparams")
    record = json.loads((study_dir / "manifest.json").read_text())["phases"].get(phase)
    if not record or "hparams" not in record:
        raise ConfigError("--resume", f"{study_dir} has no {phase} phase to resume; run gtep evaluate without --resume")
    return {"algorithm": json.loads((study_dir / "manifest.json").read_text())["algorithm"],
            "set_index": record.get("set_index", -1), "hparams": record["hparams"],
            "tuning_run_id": record.get("tuning_run_id", ""), "source": record.get("hparams_source", "tuning")}


@app.command()
def evaluate(config: Optional[Path] = ConfigOpt, preset: Optional[str] = PresetOpt,
             best: Optional[Path] = typer.Option(None, "--best", help="best.yaml written by gtep tune"),
             tuning_run: Optional[str] = typer.Option(None, "--tuning-run", help="MLflow run id of a tuning phase"),
             hparams: Optional[str] = typer.Option(None, "--hparams",
                                                   help="a named preset instead of H* (e.g. original)"),
             output: Optional[Path] = OutputOpt, tracking_uri: Optional[str] = UriOpt,
             address: Optional[str] = AddressOpt, orderings: Optional[int] = OrderingsOpt,
             seed: Optional[int] = SeedOpt, algorithm: Optional[str] = AlgorithmOpt,
             max_concurrent: Optional[int] = ConcurrentOpt, study: Optional[str] = StudyOpt,
             backbone: Optional[str] = BackboneOpt, weights: Optional[Path] = WeightsOpt,
             protocol: str = ProtocolOpt, resume: Optional[Path] = ResumeOpt) -> None:
    """Phase 2: train H* over S orderings of the disjoint D^E and report mean and std
    (--protocol conventional: over S fresh orderings of the tuning classes D^HT instead).
    --resume OUTPUT/STUDY runs the orderings an interrupted or incomplete evaluation is missing."""
    def go():
        from gtep.orchestration.phases import conventional_phase, evaluate_phase
        from gtep.orchestration.ray_search import ray_session
        from gtep.orchestration.tracking_store import best_from_run
        from gtep.report.tables import phase_summary

        check_protocol(protocol)
        if through_ray_client(address, config):
            return
        resolved = prepare(config, preset, resume, output=output, tracking_uri=tracking_uri, address=address,
                           orderings=orderings, seed=seed, algorithm=algorithm, max_concurrent=max_concurrent,
                           study=study, backbone=backbone, weights=weights)
        phase = "conventional" if protocol == "conventional" else "evaluate"
        if resume is not None:
            chosen = resumed_set(resume, phase, best or tuning_run or hparams)
        else:
            chosen = load_best_file(resolved, best, tuning_run, hparams)
        if tuning_run:
            chosen = best_from_run(resolved, tuning_run)
            if chosen["algorithm"] != resolved.config.algorithm:
                raise ConfigError("--tuning-run", f"run {tuning_run} tuned {chosen['algorithm']!r}, "
                                  f"not {resolved.config.algorithm!r}; pass --algorithm {chosen['algorithm']}")
        if chosen is None:
            default = resolved.config.study_dir / "best.yaml"
            if not default.exists():
                raise ConfigError("--best", f"no H* given and {default} does not exist; run gtep tune first, "
                                  "or pass --best, --tuning-run or --hparams")
            chosen = load_best_file(resolved, default, None, None)
        resolved = with_pretrained_weights(resolved)  # the pretrain section, once, before any phase
        with ray_session(resolved.config.compute.ray_address):
            if protocol == "conventional":
                outcome = conventional_phase(resolved, chosen, console, resume=resume is not None)
            else:
                outcome = evaluate_phase(resolved, chosen, console, resume=resume is not None)
        if protocol == "conventional":
            console.print(phase_summary(outcome.summary, resolved.tuning.dataset,
                                        "Conventional protocol: H* on the tuning classes (fresh orderings)"))
        else:
            console.print(phase_summary(outcome.summary, resolved.evaluation.dataset, "Evaluation phase"))
        _print_store(resolved)
    run_guarded(go)


@app.command()
def run(config: Optional[Path] = ConfigOpt, preset: Optional[str] = PresetOpt, output: Optional[Path] = OutputOpt,
        tracking_uri: Optional[str] = UriOpt, address: Optional[str] = AddressOpt, trials: Optional[int] = TrialsOpt,
        orderings: Optional[int] = OrderingsOpt, seed: Optional[int] = SeedOpt, algorithm: Optional[str] = AlgorithmOpt,
        max_concurrent: Optional[int] = ConcurrentOpt, study: Optional[str] = StudyOpt,
        backbone: Optional[str] = BackboneOpt, weights: Optional[Path] = WeightsOpt,
        resume: Optional[Path] = ResumeOpt, protocol: str = RunProtocolOpt,
        protocol_tasks: Optional[int] = ProtocolTasksOpt, scheduler: Optional[str] = SchedulerOpt,
        with_original: bool = typer.Option(False, "--with-original", help="also evaluate the algorithm's original "
                                           "preset on D^E beside H* (the paper's 'Original')")) -> None:
    """Both phases: tune on D^HT, evaluate H* on D^E, print them side by side. No options: the embedded default."""
    def go():
        from gtep.orchestration.phases import (
            conventional_phase,
            evaluate_phase,
            original_best,
            original_phase,
            tune_phase,
        )
        from gtep.orchestration.ray_search import ray_session
        from gtep.orchestration.study import read_best
        from gtep.report.tables import hparams_table, phase_comparison

        check_protocol(protocol, ("gtep", "conventional", "first_task"))
        if through_ray_client(address, config):
            return
        start = time.perf_counter()
        resolved = prepare(config, preset, resume, output=output, tracking_uri=tracking_uri, address=address,
                           trials=trials, orderings=orderings, seed=seed, algorithm=algorithm,
                           max_concurrent=max_concurrent, study=study, backbone=backbone, weights=weights,
                           protocol=search_protocol(protocol), protocol_tasks=protocol_tasks, scheduler=scheduler)
        cfg = resolved.config
        console.print(f"[bold]gtep run[/] study={cfg.study} algorithm={cfg.algorithm} backbone={cfg.backbone} "
                      f"scenario={cfg.scenario.describe()} R={cfg.search.trials} S={cfg.search.orderings}")
        if with_original:
            original_best(resolved)  # a missing preset is an error before any compute
        extra = {}
        resolved = with_pretrained_weights(resolved)  # the pretrain section, once, before any phase
        with ray_session(cfg.compute.ray_address):
            tuned = tune_phase(resolved, console, resume=resume is not None)
            best = read_best(tuned.paths.best)
            evaluated = evaluate_phase(resolved, best, console, resume=resume is not None)
            if protocol == "conventional" or cfg.search.protocol == "conventional":
                extra["conventional"] = conventional_phase(resolved, best, console, resume=resume is not None).summary
            if with_original:
                extra["original"] = original_phase(resolved, console, resume=resume is not None).summary
        console.print(hparams_table(tuned.hparams, f"H* (set {tuned.set_index} of {cfg.search.trials})"))
        console.print(phase_comparison(tuned.summary, evaluated.summary, resolved.tuning.dataset,
                                       resolved.evaluation.dataset,
                                       f"GTEP: {cfg.algorithm} on {cfg.scenario.describe()}", extra=extra))
        console.print(f"study folder: {tuned.paths.root}  (best.yaml, manifest.json, *_results.csv)")
        _print_store(resolved)
        console.print(f"wall time: {time.perf_counter() - start:.0f} s")
    run_guarded(go)
