"""gtep tune | evaluate | run: the protocol's two phases on Ray Tune, tracked in MLflow.

Each command is a thin layer over gtep.api (tune, evaluate, run): resolve the experiment from the options once
(`prepare`), hand it down to the function, print what it returns."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable, Optional, TypeVar

import typer

from gtep import api
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
    as_option,
    check_protocol,
    console,
    guarded,
    prepare,
    search_protocol,
    through_ray_client,
)
from gtep.config import ConfigError

app = typer.Typer()
T = TypeVar("T")


def naming_options(call: Callable[[], T], overrides: dict[str, Any]) -> T:
    """Run an API call; a ConfigError about a field an option set (or an API keyword) names the option."""
    try:
        return call()
    except ConfigError as err:
        raise as_option(err, overrides) from None


@app.command()
def tune(config: Optional[Path] = ConfigOpt, preset: Optional[str] = PresetOpt, output: Optional[Path] = OutputOpt,
         tracking_uri: Optional[str] = UriOpt, address: Optional[str] = AddressOpt, trials: Optional[int] = TrialsOpt,
         orderings: Optional[int] = OrderingsOpt, seed: Optional[int] = SeedOpt,
         algorithm: Optional[str] = AlgorithmOpt, max_concurrent: Optional[int] = ConcurrentOpt,
         study: Optional[str] = StudyOpt, backbone: Optional[str] = BackboneOpt, weights: Optional[Path] = WeightsOpt,
         resume: Optional[Path] = ResumeOpt, protocol: Optional[str] = TuneProtocolOpt,
         protocol_tasks: Optional[int] = ProtocolTasksOpt, scheduler: Optional[str] = SchedulerOpt) -> None:
    """Phase 1: train R sets over S orderings of D^HT and select H* (writes best.yaml).

    It samples R hyperparameter sets, trains each over the same S class orderings of the tuning classes D^HT
    and writes the best-scoring set, H*, to best.yaml."""
    with guarded("tune"):  # the body runs here, downward: resolved once, then handed to api.tune
        check_protocol(protocol, ("gtep", "first_task"))
        if through_ray_client(address, config):
            return
        overrides = dict(output=output, tracking_uri=tracking_uri, address=address, trials=trials,
                         orderings=orderings, seed=seed, algorithm=algorithm, max_concurrent=max_concurrent,
                         study=study, backbone=backbone, weights=weights, protocol=protocol,
                         protocol_tasks=protocol_tasks, scheduler=scheduler)
        resolved = prepare(config, preset, resume, **overrides)
        # api.tune prints H* and the store, as it does for a notebook
        naming_options(lambda: api.tune(resolved, resume=resume is not None, console=console), overrides)


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
             protocol: str = ProtocolOpt, resume: Optional[Path] = ResumeOpt,
             sets: Optional[str] = typer.Option(None, "--sets", help="best: H* alone; all: every tuned set too, over "
                                                "the same orderings (the sets' rank correlation, H*'s regret, the "
                                                "protocols' regret table) [default: the config's evaluation.sets]"),
             ) -> None:
    """Phase 2: train H* over S orderings of the disjoint D^E and report mean and std.

    With --protocol conventional it trains over S fresh orderings of the tuning classes D^HT instead.
    --resume OUTPUT/STUDY runs the orderings an interrupted or incomplete evaluation is missing; with --sets all it
    then evaluates every other tuned set of the study (H* stays the result)."""
    with guarded("evaluate"):  # the body runs here, downward: resolved once, then handed to api.evaluate
        check_protocol(protocol)
        if through_ray_client(address, config):
            return
        overrides = dict(output=output, tracking_uri=tracking_uri, address=address, orderings=orderings, seed=seed,
                         algorithm=algorithm, max_concurrent=max_concurrent, study=study, backbone=backbone,
                         weights=weights)
        resolved = prepare(config, preset, resume, **overrides)
        # api.evaluate prints the phase's summary and the store, as it does for a notebook
        naming_options(lambda: api.evaluate(resolved, best=best, hparams=hparams, tuning_run=tuning_run,
                                            protocol=protocol, resume=resume is not None, sets=sets,
                                            console=console), overrides)


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
    """Both phases: tune on D^HT, evaluate H* on D^E, print them side by side.

    With no options it runs the embedded default study."""
    with guarded("run"):  # the body runs here, downward: resolved once, then handed to api.run
        check_protocol(protocol, ("gtep", "conventional", "first_task"))
        if through_ray_client(address, config):
            return
        start = time.perf_counter()
        # first_task is the config's search.protocol, set here before the one resolution (api.run then runs the
        # gtep plan on it); conventional is a phase api.run adds to the plan
        overrides = dict(output=output, tracking_uri=tracking_uri, address=address, trials=trials,
                         orderings=orderings, seed=seed, algorithm=algorithm, max_concurrent=max_concurrent,
                         study=study, backbone=backbone, weights=weights, protocol=search_protocol(protocol),
                         protocol_tasks=protocol_tasks, scheduler=scheduler)
        resolved = prepare(config, preset, resume, **overrides)
        # api.run prints H*, the phases side by side, the study folder and the store, as it does for a notebook
        naming_options(lambda: api.run(resolved, protocol="gtep" if protocol == "first_task" else protocol,
                                       with_original=with_original, resume=resume is not None, console=console),
                       overrides)
        console.print(f"wall time: {time.perf_counter() - start:.0f} s")
