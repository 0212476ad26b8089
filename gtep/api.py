"""gtep from Python: what the command line does, for notebooks and scripts.

    import gtep

    cfg = gtep.experiment(preset="default", trials=2, orderings=1, output="runs")
    study = gtep.run(cfg)
    study.best                # H*: {"lr": ..., ...}
    study.table               # the phases side by side (pandas)
    study.tuning.sets         # one row per hyperparameter set: its score, status and values
    study.evaluation.orderings  # one row per class ordering of D^E

Each function runs the same pre-flight checks as the CLI (a ConfigError naming the field, before any compute),
tracks in the same MLflow store, writes the same study folder and resumes the same way: `gtep run` is a thin layer
over `gtep.run`, and the phase functions print what the commands print (H*, the phases side by side, the study
folder; `quiet=True` for nothing). The results show the same tables as their repr (and as HTML in a notebook).
Errors are exceptions (ConfigError, StudyStopped when a phase stops before its result is
complete); nothing calls sys.exit.
"""
from __future__ import annotations

import io
import json
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Mapping, Optional

from rich.console import Console, RenderableType
from rich.markup import escape

from gtep.config import (
    ConfigError,
    ExperimentConfig,
    ResolvedExperiment,
    load_config,
    load_preset,
    validate_config,
)
from gtep.config.resolution import check_algorithm
from gtep.protocol.phases import CONVENTIONAL, EVALUATE, TUNE, Phase, phase_named, phases_in_order, study_phases

if TYPE_CHECKING:
    import pandas as pd

    from gtep.protocol.replay import ReplayOutcome
    from gtep.reporting.build import Report

# The keyword arguments of `experiment` (and of the CLI's options) and the config field each one sets.
OPTION_FIELDS = {"output": "tracking.output", "tracking_uri": "tracking.tracking_uri", "address": "compute.ray_address",
                 "trials": "search.trials", "orderings": "search.orderings", "seed": "seed", "algorithm": "algorithm",
                 "max_concurrent": "compute.max_concurrent", "study": "study", "backbone": "backbone",
                 "weights": "weights", "protocol": "search.protocol", "protocol_tasks": "search.protocol_tasks",
                 "scheduler": "search.scheduler"}
# counts a keyword must reach (the config says the same; this way the message names the keyword)
OPTION_MINIMUM = {"trials": 1, "orderings": 1, "max_concurrent": 1, "seed": 0, "protocol_tasks": 1}


# ---------------------------------------------------------------- configs


def experiment(source: str | Path | Mapping[str, Any] | ExperimentConfig | None = None, *, preset: Optional[str] = None,
           fields: Optional[Mapping[str, Any]] = None, **options: Any) -> ExperimentConfig:
    """An experiment config, validated: from a YAML file (`source` a path), a mapping shaped like the YAML file,
    a preset (`preset="default"`, the CLI's --preset; the default when nothing is given) or another config;
    then `options` as the CLI's options (trials, orderings, seed, algorithm, output, tracking_uri, address,
    max_concurrent, study, backbone, weights, protocol, protocol_tasks, scheduler) and `fields` as dotted config
    paths ({"training.epoch_scale": 0.1, "scenario.increments": "5x4"}). A bad value is a ConfigError naming
    the field."""
    unknown = sorted(set(options) - set(OPTION_FIELDS))
    if unknown:
        raise ConfigError(unknown[0], f"is not an option of gtep.experiment; choose from {', '.join(OPTION_FIELDS)}, "
                          "or set any config field with fields={'section.name': value}")
    if source is not None and preset is not None:
        raise ConfigError("preset", "give either a config source or a preset, not both")
    check_counts(**options)
    cfg = _base_config(source, preset)
    if options.get("output") is not None and not str(options["output"]).strip():
        # Path("") is Path("."): refused while the empty string can still be told from "." (the CLI does the same)
        raise ConfigError("output", "is empty, which would mean the current folder (a study's files among yours); "
                          "give a folder (e.g. output='gtep-runs'), or leave it out for ./gtep-runs")
    for key in ("output", "weights"):
        if options.get(key) is not None:
            options[key] = Path(options[key])
    overrides = {OPTION_FIELDS[key]: value for key, value in options.items()}
    made = cfg.with_overrides(**overrides, **dict(fields or {}))
    check_algorithm(made.algorithm)  # at once, not when the experiment first runs
    return made


def check_counts(**options: Any) -> None:
    """Counts given as options (trials, orderings, max_concurrent, seed, protocol_tasks) reach their minimum."""
    for key, least in OPTION_MINIMUM.items():
        if options.get(key) is not None and options[key] < least:
            raise ConfigError(key, f"must be >= {least}, got {options[key]}")


def _base_config(source: Any, preset: Optional[str]) -> ExperimentConfig:
    if isinstance(source, ExperimentConfig):
        return source
    if isinstance(source, Mapping):
        return validate_config(dict(source), "gtep.experiment(mapping)")
    if source is not None:
        return load_config(Path(source))
    return load_preset(preset or "default")


def study_config(study_dir: str | Path, *, address: Optional[str] = None,
                 tracking_uri: Optional[str] = None) -> ExperimentConfig:
    """The config a study was started with (its manifest), placed where the study folder is now: what a resume
    runs. Only the cluster address and the tracking URI may change."""
    study_dir = Path(study_dir)
    manifest = study_dir / "manifest.json"
    if not manifest.exists():
        raise ConfigError("resume", f"{study_dir} has no manifest.json; give the OUTPUT/STUDY folder of a study "
                          "that gtep tune or gtep run started")
    try:
        stored = json.loads(manifest.read_text()).get("config")
    except (ValueError, OSError, AttributeError) as err:
        raise ConfigError("resume", f"{manifest} is not a gtep manifest ({err.__class__.__name__}); give the "
                          "OUTPUT/STUDY folder of a study that gtep tune or gtep run started") from None
    try:
        cfg = validate_config(stored, str(manifest))
    except ConfigError as err:
        raise ConfigError("resume", f"{manifest} holds a config gtep cannot use ({err}); give the OUTPUT/STUDY "
                          "folder of a study that gtep tune or gtep run started") from None
    return cfg.with_overrides(**{"tracking.output": study_dir.resolve().parent, "study": study_dir.name,
                                 "compute.ray_address": address, "tracking.tracking_uri": tracking_uri})


def check(cfg: ExperimentConfig, console: Optional[Console] = None) -> ResolvedExperiment:
    """Every check that needs no compute (the file, the names, the data, the search space, the address, the
    store), as `gtep check` runs them; the resolved experiment the phases take."""
    from gtep.orchestration.ray_search import check_address
    from gtep.orchestration.tracking_store import check_tracking_server
    from gtep.preflight import preflight

    address = cfg.compute.ray_address
    if address and address.startswith("ray://"):
        raise ConfigError("compute.ray_address", f"{address}: the Python API drives the study from this process; "
                          "give the cluster's host:port (run this script on a node of the cluster), or submit it "
                          "with `gtep submit`")
    resolved = preflight(cfg).resolved
    check_address(resolved.config.compute.ray_address)
    check_tracking_server(resolved.config.tracking_uri)  # the address itself was checked once, by the resolution
    say = (console or Console()).print
    for phase, note in resolved.data_conversions.items():  # and in the runs' params
        say(f"[yellow]note:[/] {escape(phase)} phase data converted: {escape(note)}", highlight=False)
    return resolved


def resolve(source: str | Path | Mapping[str, Any] | ExperimentConfig | None = None, *,
            preset: Optional[str] = None, resume: str | Path | None = None,
            fields: Optional[Mapping[str, Any]] = None, console: Optional[Console] = None,
            **options: Any) -> ResolvedExperiment:
    """The resolved experiment a phase function takes, in one call: the config `experiment` builds from `source`,
    `preset`, `options` and `fields`, or with `resume=OUTPUT/STUDY` the study's own (`study_config`: only the
    options address and tracking_uri may be given), then every check `check` runs. The commands tune | evaluate
    | run build it once and hand it down (DESIGN.md, "Downward only"); the phase functions resolve nothing again."""
    if resume is not None:
        extra = sorted(k for k, v in options.items() if v is not None and k not in ("address", "tracking_uri"))
        if source is not None or preset is not None or fields or extra:
            raise ConfigError("resume", "a study resumes with the config it started with; beside resume= give only "
                              "address= and tracking_uri=")
        cfg = study_config(resume, address=options.get("address"), tracking_uri=options.get("tracking_uri"))
    else:
        cfg = experiment(source, preset=preset, fields=fields, **options)
    return check(cfg, console)


# ---------------------------------------------------------------- results


@dataclass
class PhaseResult:
    """One phase's outcome: the set it trained (H* for evaluation), its summary over the orderings (mean and
    std of Acc, AvgAcc, HM, the family's metrics; fractions, not percent), its MLflow run and its study folder."""
    phase: str
    run_id: str
    set_index: int
    hparams: dict[str, Any]
    summary: dict[str, Any]
    folder: Path
    extra: dict[str, Any] = field(default_factory=dict)
    dataset: str = ""  # the phase's data, as the tables caption it: "omniglot tuning (20 classes)"

    @property
    def orderings(self) -> "pd.DataFrame":
        """One row per (set, ordering) unit of this phase, as <study>/<phase>_results.csv holds them: status,
        acc, avg_acc, hmean, forgetting, the family's metrics, training seconds and the set's values (h.*)."""
        import pandas as pd

        path = self.folder / f"{self.phase}_results.csv"
        return pd.read_csv(path) if path.exists() else pd.DataFrame()

    @property
    def complete(self) -> bool:
        """All S orderings have a result (a diverged ordering counts: it is a result)."""
        return int(self.summary.get("orderings", 0)) >= int(self.summary.get("expected", 0))

    def renderables(self) -> list[RenderableType]:
        """What `gtep evaluate` prints for this phase: its summary over the orderings."""
        from gtep.reporting.tables import phase_summary

        record = phase_named(self.phase)
        return [phase_summary(self.summary, self.dataset, record.title if record and record.title else
                              f"{self.phase} phase")]

    def __repr__(self) -> str:
        return plain_text(self.renderables())


@dataclass(repr=False)  # keeps PhaseResult's __repr__ (a dataclass would write its own)
class TuneResult(PhaseResult):
    """The tuning phase: `hparams` is H*, `set_index` its set, `sets` every set's score."""

    @property
    def best(self) -> dict[str, Any]:
        return dict(self.hparams)

    def renderables(self) -> list[RenderableType]:
        """What `gtep tune` prints: H*'s summary on the tuning phase, its values, the study's files."""
        from gtep.reporting.tables import hparams_table, phase_summary

        files = (f"best.yaml: {escape(str(self.folder / 'best.yaml'))}\n"
                 f"manifest:  {escape(str(self.folder / 'manifest.json'))}\ntuning run: {self.run_id}")
        return [phase_summary(self.summary, self.dataset, f"H* on the tuning phase (set {self.set_index})"),
                hparams_table(self.hparams, "H*"), files]

    @property
    def sets(self) -> "pd.DataFrame":
        """One row per sampled set: its criterion score (hmean_of_means), mean Acc and AvgAcc over its orderings,
        status (complete, incomplete, diverged, stopped), whether it is H*, and its values (h.*)."""
        import pandas as pd

        manifest = json.loads((self.folder / "manifest.json").read_text())
        scores = {s["set_index"]: s for s in manifest["phases"].get(TUNE.name, {}).get("scores", [])}
        rows = []
        for entry in manifest.get("sets", []):
            index = int(entry["index"])
            row = {"set_index": index, **scores.get(index, {"status": "missing"}), "is_best": index == self.set_index}
            rows.append({**row, **{f"h.{k}": v for k, v in entry.get("hparams", {}).items()}})
        return pd.DataFrame(rows)


@dataclass(repr=False)  # __repr__ below: the table `gtep run` prints
class StudyResult:
    """Both phases of a study (and the extra phases run beside them: conventional, original). Its repr is what
    `gtep run` prints (H*, the phases side by side, the study folder); in a notebook, an HTML table."""
    tuning: TuneResult
    evaluation: PhaseResult
    extra: dict[str, PhaseResult] = field(default_factory=dict)
    config: Optional[ExperimentConfig] = None  # the study's config: the tables' titles (algorithm, scenario, R)

    @property
    def best(self) -> dict[str, Any]:
        return self.tuning.best

    @property
    def folder(self) -> Path:
        return self.tuning.folder

    @property
    def table(self) -> "pd.DataFrame":
        """The phases side by side, as `gtep run` prints them (percent): Acc, AvgAcc (mean and std over the
        orderings), HM, orderings finished of expected, diverged; then the gap tuning - evaluation."""
        return phases_table({"tuning": self.tuning, "evaluation": self.evaluation, **self.extra})

    def _titles(self) -> tuple[str, str]:
        """The H* table's title and the comparison's, as `gtep run` gives them (less without the config)."""
        cfg, index = self.config, self.tuning.set_index
        if cfg is None:
            return f"H* (set {index})", "GTEP"
        return f"H* (set {index} of {cfg.search.trials})", f"GTEP: {cfg.algorithm} on {cfg.scenario.describe()}"

    def renderables(self) -> list[RenderableType]:
        """What `gtep run` prints at its end: H*, the phases side by side, the study folder."""
        from gtep.reporting.tables import hparams_table, phase_comparison

        best_title, title = self._titles()
        comparison = phase_comparison(self.tuning.summary, self.evaluation.summary, self.tuning.dataset,
                                      self.evaluation.dataset, title,
                                      extra={name: phase.summary for name, phase in self.extra.items()})
        return [hparams_table(self.best, best_title), comparison,
                f"study folder: {escape(str(self.folder))}  (best.yaml, manifest.json, *_results.csv)"]

    def __repr__(self) -> str:
        return plain_text(self.renderables())

    def _repr_html_(self) -> str:
        """A notebook's view: H*'s values and the phases side by side (percent) as HTML tables, the study folder."""
        from html import escape as html

        best_title, title = self._titles()
        rows = "".join(f"<tr><th>{html(str(k))}</th><td>{html(str(v))}</td></tr>" for k, v in self.best.items())
        phases = self.table.drop(columns="run_id").to_html(float_format="{:.2f}".format, na_rep="")
        return (f"<div><h4>{html(best_title)}</h4><table>{rows}</table><h4>{html(title)} (percent)</h4>{phases}"
                f"<p>study folder: <code>{html(str(self.folder))}</code></p></div>")


def plain_text(renderables: list[RenderableType], width: int = 140) -> str:
    """Rich tables as plain text (no colours), for a repr: the same text the console shows."""
    buffer = io.StringIO()
    console = Console(file=buffer, width=width, color_system=None, force_terminal=False, force_jupyter=False)
    for renderable in renderables:
        console.print(renderable, highlight=False)
    return buffer.getvalue().rstrip()


def print_store(cfg: ExperimentConfig, console: Console) -> None:
    """Where the phase's runs are tracked, as the commands print it."""
    console.print(f"MLflow store: {escape(cfg.tracking_uri)}", highlight=False)
    if cfg.tracking.tracking_uri is None:
        console.print(f"Browse it with: [bold]gtep ui --output {escape(str(cfg.tracking.output))}[/]", highlight=False)


def phases_table(phases: Mapping[str, PhaseResult]) -> "pd.DataFrame":
    import pandas as pd

    rows = []
    for name, phase in phases.items():
        s = phase.summary
        rows.append({"phase": name, "acc": 100 * s["acc"], "acc_std": 100 * s["acc_std"],
                     "avg_acc": 100 * s["avg_acc"], "avg_acc_std": 100 * s["avg_acc_std"], "hmean": 100 * s["hmean"],
                     "orderings": int(s["orderings"]), "expected": int(s.get("expected", s["orderings"])),
                     "diverged": int(s["diverged"]), "run_id": phase.run_id})
    frame = pd.DataFrame(rows).set_index("phase")
    if {"tuning", "evaluation"} <= set(frame.index):
        gap = frame.loc["tuning", ["acc", "avg_acc", "hmean"]] - frame.loc["evaluation", ["acc", "avg_acc", "hmean"]]
        frame.loc["gap", ["acc", "avg_acc", "hmean"]] = gap.to_numpy()
    return frame


def _phase_result(outcome: Any, resolved: ResolvedExperiment, kind: type[PhaseResult] = PhaseResult) -> PhaseResult:
    spec = resolved.phase(outcome.phase)
    return kind(outcome.phase, outcome.run_id, outcome.set_index, dict(outcome.hparams), dict(outcome.summary),
                outcome.paths.root, dict(outcome.extra), spec.dataset)


def _step(phase: str) -> int:
    """Where a phase runs in a study's plan (its record's step); a name no phase has, last."""
    record = phase_named(phase)
    return record.step if record is not None else max((p.step for p in phases_in_order()), default=0) + 1


def _label(phase: str) -> str:
    """A phase's result name (its record's label: `original`, `conventional`); a name no phase has, as it is."""
    record = phase_named(phase)
    return record.label if record is not None else phase


def load(study_dir: str | Path) -> StudyResult | TuneResult:
    """A study folder's results as the functions return them, without running anything: a StudyResult when
    its evaluation finished, else the TuneResult of its tuning phase. A phase that did not finish is a
    ConfigError naming the folder (it never reads as complete)."""
    from gtep.orchestration.study import read_best

    folder = Path(study_dir)
    if not (folder / "manifest.json").exists():
        raise ConfigError("study_dir", f"{folder} has no manifest.json; give the OUTPUT/STUDY folder of a study")
    try:
        manifest = json.loads((folder / "manifest.json").read_text())
        phases = manifest.get("phases", {})
        tune = phases.get(TUNE.name, {})
    except (ValueError, OSError, AttributeError) as err:  # not JSON, or JSON of another shape
        raise ConfigError("study_dir", f"{folder / 'manifest.json'} is damaged ({err.__class__.__name__}); restore "
                          "it from a copy or run the study again") from None
    if tune.get("status") != "finished" or not (folder / "best.yaml").exists():
        raise ConfigError("study_dir", f"{folder}: its tuning phase is {tune.get('status', 'not started')}, not "
                          f"finished; resume it with gtep.tune(resume={str(folder)!r})")
    best = read_best(folder / "best.yaml")
    tuning = TuneResult(TUNE.name, best["tuning_run_id"], int(best["set_index"]), dict(best["hparams"]),
                        _tuning_summary(folder, manifest, best), folder, dataset=tune.get("dataset", ""))
    fixed = {name: PhaseResult(name, record.get("mlflow_run_id", ""), int(record.get("set_index", -1)),
                               dict(record.get("hparams", {})), dict(record["summary"]), folder,
                               dataset=record.get("dataset", ""))
             for name, record in sorted(phases.items(), key=lambda item: _step(item[0]))  # the plan's order
             if name != TUNE.name and record.get("status") == "finished" and record.get("summary")}
    if EVALUATE.name not in fixed:
        return tuning
    return StudyResult(tuning, fixed.pop(EVALUATE.name), {_label(k): v for k, v in fixed.items()},
                       study_config(folder))


def _tuning_summary(folder: Path, manifest: dict[str, Any], best: dict[str, Any]) -> dict[str, Any]:
    from gtep.orchestration.study import full_units
    from gtep.orchestration.tracking import summarize_units

    tune = manifest["phases"][TUNE.name]
    units = full_units(folder, TUNE.name, str(tune.get("attempt", "")),
                       [u for key, u in manifest.get("units", {}).items() if key.startswith(f"{TUNE.name}/")])
    chosen = [u for u in units if int(u["set_index"]) == int(best["set_index"])]
    return summarize_units(chosen, int(manifest["config"]["search"]["orderings"]))


# ---------------------------------------------------------------- the phases


def _resolved(cfg: ExperimentConfig | ResolvedExperiment | None, resume: str | Path | bool | None,
              console: Console) -> ResolvedExperiment:
    """The checked experiment a phase runs. `cfg` already resolved (gtep.resolve, as the commands hand it down) is
    checked no further; `resume` is then True for a resumed study. Else `resume` is a study folder (its own config
    is used), or True with `cfg` the study's config (gtep.study_config(folder, address=...), for a resume on
    another cluster)."""
    from gtep.orchestration.pretraining import with_pretrained_weights

    if isinstance(cfg, ResolvedExperiment):
        if isinstance(resume, (str, Path)):
            raise ConfigError("resume", "a study resumes with the config it started with; give either a resolved "
                              "experiment with resume=True or resume=<OUTPUT/STUDY>, not both")
        return with_pretrained_weights(cfg, console.print)
    if isinstance(resume, (str, Path)):
        if cfg is not None:
            raise ConfigError("resume", "a study resumes with the config it started with; give either a config or "
                              "resume=<OUTPUT/STUDY>, not both")
        chosen = study_config(resume)
    elif resume:
        if cfg is None:
            raise ConfigError("resume", "resume=True needs the study's config: gtep.study_config(<OUTPUT/STUDY>); "
                              "or give the folder itself, resume=<OUTPUT/STUDY>")
        chosen = cfg
    else:
        chosen = cfg if cfg is not None else experiment()
    return with_pretrained_weights(check(chosen, console), console.print)


@contextmanager
def _ray(resolved: ResolvedExperiment, console: Console) -> Iterator[None]:
    """Ray for a study's phases, everything they write owner-only: the driver, and the Ray it starts (whose
    workers inherit its umask), run under umask 077 (gtep.config.private.owner_only)."""
    from gtep.config.private import owner_only
    from gtep.orchestration.ray_search import study_session

    with owner_only(), study_session(resolved, console):
        yield


def _console(console: Optional[Console], quiet: bool) -> Console:
    """Where a phase function prints its progress and its summary: nowhere with quiet=True."""
    return Console(quiet=True) if quiet else (console or Console())


def _show(result: PhaseResult | StudyResult, resolved: ResolvedExperiment, console: Console) -> None:
    """The result as its command prints it, then where its runs are tracked."""
    for renderable in result.renderables():
        console.print(renderable, highlight=False)
    print_store(resolved.config, console)


def tune(cfg: ExperimentConfig | ResolvedExperiment | None = None, *, resume: str | Path | bool | None = None,
         console: Optional[Console] = None, quiet: bool = False) -> TuneResult:
    """Phase 1: sample R sets, train each over S orderings of D^HT, select H* (writes best.yaml).
    `cfg` is a config, or the experiment gtep.resolve made of one (then checked no further, as `gtep tune` hands
    it down). `resume=OUTPUT/STUDY` runs what an interrupted tuning phase is missing, with the study's own config.
    Prints its progress and then H* as `gtep tune` does, on `console`; `quiet=True` prints nothing."""
    from gtep.orchestration.phases import tune_phase

    console = _console(console, quiet)
    resolved = _resolved(cfg, resume, console)
    with _ray(resolved, console):
        outcome = tune_phase(resolved, console, resume=bool(resume))
    result: TuneResult = _phase_result(outcome, resolved, TuneResult)  # type: ignore[assignment]
    _show(result, resolved, console)
    return result


def evaluate(cfg: ExperimentConfig | ResolvedExperiment | None = None, *,
             best: TuneResult | Mapping[str, Any] | str | Path | None = None, hparams: Optional[str] = None,
             tuning_run: Optional[str] = None, protocol: str = "gtep", resume: str | Path | bool | None = None,
             sets: Optional[str] = None, console: Optional[Console] = None, quiet: bool = False) -> PhaseResult:
    """Phase 2: train H* over S orderings of the disjoint D^E. `cfg` is a config, or the experiment gtep.resolve
    made of one (then checked no further, as `gtep evaluate` hands it down). H* is `best` (a TuneResult, a
    best.yaml path, or a mapping of values), the preset named `hparams` (e.g. "original"), the tuning phase
    `tuning_run` logged in MLflow, or by default the study's own best.yaml. protocol="conventional" re-runs H* on
    the tuning classes instead (fresh orderings S..2S-1), the practice the paper criticises. `sets="all"`
    (default: the config's evaluation.sets) then trains every other tuned set over the same orderings too (the
    evaluate_sets phase: the sets' rank correlation, H*'s regret, the protocols' regret table); H* stays the
    result. Prints its progress and then its summary as `gtep evaluate` does, on `console`; `quiet=True` prints
    nothing."""
    from gtep.orchestration.study_plan import run_plan

    if protocol not in ("gtep", "conventional"):
        raise ConfigError("protocol", f"{protocol!r} is not a protocol here; choose gtep, conventional")
    if sets not in (None, "best", "all"):
        raise ConfigError("sets", f"{sets!r} is not a choice; use best (H* alone) or all (every tuned set too)")
    console = _console(console, quiet)
    resolved = _resolved(cfg, resume, console)
    phase = CONVENTIONAL if protocol == "conventional" else EVALUATE  # the phase whose summary is the result
    # asked for here, every set or an error; from the config, only where the study's own H* is evaluated
    every = sets == "all" or (sets is None and resolved.config.evaluation.sets == "all" and phase is EVALUATE
                              and best is None and hparams is None and tuning_run is None)
    chosen = _chosen_set(resolved, phase, best, hparams, tuning_run, resume)
    if every:
        _check_every_set(resolved, phase, chosen)
    plan = study_phases(protocol, every_set=every, evaluate_only=True)  # the phase, then evaluate_sets
    with _ray(resolved, console):
        outcomes = run_plan(plan, resolved, console, resume=bool(resume), best=chosen)
    result = _phase_result(outcomes[phase.name], resolved)
    _show(result, resolved, console)
    return result


def _check_every_set(resolved: ResolvedExperiment, phase: Phase, chosen: Mapping[str, Any]) -> None:
    """sets="all" evaluates the sets of the study's own finished tuning phase beside its H*: refused before any
    compute otherwise."""
    if phase is not EVALUATE:
        raise ConfigError("sets", "all evaluates every tuned set on D^E; drop --protocol conventional (protocol=)")
    manifest_path = resolved.config.study_dir / "manifest.json"
    tuned = json.loads(manifest_path.read_text())["phases"].get(TUNE.name, {}) if manifest_path.exists() else {}
    if tuned.get("status") != "finished" or tuned.get("best_set_index") is None:
        raise ConfigError("sets", f"all evaluates every set of a finished tuning phase, and "
                          f"{resolved.config.study_dir} has none; run gtep tune (or gtep run) first")
    if int(chosen.get("set_index", -1)) != int(tuned["best_set_index"]):
        raise ConfigError("sets", "all evaluates the tuned sets beside the study's own H*; drop --best, --hparams "
                          "and --tuning-run (best=, hparams=, tuning_run= in Python)")


def _chosen_set(resolved: ResolvedExperiment, phase: Phase, best: Any, hparams: Optional[str],
                tuning_run: Optional[str], resume: Any) -> dict[str, Any]:
    """The set a fixed-set phase trains, in the record shape best.yaml has; every way of naming it is checked
    against the study's algorithm and search space before any compute."""
    from gtep.spaces import SearchSpaceError, load_space, validate_values

    given = [x for x in (best, hparams, tuning_run) if x is not None]
    if len(given) > 1:
        raise ConfigError("best", "give one of --best, --tuning-run or --hparams (best=, tuning_run=, hparams= "
                          "in Python)")
    if resume:
        if given:
            raise ConfigError("resume", "a resumed phase runs the set it started with; drop --best, --tuning-run "
                              "and --hparams (best=, tuning_run=, hparams= in Python)")
        return _resumed_set(resolved.config.study_dir, phase)
    algorithm = resolved.config.algorithm
    if hparams is not None:
        presets = load_space(algorithm, resolved.space_path).presets
        if hparams not in presets:
            raise ConfigError("hparams", f"{algorithm} has no preset {hparams!r}; choose from {sorted(presets)}")
        return {"algorithm": algorithm, "set_index": -1, "hparams": presets[hparams], "source": f"preset:{hparams}"}
    if tuning_run is not None:
        from gtep.orchestration.tracking_store import best_from_run

        chosen = best_from_run(resolved, tuning_run)
        if chosen["algorithm"] != algorithm:
            raise ConfigError("tuning_run", f"run {tuning_run} tuned {chosen['algorithm']!r}, not {algorithm!r}; "
                              f"pass --algorithm {chosen['algorithm']} (algorithm= in Python)")
        return chosen
    where = Path("best")  # what a bad value's message names
    if isinstance(best, TuneResult):
        best = {"algorithm": algorithm, "set_index": best.set_index, "hparams": best.hparams,
                "tuning_run_id": best.run_id}
    elif isinstance(best, Mapping) and "hparams" not in best:
        best = {"algorithm": algorithm, "set_index": -1, "hparams": dict(best), "source": "given"}
    elif best is None or isinstance(best, (str, Path)):
        path = Path(best) if best is not None else resolved.config.study_dir / "best.yaml"
        if not path.exists():
            raise ConfigError("best", f"no H* given and {path} does not exist; run gtep tune first, or pass "
                              "--best, --tuning-run or --hparams (best=, tuning_run=, hparams= in Python)")
        best, where = _read_best_file(path), path
    record = dict(best)
    if record.get("algorithm") != algorithm:
        raise ConfigError("best", f"{where} holds H* of {record.get('algorithm')!r} but the config runs "
                          f"{algorithm!r}; pass the matching best.yaml or --algorithm (algorithm= in Python)")
    try:
        validate_values(where, algorithm, record["hparams"])
    except SearchSpaceError as err:
        raise ConfigError("best", str(err)) from None
    _check_ranges(where, algorithm, record["hparams"])
    return record


def _check_ranges(where: Path, algorithm: str, hparams: Mapping[str, Any]) -> None:
    """A given set's values within the ranges the learner declares: refused here, not inside a Ray trial."""
    from gtep.algorithms import ALGORITHMS

    params = ALGORITHMS.get(algorithm).Params
    for name, value in hparams.items():
        problem = params.range_problem(name, value)
        if problem:
            raise ConfigError("best", f"{where}: {problem}; give a value {algorithm} accepts")


def _read_best_file(path: Path) -> dict[str, Any]:
    from gtep.config import read_yaml

    data = read_yaml(path, "best", "the best.yaml that gtep tune wrote")
    if not isinstance(data, dict) or not isinstance(data.get("hparams"), dict) or "algorithm" not in data:
        raise ConfigError("best", f"{path} is not a gtep best.yaml (it needs 'algorithm' and a mapping 'hparams'); "
                          "give the best.yaml that gtep tune wrote")
    return data


def _resumed_set(study_dir: Path, phase: Phase) -> dict[str, Any]:
    """The set a resumed fixed-set phase ran, from the study's manifest (a resume never changes it)."""
    manifest = json.loads((study_dir / "manifest.json").read_text())
    record = manifest["phases"].get(phase.name)
    if not record or "hparams" not in record:
        raise ConfigError("resume", f"{study_dir} has no {phase.name} phase to resume; run gtep evaluate without "
                          "--resume")
    return {"algorithm": manifest["algorithm"], "set_index": record.get("set_index", -1), "hparams": record["hparams"],
            "tuning_run_id": record.get("tuning_run_id", ""), "source": record.get("hparams_source", "tuning")}


def run(cfg: ExperimentConfig | ResolvedExperiment | None = None, *, protocol: str = "gtep",
        with_original: bool = False, resume: str | Path | bool | None = None, console: Optional[Console] = None,
        quiet: bool = False) -> StudyResult:
    """Both phases: tune on D^HT, evaluate H* on D^E. `cfg` is a config, or the experiment gtep.resolve made of one
    (then checked no further, as `gtep run` hands it down). protocol="conventional" also re-runs H* on the tuning
    classes; "first_task" compares sets on the first search.protocol_tasks tasks only (Lee et al. 2024), then
    evaluates H* on the whole scenario (a resolved experiment must have been resolved with it: search.protocol
    first_task). with_original=True also evaluates the algorithm's original preset on D^E
    (the paper's "Original"). Prints its progress and then what `gtep run` prints (H*, the phases side by side,
    the study folder, the MLflow store) on `console`; `quiet=True` prints nothing. The result's repr shows the
    same table."""
    from gtep.orchestration.phases import original_best
    from gtep.orchestration.study_plan import run_plan

    if protocol not in ("gtep", "conventional", "first_task"):
        raise ConfigError("protocol", f"{protocol!r} is not a protocol here; choose gtep, conventional, first_task")
    console = _console(console, quiet)
    if protocol == "first_task" and not resume:  # a config's search.protocol, set before its one resolution
        cfg = _first_task(cfg)
    resolved = _resolved(cfg, resume, console)
    c = resolved.config
    console.print(f"[bold]gtep run[/] study={c.study} algorithm={c.algorithm} backbone={c.backbone} "
                  f"scenario={c.scenario.describe()} R={c.search.trials} S={c.search.orderings}")
    if with_original:
        original_best(resolved)  # a missing preset is an error before any compute
    # the study's plan (gtep/protocol/phases.py): tune, evaluate, [evaluate_sets], [conventional], [original]
    plan = study_phases("conventional" if c.search.protocol == "conventional" else protocol,
                        with_original=with_original, every_set=c.evaluation.sets == "all")
    with _ray(resolved, console):
        outcomes = run_plan(plan, resolved, console, resume=bool(resume))
    # beside H*'s two phases, every other phase with a summary (evaluate_sets has none: H* stays the result)
    extra = {phase.label: _phase_result(outcomes[phase.name], resolved) for phase in plan.summarized()
             if phase not in (TUNE, EVALUATE)}
    result = StudyResult(_phase_result(outcomes[TUNE.name], resolved, TuneResult),  # type: ignore[arg-type]
                         _phase_result(outcomes[EVALUATE.name], resolved), extra, resolved.config)
    _show(result, resolved, console)
    return result


def _first_task(cfg: ExperimentConfig | ResolvedExperiment | None) -> ExperimentConfig | ResolvedExperiment:
    """`cfg` under the first_task protocol (search.protocol): a config gets it before it is resolved; an experiment
    already resolved is resolved again by nobody here, so it must have been resolved with it."""
    if not isinstance(cfg, ResolvedExperiment):
        return (cfg or experiment()).with_overrides(**{"search.protocol": "first_task"})
    if cfg.config.search.protocol != "first_task":
        raise ConfigError("protocol", f"first_task: the resolved experiment compares sets under search.protocol "
                          f"{cfg.config.search.protocol!r}; resolve it with gtep.resolve(..., protocol='first_task') "
                          "or give run() the config instead")
    return cfg


# ---------------------------------------------------------------- reading what was tracked


def report(selectors: tuple[str, ...] | list[str] = (), *, output: str | Path = "gtep-runs",
           tracking_uri: Optional[str] = None, matrix: Optional[str] = None, out: str | Path | None = None,
           formats: tuple[str, ...] | list[str] = ("md",), log: bool = False,
           console: Optional[Console] = None) -> "Report":
    """The paper's tables and figures from tracked studies (`gtep report`): a Report whose frames are `summary`
    (one row per scenario, pairing, algorithm and phase), `gaps`, `ranking` (Kendall's tau), `curves`, `sets`,
    `importance`, `left_out`... and the files it wrote under `out` (a temporary folder by default). Reads the
    store of `output` (its mlflow.db; a matrix's own store under <output>/<matrix>) or `tracking_uri`; trains
    nothing. `log=True` also logs the report as a run in gtep/reports."""
    from gtep.config import check_tracking_uri
    from gtep.orchestration.report_store import open_store
    from gtep.reporting.build import check_formats, run_report

    chosen = check_formats(tuple(formats))
    runs = Path(output)
    if tracking_uri is None and matrix and not (runs / "mlflow.db").exists() and (runs / matrix / "mlflow.db").exists():
        runs = runs / matrix
    uri = tracking_uri or f"sqlite:///{runs.resolve()}/mlflow.db"
    option = "tracking_uri" if tracking_uri else "output"
    check_tracking_uri(uri, option)
    open_store(uri, option)
    if out is not None and Path(out).exists() and not Path(out).is_dir():
        raise ConfigError("out", f"{out} is a file; give a folder for the report")
    return run_report(uri, list(selectors), matrix=matrix, out=Path(out) if out is not None else None,
                      formats=chosen, console=console or Console(quiet=True), log_to_mlflow=log)


def replay(study_dir: str | Path, scheduler: str = "asha", *, grace_period: int = 1, reduction_factor: float = 2.0,
           protocol_tasks: int = 1, pruner: str = "none",
           pruner_options: Optional[Mapping[str, Any]] = None) -> "ReplayOutcome":
    """A finished study's tuning results through a cheaper protocol's decision rule (`gtep replay`), training
    nothing: which H* the rule would have chosen (`best_index`), the seconds it would have spent (`seconds` of
    `full_seconds`, `fraction`), the sets it stopped early and each set's score under the rule."""
    from pydantic import ValidationError

    from gtep.config import PRUNERS, PrunerOptions
    from gtep.orchestration.replay import load_study, replay_pruned, replay_study
    from gtep.protocol.replay import REPLAY_RULES

    if pruner not in PRUNERS:
        raise ConfigError("pruner", f"{pruner!r} is not one of Optuna's pruners here; choose from {', '.join(PRUNERS)}")
    if pruner != "none" and scheduler not in ("asha", "none"):
        raise ConfigError("pruner", f"replays Optuna's {pruner} pruner on its own; drop scheduler {scheduler}")
    if pruner == "none" and pruner_options:
        raise ConfigError("pruner_options", "needs a pruner")
    if scheduler not in REPLAY_RULES:
        raise ConfigError("scheduler", f"{scheduler!r} cannot be replayed; choose from {', '.join(REPLAY_RULES)} "
                          "(hyperband's synchronous brackets are not replayed)")
    for name, value, least, what in (("grace_period", grace_period, 1, "at least 1 ordering"),
                                     ("protocol_tasks", protocol_tasks, 1, "at least 1 task")):
        if value < least:
            raise ConfigError(name, f"must be {what}")
    if reduction_factor <= 1:
        raise ConfigError("reduction_factor", "must be above 1")
    try:
        study = load_study(Path(study_dir))
    except FileNotFoundError as err:
        raise ConfigError("study_dir", str(err)) from None
    if not study.units:
        raise ConfigError("study_dir", f"{study_dir} has no tuning results to replay")
    if pruner != "none":
        try:
            options = PrunerOptions.model_validate(dict(pruner_options or {}))
        except ValidationError as err:
            first = err.errors()[0]
            raise ConfigError("pruner_options", f"{'.'.join(map(str, first['loc']))}: {first['msg']}") from None
        return replay_pruned(study, pruner, options)
    if scheduler == "asha" and grace_period >= study.orderings:
        raise ConfigError("grace_period", f"must be below the study's {study.orderings} orderings")
    return replay_study(study, scheduler, grace_period=grace_period, reduction_factor=reduction_factor,
                        protocol_tasks=protocol_tasks)
