"""What every gtep command shares: the consoles, the common options, the error exit and the config a command
builds from its options. Command modules import this module and never each other (tests/project/test_architecture.py);
heavy imports (Ray, MLflow, torch) happen inside the commands, so `gtep --help` stays fast."""
from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, NoReturn, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from gtep import api
from gtep.config import ConfigError, ExperimentConfig, ResolvedExperiment

# Redirected to a file or a batch job's log, rich would fall back to 80 columns and squeeze a family's result
# table into ellipses; a log is read later in a pager, so it gets room (a terminal keeps its own width;
# COLUMNS still wins).
LOG_WIDTH = 160
console = Console(width=None if sys.stdout.isatty() or "COLUMNS" in os.environ else LOG_WIDTH)
err_console = Console(stderr=True)

ConfigOpt = typer.Option(None, "--config", "-c", help="experiment YAML file")
PresetOpt = typer.Option(None, "--preset", help="a scenario shipped with gtep (gtep presets); default: 'default'")


def output_folder(value: str | Path) -> Path:
    """--output as typed: an empty value would become Path('.') and put every study file in the current folder,
    so it is refused here, where the empty string can still be told from '.'."""
    if isinstance(value, str) and not value.strip():  # a default (a Path) is never empty
        fail("--output: is empty, which would mean the current folder (a study's files among yours); give a folder "
             "(e.g. --output gtep-runs), or leave the option out for ./gtep-runs")
    return Path(value)


OutputOpt = typer.Option(None, "--output", parser=output_folder, metavar="<path>",
                         help="folder for studies and the default MLflow store [./gtep-runs]")
UriOpt = typer.Option(None, "--tracking-uri", help="MLflow tracking URI [sqlite:///<output>/mlflow.db]")
AddressOpt = typer.Option(None, "--address", help="an existing Ray cluster (host:port, ray://host:10001, auto)")
TrialsOpt = typer.Option(None, "--trials", help="R: hyperparameter sets to sample")
OrderingsOpt = typer.Option(None, "--orderings", help="S: class orderings")
SeedOpt = typer.Option(None, "--seed", help="the study seed (orderings, samples, initialisation)")
AlgorithmOpt = typer.Option(None, "--algorithm", help="override the config's algorithm (gtep algorithms)")
ConcurrentOpt = typer.Option(None, "--max-concurrent", help="trials running at once")
StudyOpt = typer.Option(None, "--study", help="override the study name (its folder and MLflow experiment)")
BackboneOpt = typer.Option(None, "--backbone", help="override the backbone (resnet32, resnet18, any timm ViT...)")
WeightsOpt = typer.Option(None, "--weights",
                          help="pretrained backbone weights: safetensors or a state dict (gtep pretrain)")
ResumeOpt = typer.Option(None, "--resume", help="continue the study in OUTPUT/STUDY after a crash, with its own config")
ProtocolOpt = typer.Option("gtep", "--protocol", help="gtep, or conventional: also re-run H* on the tuning classes "
                           "(fresh orderings S..2S-1), the practice the paper criticises (section 3.1)")
RunProtocolOpt = typer.Option("gtep", "--protocol", help="gtep; conventional: also re-run H* on the tuning classes "
                              "(fresh orderings S..2S-1), the practice the paper criticises (section 3.1); "
                              "first_task: compare sets on the first --protocol-tasks tasks only (Lee et al. 2024), "
                              "then evaluate H* on the whole scenario")
TuneProtocolOpt = typer.Option(None, "--protocol", help="gtep, or first_task: compare sets on the first "
                               "--protocol-tasks tasks only (Lee et al. 2024) [sets search.protocol]. Not "
                               "conventional, which search.protocol also takes: its row of H* re-run on the tuning "
                               "classes comes after tuning (gtep run or gtep evaluate --protocol conventional)")
ProtocolTasksOpt = typer.Option(None, "--protocol-tasks", help="k, the tasks first_task compares sets on "
                                "[sets search.protocol_tasks]")
SchedulerOpt = typer.Option(None, "--scheduler", help="none, asha or hyperband: stop hopeless sets early on the "
                            "orderings axis [sets search.scheduler]")


def fail(message: str) -> NoReturn:
    """One line on stderr and exit status 2. The message is escaped: a hint such as [0.1, 0.01] is text, not markup."""
    err_console.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(2)


def run_guarded(fn: Callable[[], object]) -> None:
    """Run a command's body `fn` inside `guarded`, named after the command whose function defines it."""
    with guarded(fn.__qualname__.split(".")[0]):  # `go` is defined inside the command's function: run, report...
        fn()


@contextmanager
def guarded(command: str) -> Iterator[None]:
    """A command's body: bad input (ConfigError and the like) is `fail`, a phase that stopped before its
    result was complete (StudyStopped) prints its message and exits with its own code, never 0. A `with` block,
    so that the body runs in the command's own function, not called back from here."""
    from gtep.data import DatasetError
    from gtep.errors import StudyStopped
    from gtep.plugins import PluginError
    from gtep.protocol.selection import AllSetsDivergedError
    from gtep.spaces import SearchSpaceError

    try:
        yield
    except (ConfigError, DatasetError, SearchSpaceError, AllSetsDivergedError, PluginError) as err:
        fail(str(err))
    except StudyStopped as err:
        summary = getattr(err, "summary", None)
        if summary:  # what did finish, with its k/S, so that nothing reads it as complete
            from gtep.reporting.tables import phase_summary

            title = f"{getattr(err, 'phase', '')} phase: INCOMPLETE"
            console.print(phase_summary(summary, getattr(err, "dataset", ""), title))
        err_console.print(f"[bold red]stopped:[/] {escape(err.describe(command))}", highlight=False, soft_wrap=True)
        raise typer.Exit(err.exit_code)


def check_protocol(protocol: str | None, choices: tuple[str, ...] = ("gtep", "conventional")) -> str | None:
    if protocol is not None and protocol not in choices:
        raise ConfigError("--protocol", f"{protocol!r} is not a protocol here; choose {', '.join(choices)}")
    return protocol


def search_protocol(protocol: str | None) -> str | None:
    """The search.protocol a --protocol sets: only first_task and gtep change how sets are compared
    (conventional is a phase `gtep run` adds, whatever the config's search.protocol; the default leaves the
    config's own)."""
    return protocol if protocol == "first_task" else None


# The config field each option of tune | evaluate | run sets (the keyword arguments of gtep.experiment, which the
# commands build their config with): an error about a field whose value the user typed as an option names the option.
OPTION_FIELDS = api.OPTION_FIELDS
# the API's keyword arguments that are no config field and are options of the commands under the same name
API_KEYWORDS = ("best", "tuning_run", "hparams", "resume", "protocol", "preset", "sets")


def option_name(key: str) -> str:
    return f"--{key.replace('_', '-')}"


def as_option(err: ConfigError, overrides: dict[str, Any]) -> ConfigError:
    """`err` naming the option instead of the config field when the field's value came from that option, and
    instead of the API's keyword argument (gtep.api names them as the options are named)."""
    typed = err.field in OPTION_FIELDS and overrides.get(err.field) is not None  # gtep.experiment's own checks
    if err.field in API_KEYWORDS or typed:
        return ConfigError(option_name(err.field), err.reason)
    for key, field in OPTION_FIELDS.items():
        if overrides.get(key) is not None and (err.field == field or err.field.startswith(f"{field}.")):
            reason = err.reason.replace(" (in command line)", "")
            return ConfigError(option_name(key), f"{reason} (sets {err.field})")
    return err


def check_counts(**options: Any) -> None:
    """Counts typed as options (--trials, --orderings, --max-concurrent, --seed) reach their minimum."""
    try:
        api.check_counts(**options)
    except ConfigError as err:
        raise as_option(err, options) from None


def build_config(config: Optional[Path], preset: Optional[str], **overrides: Any) -> ExperimentConfig:
    try:
        return api.experiment(config, preset=preset, **overrides)
    except ConfigError as err:
        raise as_option(err, overrides) from None


def check_resumable(study_dir: Path, config: Optional[Path], preset: Optional[str],
                    overrides: dict[str, Any]) -> None:
    """A study resumes with the config it started with (its manifest): the options that would change it are
    refused, named as typed."""
    allowed = {"address", "tracking_uri"}
    extra = sorted(k for k, v in overrides.items() if v is not None and k not in allowed)
    if (study_dir / "manifest.json").exists() and (config or preset or extra):
        given = ["--config"] * bool(config) + ["--preset"] * bool(preset) + [option_name(k) for k in extra]
        raise ConfigError("--resume", f"a study resumes with the config it started with; drop {', '.join(given)} "
                          "(only --address and --tracking-uri may change)")


def prepare(config: Optional[Path], preset: Optional[str], resume: Optional[Path] = None,
            **overrides: Any) -> ResolvedExperiment:
    """The resolved experiment a command (tune, evaluate, run) hands down, made by one call (gtep.api.resolve): its
    file or preset with the options typed, or a resumed study's own config placed where the study folder is now;
    then all validation that needs no compute (the file, the names, the data, the search space, the address, the
    store). The API function it is handed to resolves nothing again."""
    if resume:  # the study's own config, only its address and store as typed
        check_resumable(resume, config, preset, overrides)
        config, preset = None, None
        overrides = {k: v for k, v in overrides.items() if k in ("address", "tracking_uri")}
    try:
        return api.resolve(config, preset=preset, resume=resume, console=console, **overrides)
    except ConfigError as err:
        raise as_option(err, overrides) from None


def through_ray_client(address: Optional[str], config: Optional[Path]) -> bool:
    """With --address ray://..., rerun this very command on the cluster's head (jobs.run_through_client)."""
    if not address or not address.startswith("ray://"):
        return False
    from gtep.orchestration import jobs
    from gtep.orchestration.ray_search import check_address

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


def preset_table(title: str, columns: tuple[str, ...]) -> Table:
    """The table that lists shipped presets (gtep presets, gtep matrices): names unwrapped, the rest as it fits."""
    table = Table(title=title)
    for column in columns:
        table.add_column(column, no_wrap=column == "name")
    return table


def whole_words(table: Table) -> Table:
    """`table` with no column narrower than its longest word: rich then wraps a cell between words and never cuts
    one (a column narrower than a word shows it cut, with an ellipsis). Call it once the rows are added."""
    for column in table.columns:
        words = [word for cell in (column.header, *column.cells) for word in str(cell).split()]
        column.min_width = max(map(len, words), default=1)
    return table


def described_presets(names: list[str], text_of: Callable[[str], str]) -> Iterator[tuple[str, dict[str, Any], str]]:
    """Each shipped preset's name, its YAML and its description: the comment lines at its top, joined."""
    import yaml

    for name in names:
        text = text_of(name)
        comment = " ".join(line.lstrip("# ").strip() for line in text.splitlines() if line.startswith("#"))
        yield name, yaml.safe_load(text), comment
