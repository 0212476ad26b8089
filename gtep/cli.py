"""The gtep command line: parse, validate everything, then call one function.

gtep run | tune | evaluate    the protocol's phases on Ray Tune, tracked in MLflow
gtep matrix                  algorithms x scenarios x dataset pairings, one study per cell (gtep matrices)
gtep ui                      the MLflow UI over the study's store, on 127.0.0.1
gtep algorithms | spaces | presets   what is registered
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console
from rich.table import Table

from gtep.config import ConfigError, ExperimentConfig, ResolvedExperiment, load_config, load_preset, preset_names, preset_text, resolve
from gtep.matrix_command import matrices_command, matrix_command
from gtep.report.command import report_command

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="GTEP: tune continual-learning hyperparameters on one scenario, evaluate them on a disjoint one.")
console = Console()
err_console = Console(stderr=True)

ConfigOpt = typer.Option(None, "--config", "-c", help="experiment YAML file")
PresetOpt = typer.Option(None, "--preset", help="a scenario shipped with gtep (gtep presets); default: 'default'")
OutputOpt = typer.Option(None, "--output", help="folder for studies and the default MLflow store [./gtep-runs]")
UriOpt = typer.Option(None, "--tracking-uri", help="MLflow tracking URI [sqlite:///<output>/mlflow.db]")
AddressOpt = typer.Option(None, "--address", help="an existing Ray cluster (host:port, ray://host:10001, auto)")
TrialsOpt = typer.Option(None, "--trials", help="R: hyperparameter sets to sample")
OrderingsOpt = typer.Option(None, "--orderings", help="S: class orderings")
SeedOpt = typer.Option(None, "--seed", help="the study seed (orderings, samples, initialisation)")
AlgorithmOpt = typer.Option(None, "--algorithm", help="override the config's algorithm (gtep algorithms)")
ConcurrentOpt = typer.Option(None, "--max-concurrent", help="trials running at once")
StudyOpt = typer.Option(None, "--study", help="override the study name (its folder and MLflow experiment)")
BackboneOpt = typer.Option(None, "--backbone", help="override the backbone (resnet32, resnet18, any timm ViT...)")
WeightsOpt = typer.Option(None, "--weights", help="pretrained ViT weights: safetensors or a state dict (gtep pretrain)")
ResumeOpt = typer.Option(None, "--resume", help="continue the study in OUTPUT/STUDY after a crash, with its own config")
ProtocolOpt = typer.Option("gtep", "--protocol", help="gtep, or conventional: also re-run H* on the tuning classes "
                           "(fresh orderings S..2S-1), the practice the paper criticises (section 3.1)")


def fail(message: str) -> None:
    err_console.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(2)


def check_protocol(protocol: str) -> str:
    if protocol not in ("gtep", "conventional"):
        raise ConfigError("--protocol", f"{protocol!r} is not a protocol; choose gtep or conventional")
    return protocol


def build_config(config: Optional[Path], preset: Optional[str], **overrides: Any) -> ExperimentConfig:
    if config and preset:
        raise ConfigError("--preset", "give either --config or --preset, not both")
    cfg = load_config(config) if config else load_preset(preset or "default")
    mapped = {"tracking.output": overrides.get("output"), "tracking.tracking_uri": overrides.get("tracking_uri"),
              "compute.ray_address": overrides.get("address"), "search.trials": overrides.get("trials"),
              "search.orderings": overrides.get("orderings"), "seed": overrides.get("seed"),
              "algorithm": overrides.get("algorithm"), "compute.max_concurrent": overrides.get("max_concurrent"),
              "study": overrides.get("study"), "backbone": overrides.get("backbone"),
              "weights": overrides.get("weights")}
    for field, value in (("--trials", overrides.get("trials")), ("--orderings", overrides.get("orderings"))):
        if value is not None and value < 1:
            raise ConfigError(field, f"must be >= 1, got {value}")
    return cfg.with_overrides(**mapped)


def resumed_config(study_dir: Path, config, preset, overrides: dict[str, Any]) -> ExperimentConfig:
    """The config a study was started with (its manifest), placed where the study folder is now."""
    import json

    manifest = study_dir / "manifest.json"
    if not manifest.exists():
        raise ConfigError("--resume", f"{study_dir} has no manifest.json; give the OUTPUT/STUDY folder of a study "
                          "that gtep tune or gtep run started")
    allowed = {"address", "tracking_uri"}
    extra = sorted(k for k, v in overrides.items() if v is not None and k not in allowed)
    if config or preset or extra:
        given = ["--config"] * bool(config) + ["--preset"] * bool(preset) + [f"--{k.replace('_', '-')}" for k in extra]
        raise ConfigError("--resume", f"a study resumes with the config it started with; drop {', '.join(given)} "
                          "(only --address and --tracking-uri may change)")
    stored = json.loads(manifest.read_text())["config"]
    cfg = ExperimentConfig.model_validate(stored)
    return cfg.with_overrides(**{"tracking.output": study_dir.resolve().parent, "study": study_dir.name,
                                 "compute.ray_address": overrides.get("address"),
                                 "tracking.tracking_uri": overrides.get("tracking_uri")})


def prepare(config, preset, resume: Optional[Path] = None, **overrides) -> ResolvedExperiment:
    """All validation that needs no compute: the file, the names, the data, the search space, the address."""
    from gtep.orchestration.phases import check_address, check_tracking

    cfg = resumed_config(resume, config, preset, overrides) if resume else build_config(config, preset, **overrides)
    resolved = resolve(cfg)
    check_address(resolved.config.compute.ray_address)
    check_tracking(resolved.config.tracking_uri)
    return resolved


def load_best_file(resolved: ResolvedExperiment, best: Optional[Path], tuning_run: Optional[str],
                   hparams: Optional[str]) -> dict[str, Any] | None:
    from gtep.orchestration.study import read_best
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
        if not best.exists():
            raise ConfigError("--best", f"{best} does not exist; give the best.yaml that gtep tune wrote")
        try:
            data = read_best(best)
        except ValueError as err:
            raise ConfigError("--best", str(err)) from None
        if data["algorithm"] != algorithm:
            raise ConfigError("--best", f"{best} holds H* of {data['algorithm']!r} but the config runs {algorithm!r}; "
                              "pass the matching best.yaml or --algorithm")
        try:
            validate_values(best, algorithm, data["hparams"])
        except SearchSpaceError as err:
            raise ConfigError("--best", str(err)) from None
        return data
    return None


def through_ray_client(address: Optional[str], config: Optional[Path]) -> bool:
    """With --address ray://..., rerun this very command on the cluster's head (jobs.run_through_client)."""
    if not address or not address.startswith("ray://"):
        return False
    from gtep.orchestration import jobs
    from gtep.orchestration.phases import check_address

    check_address(address)
    argv, skip = [], False
    for arg in sys.argv[1:]:
        if skip:
            skip = False
        elif arg == "--address":
            skip = True
        elif not arg.startswith("--address="):
            argv.append("@config" if config is not None and Path(arg) == config else arg)
    code, output = jobs.run_through_client(address, argv, config)
    sys.stdout.write(output)
    if code:
        raise typer.Exit(code)
    return True


def _run_guarded(fn):
    from gtep.data import DatasetError
    from gtep.protocol.selection import AllSetsDivergedError
    from gtep.spaces import SearchSpaceError

    from gtep.errors import StudyStopped

    try:
        return fn()
    except (ConfigError, DatasetError, SearchSpaceError, AllSetsDivergedError) as err:
        fail(str(err))
    except StudyStopped as err:  # a phase that is not complete: never a success, its own exit code
        from rich.markup import escape

        command = fn.__qualname__.split(".")[0]  # `go` is defined inside the command's function: tune, run...
        if getattr(err, "summary", None):  # what finished, with its k/S, so nothing reads it as complete
            from gtep.report.tables import phase_summary

            console.print(phase_summary(err.summary, err.dataset, f"{err.phase} phase: INCOMPLETE"))
        err_console.print(f"[bold red]stopped:[/] {escape(err.describe(command))}", highlight=False, soft_wrap=True)
        raise typer.Exit(err.exit_code)


def _print_tune(outcome, resolved: ResolvedExperiment) -> None:
    from gtep.report.tables import hparams_table, phase_summary

    console.print(phase_summary(outcome.summary, resolved.tuning.dataset, f"H* on the tuning phase (set {outcome.set_index})"))
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
         orderings: Optional[int] = OrderingsOpt, seed: Optional[int] = SeedOpt, algorithm: Optional[str] = AlgorithmOpt,
         max_concurrent: Optional[int] = ConcurrentOpt, study: Optional[str] = StudyOpt,
         backbone: Optional[str] = BackboneOpt, weights: Optional[Path] = WeightsOpt,
         resume: Optional[Path] = ResumeOpt) -> None:
    """Phase 1: sample R sets, train each over S orderings of D^HT, select H* (writes best.yaml)."""
    def go():
        from gtep.orchestration.phases import ray_session, tune_phase

        if through_ray_client(address, config):
            return
        resolved = prepare(config, preset, resume, output=output, tracking_uri=tracking_uri, address=address,
                           trials=trials, orderings=orderings, seed=seed, algorithm=algorithm,
                           max_concurrent=max_concurrent, study=study, backbone=backbone, weights=weights)
        with ray_session(resolved.config.compute.ray_address):
            outcome = tune_phase(resolved, console, resume=resume is not None)
        _print_tune(outcome, resolved)
        _print_store(resolved)
    _run_guarded(go)


@app.command()
def evaluate(config: Optional[Path] = ConfigOpt, preset: Optional[str] = PresetOpt,
             best: Optional[Path] = typer.Option(None, "--best", help="best.yaml written by gtep tune"),
             tuning_run: Optional[str] = typer.Option(None, "--tuning-run", help="MLflow run id of a tuning phase"),
             hparams: Optional[str] = typer.Option(None, "--hparams", help="a named preset instead of H* (e.g. original)"),
             output: Optional[Path] = OutputOpt, tracking_uri: Optional[str] = UriOpt, address: Optional[str] = AddressOpt,
             orderings: Optional[int] = OrderingsOpt, seed: Optional[int] = SeedOpt,
             algorithm: Optional[str] = AlgorithmOpt, max_concurrent: Optional[int] = ConcurrentOpt,
             study: Optional[str] = StudyOpt,
         backbone: Optional[str] = BackboneOpt, weights: Optional[Path] = WeightsOpt,
         protocol: str = ProtocolOpt) -> None:
    """Phase 2: train H* over S orderings of the disjoint D^E and report mean and std
    (--protocol conventional: over S fresh orderings of the tuning classes D^HT instead)."""
    def go():
        from gtep.orchestration.phases import best_from_run, conventional_phase, evaluate_phase, ray_session
        from gtep.report.tables import phase_summary

        check_protocol(protocol)
        if through_ray_client(address, config):
            return
        resolved = prepare(config, preset, output=output, tracking_uri=tracking_uri, address=address,
                           orderings=orderings, seed=seed, algorithm=algorithm, max_concurrent=max_concurrent,
                           study=study, backbone=backbone, weights=weights)
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
        with ray_session(resolved.config.compute.ray_address):
            if protocol == "conventional":
                outcome = conventional_phase(resolved, chosen, console)
            else:
                outcome = evaluate_phase(resolved, chosen, console)
        if protocol == "conventional":
            console.print(phase_summary(outcome.summary, resolved.tuning.dataset,
                                        "Conventional protocol: H* on the tuning classes (fresh orderings)"))
        else:
            console.print(phase_summary(outcome.summary, resolved.evaluation.dataset, "Evaluation phase"))
        _print_store(resolved)
    _run_guarded(go)


@app.command()
def run(config: Optional[Path] = ConfigOpt, preset: Optional[str] = PresetOpt, output: Optional[Path] = OutputOpt,
        tracking_uri: Optional[str] = UriOpt, address: Optional[str] = AddressOpt, trials: Optional[int] = TrialsOpt,
        orderings: Optional[int] = OrderingsOpt, seed: Optional[int] = SeedOpt, algorithm: Optional[str] = AlgorithmOpt,
        max_concurrent: Optional[int] = ConcurrentOpt, study: Optional[str] = StudyOpt,
         backbone: Optional[str] = BackboneOpt, weights: Optional[Path] = WeightsOpt,
         resume: Optional[Path] = ResumeOpt, protocol: str = ProtocolOpt,
         with_original: bool = typer.Option(False, "--with-original", help="also evaluate the algorithm's original "
                                            "preset on D^E beside H* (the paper's 'Original')")) -> None:
    """Both phases: tune on D^HT, evaluate H* on D^E, print them side by side. No options: the embedded default."""
    def go():
        from gtep.orchestration.phases import (conventional_phase, evaluate_phase, original_best, original_phase,
                                               ray_session, tune_phase)
        from gtep.orchestration.study import read_best
        from gtep.report.tables import hparams_table, phase_comparison

        check_protocol(protocol)
        if through_ray_client(address, config):
            return
        start = time.perf_counter()
        resolved = prepare(config, preset, resume, output=output, tracking_uri=tracking_uri, address=address,
                           trials=trials, orderings=orderings, seed=seed, algorithm=algorithm,
                           max_concurrent=max_concurrent, study=study, backbone=backbone, weights=weights)
        cfg = resolved.config
        console.print(f"[bold]gtep run[/] study={cfg.study} algorithm={cfg.algorithm} backbone={cfg.backbone} "
                      f"scenario={cfg.scenario.increments} R={cfg.search.trials} S={cfg.search.orderings}")
        if with_original:
            original_best(resolved)  # a missing preset is an error before any compute
        extra = {}
        with ray_session(cfg.compute.ray_address):
            tuned = tune_phase(resolved, console, resume=resume is not None)
            best = read_best(tuned.paths.best)
            evaluated = evaluate_phase(resolved, best, console, resume=resume is not None)
            if protocol == "conventional":
                extra["conventional"] = conventional_phase(resolved, best, console, resume=resume is not None).summary
            if with_original:
                extra["original"] = original_phase(resolved, console, resume=resume is not None).summary
        console.print(hparams_table(tuned.hparams, f"H* (set {tuned.set_index} of {cfg.search.trials})"))
        console.print(phase_comparison(tuned.summary, evaluated.summary, resolved.tuning.dataset,
                                       resolved.evaluation.dataset, f"GTEP: {cfg.algorithm} on {cfg.scenario.increments}",
                                       extra=extra))
        console.print(f"study folder: {tuned.paths.root}  (best.yaml, manifest.json, *_results.csv)")
        _print_store(resolved)
        console.print(f"wall time: {time.perf_counter() - start:.0f} s")
    _run_guarded(go)


def parse_classes(text: str) -> list[int]:
    """'0-99', '0,5,7' or '@file' (ids separated by commas, spaces or newlines)."""
    if text.startswith("@"):
        path = Path(text[1:])
        if not path.exists():
            raise ConfigError("--classes", f"{path} does not exist")
        text = path.read_text().replace("\n", ",").replace(" ", ",")
    ids: list[int] = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        try:
            if "-" in part:
                low, high = part.split("-")
                ids += list(range(int(low), int(high) + 1))
            else:
                ids.append(int(part))
        except ValueError:
            raise ConfigError("--classes", f"cannot read {part!r}; write e.g. 0-99 or 0,5,7 or @file") from None
    if not ids:
        raise ConfigError("--classes", "no classes given")
    return ids


@app.command()
def pretrain(dataset: str = typer.Option(..., "--dataset", help="e.g. npz:../shared/data/tinyimagenet200_32.npz"),
             classes: str = typer.Option(..., "--classes", help="classes to pretrain on, kept out of both phases: 100-199"),
             backbone: str = typer.Option("vit_micro_patch4_32", "--backbone", help="a timm ViT name"),
             out: Path = typer.Option(..., "--out", help="the .safetensors file to write"),
             epochs: int = typer.Option(30, "--epochs", min=1), lr: float = typer.Option(1e-3, "--lr"),
             batch_size: int = typer.Option(64, "--batch-size", min=1), seed: int = typer.Option(0, "--seed"),
             device: str = typer.Option("auto", "--device"), threads: int = typer.Option(0, "--threads", help="0: torch default")) -> None:
    """Train a ViT backbone on held-out classes and save it as pretrained weights (no downloads needed)."""
    def go():
        import torch
        from rich.progress import Progress

        from gtep.data import DatasetError, resolve_dataset
        from gtep.engine.pretrain import PretrainSpec, pretrain as run_pretrain
        from gtep.models.vit import is_vit

        if not is_vit(backbone):
            raise ConfigError("--backbone", f"{backbone!r} is not a ViT; use vit_micro_patch4_32 or a timm ViT name")
        if out.suffix != ".safetensors":
            raise ConfigError("--out", f"{out} should end in .safetensors")
        ids = parse_classes(classes)
        try:
            source = resolve_dataset(dataset)
            names = source.class_names
        except DatasetError as err:
            raise ConfigError("--dataset", str(err)) from None
        bad = [c for c in ids if not 0 <= c < len(names)]
        if bad:
            raise ConfigError("--classes", f"ids {bad[:5]} are outside 0..{len(names) - 1}")
        if threads:
            torch.set_num_threads(threads)
        spec = PretrainSpec(backbone, tuple(ids), epochs, lr, batch_size, seed=seed, device=device)
        with Progress(console=console) as progress:
            bar = progress.add_task(f"pretrain {backbone} on {len(ids)} classes", total=epochs)
            result = run_pretrain(spec, source.load(), source.name, out, on_epoch=lambda e: progress.advance(bar))
        console.print(f"wrote {out}: {result.parameters:,} parameters, train acc {100 * result.train_accuracy:.1f}%, "
                      f"test acc {100 * result.test_accuracy:.1f}% on the {len(ids)} pretraining classes, "
                      f"{result.seconds:.0f} s")
    _run_guarded(go)


@app.command()
def ui(output: Path = typer.Option(Path("gtep-runs"), "--output", help="the --output folder of the runs"),
       tracking_uri: Optional[str] = UriOpt, host: str = typer.Option("127.0.0.1", help="bind address"),
       port: int = typer.Option(5000, help="port")) -> None:
    """The MLflow UI over the store the runs went to (127.0.0.1 unless --host says otherwise)."""
    uri = tracking_uri or f"sqlite:///{output.resolve()}/mlflow.db"
    if uri.startswith("sqlite:///") and not Path(uri[len("sqlite:///"):]).exists():
        fail(f"--output: no MLflow store at {uri[len('sqlite:///'):]}; run gtep run first or pass --output")
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    console.print(f"MLflow UI on http://{host}:{port} over {uri} (Ctrl-C stops it)")
    cmd = [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", uri, "--host", host, "--port", str(port)]
    raise typer.Exit(subprocess.call(cmd, env=env))


def mlflow_server_command(backend_store_uri: str, artifacts_destination: str, host: str, port: int,
                          workers: int) -> list[str]:
    """The `mlflow server` line `gtep server` runs (README shows it for use without gtep)."""
    return [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", backend_store_uri,
            "--artifacts-destination", artifacts_destination, "--serve-artifacts",
            "--host", host, "--port", str(port), "--workers", str(workers)]


@app.command()
def server(backend_store_uri: str = typer.Option("sqlite:///gtep-server/mlflow.db", "--backend-store-uri",
                                                 help="postgresql://user:pass@host:5432/db for a shared server"),
           artifacts_destination: str = typer.Option("gtep-server/mlartifacts", "--artifacts-destination",
                                                     help="a folder, s3://... or gs://... for run artifacts"),
           host: str = typer.Option("127.0.0.1", help="bind address (0.0.0.0 only inside a private network)"),
           port: int = typer.Option(5000, help="port"), workers: int = typer.Option(2, help="server worker processes")) -> None:
    """An MLflow tracking server for studies on a cluster (log to it with --tracking-uri http://HOST:PORT)."""
    def go():
        import importlib.util

        scheme = backend_store_uri.split(":", 1)[0]
        driver = "psycopg2" if scheme == "postgresql+psycopg2" else "psycopg"
        if scheme.startswith("postgresql") and importlib.util.find_spec(driver) is None:
            raise ConfigError("--backend-store-uri", f"PostgreSQL needs its driver {driver}: pip install 'gtep[server]'")
        if scheme == "sqlite":
            Path(backend_store_uri[len("sqlite:///"):]).parent.mkdir(parents=True, exist_ok=True)
        if "://" not in artifacts_destination:
            Path(artifacts_destination).mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
        console.print(f"MLflow tracking server on http://{host}:{port} (store {backend_store_uri.split('@')[-1]}, "
                      f"artifacts {artifacts_destination}); Ctrl-C stops it")
        cmd = mlflow_server_command(backend_store_uri, artifacts_destination, host, port, workers)
        raise typer.Exit(subprocess.call(cmd, env=env))
    _run_guarded(go)


@app.command()
def sync(study_dir: Path = typer.Argument(..., help="OUTPUT/STUDY: the study folder"),
         tracking_uri: Optional[str] = typer.Option(None, "--tracking-uri", help="write to another store than the study's")) -> None:
    """Write what a study could not write to MLflow while its tracking server was away."""
    def go():
        from gtep.orchestration.journal import TrackingJournal

        try:
            journal = TrackingJournal.load(study_dir, tracking_uri)
        except FileNotFoundError as err:
            raise ConfigError("study_dir", f"{err}; give the OUTPUT/STUDY folder of a study") from None
        before = len(journal.pending)
        left = journal.flush(force=True)
        console.print(f"{study_dir}: {before - left} writes applied to {journal.state.tracking_uri}, {left} waiting")
        if left:
            fail(f"--tracking-uri: {journal.state.tracking_uri} did not take them ({journal.last_error}); "
                 "run gtep sync again when it answers")
    _run_guarded(go)


JobsAddressOpt = typer.Option(None, "--address", envvar="RAY_ADDRESS",
                              help="the cluster's dashboard, http://HEAD:8265 [RAY_ADDRESS or http://127.0.0.1:8265]")


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def submit(ctx: typer.Context, config: Path = typer.Option(..., "--config", "-c", help="experiment YAML file"),
           phase: str = typer.Option("run", "--phase", help="tune, evaluate or run"),
           address: Optional[str] = JobsAddressOpt,
           wait: bool = typer.Option(False, "--wait", help="follow the job's log until it ends")) -> None:
    """Send a study to a Ray cluster as a Ray Job; further options (--output, --trials...) go to the phase command."""
    def go():
        from gtep.orchestration import jobs

        sent = jobs.submit(address, config, phase, list(ctx.args))
        console.print(f"submitted [bold]{sent.job_id}[/] to {sent.address}: {sent.entrypoint}")
        console.print(f"follow it: gtep jobs logs {sent.job_id} --follow --address {sent.address}")
        print(sent.job_id)
        if wait:
            for chunk in jobs.follow(sent.address, sent.job_id):
                sys.stdout.write(chunk)
            state = jobs.status(sent.address, sent.job_id)
            console.print(f"job {sent.job_id}: {state}")
            if state != "SUCCEEDED":
                raise typer.Exit(1)
    _run_guarded(go)


jobs_app = typer.Typer(no_args_is_help=True, help="Follow studies submitted with gtep submit (Ray Jobs).")
app.add_typer(jobs_app, name="jobs")


@jobs_app.command("status")
def jobs_status(job_id: str, address: Optional[str] = JobsAddressOpt,
                wait: bool = typer.Option(False, "--wait", help="block until the job ends; exit 1 unless it succeeded")) -> None:
    """A job's state: PENDING, RUNNING, SUCCEEDED, FAILED or STOPPED."""
    def go():
        from gtep.orchestration import jobs

        state = jobs.wait(address, job_id) if wait else jobs.status(address, job_id)
        console.print(f"{job_id}: {state}")
        if wait and state != "SUCCEEDED":
            raise typer.Exit(1)
    _run_guarded(go)


@jobs_app.command("logs")
def jobs_logs(job_id: str, address: Optional[str] = JobsAddressOpt,
              follow: bool = typer.Option(False, "--follow", "-f", help="keep printing until the job ends")) -> None:
    """The driver output of a job (the phase tables, progress and where its results went)."""
    def go():
        from gtep.orchestration import jobs

        if follow:
            for chunk in jobs.follow(address, job_id):
                sys.stdout.write(chunk)
        else:
            sys.stdout.write(jobs.logs(address, job_id))
    _run_guarded(go)


@jobs_app.command("stop")
def jobs_stop(job_id: str, address: Optional[str] = JobsAddressOpt) -> None:
    """Stop a job; resume the study later with gtep tune|run --resume OUTPUT/STUDY."""
    def go():
        from gtep.orchestration import jobs

        stopped = jobs.stop(address, job_id)
        console.print(f"{job_id}: {'stopping' if stopped else 'had already ended'}")
    _run_guarded(go)


@jobs_app.command("list")
def jobs_list(address: Optional[str] = JobsAddressOpt) -> None:
    """The cluster's jobs."""
    def go():
        from gtep.orchestration import jobs

        table = Table(title="Ray jobs")
        for column in ("id", "status", "start", "entrypoint"):
            table.add_column(column, no_wrap=column != "entrypoint")
        for job in jobs.listing(address):
            table.add_row(job["id"], job["status"], job["start"], job["entrypoint"])
        console.print(table)
    _run_guarded(go)


@app.command()
def algorithms() -> None:
    """Registered algorithms with their tuned hyperparameter counts (paper Figure 10)."""
    from gtep.algorithms import ALGORITHMS
    from gtep.spaces import SearchSpaceError, load_space

    table = Table(title="algorithms")
    for column in ("name", "method", "tuned hyperparameters", "presets"):
        table.add_column(column, no_wrap=column == "name")
    for name in ALGORITHMS.names():
        cls = ALGORITHMS.get(name)
        try:
            space = load_space(name)
            tuned, presets = str(len(space.space.names)), ", ".join(space.presets)
        except SearchSpaceError:
            tuned, presets = "-", "(no search space)"
        doc = (cls.__doc__ or sys.modules[cls.__module__].__doc__ or "").strip()
        flat = " ".join(doc.split())
        cited = re.match(r"^[^(:.]*\([^)]*\)", flat)  # "BiC (Wu et al., CVPR 2019)"
        summary = cited.group(0) if cited else flat.split(". ")[0]
        table.add_row(name, summary[:60], tuned, presets)
    console.print(table)


@app.command()
def spaces(algorithm: Optional[str] = typer.Argument(None, help="an algorithm; all if omitted")) -> None:
    """A search space with its value sets and presets."""
    from gtep.algorithms import ALGORITHMS
    from gtep.spaces import SearchSpaceError, load_space

    names = [algorithm] if algorithm else ALGORITHMS.names()
    for name in names:
        try:
            space = load_space(name) if name in ALGORITHMS else fail(
                f"algorithm: unknown algorithm {name!r}; choose from {ALGORITHMS.names()}")
        except SearchSpaceError as err:
            if algorithm:
                fail(str(err))
            continue
        table = Table(title=f"{name}  ({space.path}, {space.space.size():,} combinations)")
        table.add_column("hyperparameter")
        table.add_column("values")
        for preset in space.presets:
            table.add_column(f"preset: {preset}")
        for key, values in space.space.sets.items():
            table.add_row(key, ", ".join(map(str, values)), *[str(p.get(key, "")) for p in space.presets.values()])
        console.print(table)


@app.command()
def presets() -> None:
    """Scenarios shipped with gtep (use with --preset NAME)."""
    import yaml

    table = Table(title="presets")
    for column in ("name", "algorithm", "scenario", "datasets", "R x S", "description"):
        table.add_column(column, no_wrap=column == "name")
    for name in preset_names():
        text = preset_text(name)
        doc = yaml.safe_load(text)
        comment = " ".join(line.lstrip("# ").strip() for line in text.splitlines() if line.startswith("#"))
        data = doc["datasets"]
        datasets = data["split"]["dataset"] + " (split)" if "split" in data else \
            f"{data['tuning']['dataset']} -> {data['evaluation']['dataset']}"
        search = doc.get("search", {})
        table.add_row(name, doc["algorithm"], str(doc["scenario"]["increments"]), datasets,
                      f"{search.get('trials', 30)} x {search.get('orderings', 5)}", comment[:120])
    console.print(table)
    from gtep.matrix import matrix_preset_names

    console.print(f"matrix presets (gtep matrix --preset NAME; gtep matrices): {', '.join(matrix_preset_names())}")


app.command("report")(report_command)
app.command("matrix")(matrix_command)
app.command("matrices")(matrices_command)


if __name__ == "__main__":
    app()
