"""The Ray side of a phase: joining or starting Ray, checking a trial fits a node, the searcher and the trial
scheduler of search.*, the Tuner run that stops on SIGINT/SIGTERM, and the terminal's progress bar."""
from __future__ import annotations

import logging
import os
import socket
from contextlib import contextmanager
from typing import Any, Callable, Iterator
from urllib.parse import urlparse

import ray
from ray import tune
from ray.tune.search import ConcurrencyLimiter, SearchAlgorithm, Searcher
from ray.tune.search.basic_variant import BasicVariantGenerator
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from gtep.config import ConfigError, ResolvedExperiment
from gtep.orchestration.interrupt import Interruption, StopOnSignal, interruptible
from gtep.orchestration.node_loss import NodeLossCallback, watching_node_loss
from gtep.orchestration.quiet import quiet_libraries
from gtep.orchestration.study import Manifest, StudyPaths
from gtep.protocol.phases import Phase


def check_address(address: str | None) -> None:
    """An address that answers nothing is a clear error before Ray tries for minutes."""
    if not address or address == "auto":
        return
    parsed = urlparse(address if "://" in address else f"ray://{address}")
    host, port = parsed.hostname, parsed.port
    if not host or not port:
        raise ConfigError("--address", f"{address!r} is not host:port, ray://host:port or 'auto'")
    try:
        with socket.create_connection((host, port), timeout=3):
            pass
    except OSError as err:
        raise ConfigError("--address", f"no Ray cluster answers at {address} ({err.strerror or err}); "
                          "start one (ray start --head) or leave --address out to run locally") from None



@contextmanager
def ray_session(address: str | None) -> Iterator[None]:
    """Join the given cluster, or start Ray on this machine; always shut down what we started.

    A local Ray keeps its default token authentication (Ray >= 2.5x), which guards its ports; tests and CI
    set RAY_AUTH_MODE=disabled as ../shared/INSTALL.md advises. While the session lasts, the library lines a user
    cannot act on (Ray's note that it enabled that default, among others) are dropped: gtep.orchestration.quiet."""
    os.environ.setdefault("RAY_CHDIR_TO_TRIAL_DIR", "0")  # trials keep the driver's working directory
    os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")  # JSON/CSV are added explicitly, no TensorBoard
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")  # with verbose=0 the terminal shows only gtep's progress
    started = False
    with quiet_libraries():
        if not ray.is_initialized():
            kwargs: dict[str, Any] = dict(include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING,
                                          configure_logging=True)
            ray.init(address=address, **kwargs)
            started = True
        try:
            yield
        finally:
            if started:
                ray.shutdown()



def check_resources(resolved: ResolvedExperiment) -> None:
    """A trial that can never be placed is an error, not a hang (ray-project/ray#18332): some node must hold
    one trial's CPUs and GPUs. Checked against the nodes alive now (with an autoscaler, keep one worker up)."""
    compute = resolved.config.compute
    nodes = [n.get("Resources", {}) for n in ray.nodes() if n.get("Alive")]
    asked = {"CPU": compute.cpus_per_trial, "GPU": compute.gpus_per_trial}
    if any(all(node.get(key, 0) >= value for key, value in asked.items() if value) for node in nodes):
        return
    for key, value in asked.items():
        largest = max((node.get(key, 0) for node in nodes), default=0)
        if value > largest:
            field = "compute.cpus_per_trial" if key == "CPU" else "compute.gpus_per_trial"
            raise ConfigError(field, f"asks {value:g} {key} per trial but the largest of the cluster's {len(nodes)} "
                              f"node(s) has {largest:g}; lower it or add larger nodes")
    raise ConfigError("compute.cpus_per_trial", f"no node of the cluster has {asked['CPU']:g} CPU and "
                      f"{asked['GPU']:g} GPU at once; lower compute.cpus_per_trial or compute.gpus_per_trial")



def ray_loggers() -> list[tune.Callback]:
    """Ray's own per-trial result files (result.json, progress.csv); MLflow remains the record."""
    from ray.tune.logger import CSVLoggerCallback, JsonLoggerCallback

    return [JsonLoggerCallback(), CSVLoggerCallback()]



def progress_bar(console: Console) -> Progress:
    """Redrawn twice a second on a terminal, and never by its timer elsewhere (a log file, a Ray job's output): at
    rich's default ten a second, its thread took a tenth of a 32-trial driver's CPU (py-spy; cluster_sim.py)."""
    return Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TextColumn("{task.fields[status]}"), TimeElapsedColumn(), console=console, transient=False,
                    **redraws(console))


def redraws(console: Console) -> dict[str, Any]:
    """A live display's timer settings: twice a second on a terminal, off where nobody watches it redraw."""
    return {"auto_refresh": console.is_terminal, "refresh_per_second": 2}



class ProgressCallback(tune.Callback):
    """Advances with the manifest's units, so reused units of a resumed study are not counted twice.
    Runs after the MLflow writer, which records the units."""

    def __init__(self, progress: Progress, task_id: Any, manifest: Manifest, phase: Phase) -> None:
        self.progress, self.task_id, self.manifest, self.phase = progress, task_id, manifest, phase

    def __getstate__(self) -> dict[str, Any]:
        return {}  # the live progress bar stays on the driver when Ray pickles its run config

    def on_trial_result(self, iteration, trials, trial, result, **info) -> None:
        if "ordering" in result:
            status = f"last: acc {result.get('acc', float('nan')):.3f} ({result['status']})"
            self.progress.update(self.task_id, completed=len(self.manifest.units(self.phase.name)), status=status)



def run_trials(resolved: ResolvedExperiment, paths: StudyPaths, phase: Phase, attempt: str, trainable: Any,
               param_space: dict[str, Any], search_alg, num_samples: int, callbacks: list[tune.Callback],
               console: Console) -> Interruption:
    """The phase's trials on Ray Tune, stopped early by SIGINT/SIGTERM (gtep.orchestration.interrupt); a node lost
    meanwhile is one line here and Ray's account of it goes to the study's log (gtep.orchestration.node_loss)."""
    with interruptible(console.print) as interruption, watching_node_loss(paths.root, yellow(console)) as watch:
        run_tuner(resolved, paths, phase, attempt, trainable, param_space, search_alg, num_samples,
                  [*callbacks, NodeLossCallback(watch)], StopOnSignal(interruption))
    return interruption


def yellow(console: Console) -> Callable[[str], None]:
    """A one-line notice on the terminal, as the node-loss watch says a loss."""
    return lambda line: console.print(f"[yellow]{line}[/]", highlight=False, soft_wrap=True)


@contextmanager
def study_session(resolved: ResolvedExperiment, console: Console) -> Iterator[None]:
    """Ray for a study's phases (ray_session), with one node-loss watch over all of them and the gaps between:
    the GCS declares a lost node dead some seconds late, often after the phase that lost it ended."""
    with ray_session(resolved.config.compute.ray_address), \
            watching_node_loss(resolved.config.study_dir, yellow(console)):
        yield



def searcher(resolved: ResolvedExperiment, manifest: Manifest, space, S: int):
    """(param_space, search_alg, num_samples) for the configured searcher."""
    cfg = resolved.config
    if cfg.search.searcher == "random":
        param_space = {"trial": tune.grid_search([{"set_index": s["index"], "hparams": s["hparams"]}
                                                  for s in manifest.data["sets"]]),
                       "orderings": list(range(S))}
        # the generator takes the concurrency limit itself (see concurrency_limited)
        generator = BasicVariantGenerator(random_state=cfg.seed, max_concurrent=cfg.compute.max_concurrent or 0)
        return param_space, generator, 1
    import optuna
    from ray.tune.search.optuna import OptunaSearch

    sampler = (optuna.samplers.TPESampler(seed=cfg.seed) if cfg.search.searcher == "optuna-tpe"
               else optuna.samplers.RandomSampler(seed=cfg.seed))
    # a resumed search first replays the sets it had suggested (their finished units are reused)
    replay = [{"hparams": s["hparams"], "orderings": list(range(S))} for s in manifest.data["sets"]]
    param_space = {"hparams": {k: tune.choice(list(v)) for k, v in space.sets.items()}, "orderings": list(range(S))}
    return param_space, OptunaSearch(metric="score", mode="max", sampler=sampler,
                                     points_to_evaluate=replay or None), cfg.search.trials



def trial_scheduler(resolved: ResolvedExperiment):
    """search.scheduler as a Ray Tune scheduler on the orderings axis (time_attr orderings_done, the running
    score), search.pruner as Optuna's pruner in one (gtep/orchestration/pruning.py), or None. Its options were
    checked with the config (grace_period below S)."""
    search = resolved.config.search
    per_task = search.fidelity == "tasks"
    if search.pruner != "none":
        from gtep.orchestration.pruning import OptunaPruningScheduler, make_pruner

        # a pruner's steps are whole numbers: orderings done, or tasks done with fidelity tasks
        steps = search.orderings * tasks_per_ordering(resolved) if per_task else search.orderings
        return OptunaPruningScheduler(make_pruner(search.pruner, search.pruner_options, steps), steps,
                                      "tasks_done" if per_task else "orderings_done")
    if search.scheduler == "none":
        return None
    from ray.tune.schedulers import ASHAScheduler, HyperBandScheduler

    options = search.scheduler_options
    time_attr = "progress" if per_task else "orderings_done"  # progress: orderings done + tasks done / T
    if search.scheduler == "asha":
        # Ray annotates grace_period as int; its rungs are grace * rf^k compared with a float time (progress)
        return ASHAScheduler(time_attr=time_attr, metric="score", mode="max", max_t=search.orderings,
                             grace_period=options.grace_period,  # type: ignore[arg-type]
                             reduction_factor=options.reduction_factor, brackets=options.brackets)
    return HyperBandScheduler(time_attr=time_attr, metric="score", mode="max", max_t=search.orderings,
                              reduction_factor=options.reduction_factor)



def tasks_per_ordering(resolved: ResolvedExperiment) -> int:
    """T of a tuning ordering: the scenario's tasks, or k with the first-task protocol."""
    search = resolved.config.search
    return search.protocol_tasks if search.protocol == "first_task" else len(resolved.increments)



def concurrency_limited(search_alg: SearchAlgorithm | Searcher | None,
                        max_concurrent: int | None) -> SearchAlgorithm | Searcher:
    """The search algorithm holding compute.max_concurrent itself, whichever searcher runs, so the Tuner is never
    given max_concurrent_trials: Tune applies that to a Searcher alone and, for a search generator such as the random
    searcher's BasicVariantGenerator, only warns "`max_concurrent_trials` will be ignored". None (a fixed-set
    phase's grid): a BasicVariantGenerator, as Tune would build. Another search generator is refused rather than left
    unlimited."""
    if search_alg is None:
        return BasicVariantGenerator(max_concurrent=max_concurrent or 0)
    if isinstance(search_alg, BasicVariantGenerator):
        search_alg.max_concurrent = max_concurrent or 0
        return search_alg
    if isinstance(search_alg, ConcurrencyLimiter):
        if max_concurrent and search_alg.max_concurrent != max_concurrent:
            search_alg.set_max_concurrency(max_concurrent)
        return search_alg
    if isinstance(search_alg, Searcher):
        return ConcurrencyLimiter(search_alg, max_concurrent=max_concurrent) if max_concurrent else search_alg
    raise TypeError(f"{type(search_alg).__name__} cannot be held to compute.max_concurrent: give a Ray Tune Searcher "
                    "or a BasicVariantGenerator")



def run_tuner(resolved: ResolvedExperiment, paths: StudyPaths, phase: Phase, attempt: str, trainable: Any,
              param_space: dict[str, Any], search_alg, num_samples: int, callbacks: list[tune.Callback],
              stopper: tune.Stopper | None = None) -> None:
    cfg = resolved.config
    scheduler = trial_scheduler(resolved) if phase.selects_best else None
    tuner = tune.Tuner(
        trainable,
        param_space=param_space,
        # reuse_actors: the next trial runs in the worker process of a finished one (same resources), instead
        # of a new process importing torch and gtep again (~3 s per trial on a 2-core machine). A trial keeps
        # no state between runs: every ordering seeds its own RNGs and sets its threads.
        # max_concurrent_trials stays None: the search algorithm holds compute.max_concurrent (concurrency_limited)
        tune_config=tune.TuneConfig(num_samples=num_samples,
                                    search_alg=concurrency_limited(search_alg, cfg.compute.max_concurrent),
                                    max_concurrent_trials=None, reuse_actors=True, scheduler=scheduler),
        run_config=tune.RunConfig(name=f"{phase.name}-{attempt}", storage_path=str(paths.ray_storage), verbose=0,
                                  callbacks=[*callbacks, *ray_loggers()], stop=stopper,
                                  failure_config=tune.FailureConfig(max_failures=cfg.compute.max_failures)),
    )
    tuner.fit()
