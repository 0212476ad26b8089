"""gtep replay: a finished study's tuning results through a cheaper protocol's decision rule, training nothing
(gtep/protocol/replay.py)."""
from __future__ import annotations

from pathlib import Path
from typing import Any, List, Optional

import typer

from gtep.cli.common import console, run_guarded
from gtep.config import ConfigError

app = typer.Typer()


def pruner_settings(pruner: str, options: List[str]):
    """(--pruner, --pruner-option NAME=VALUE ...) as search.pruner_options, checked as the config checks them;
    None without a pruner."""
    from pydantic import ValidationError

    from gtep.config import PRUNERS, PrunerOptions

    if pruner not in PRUNERS:
        raise ConfigError("--pruner", f"{pruner!r} is not one of Optuna's pruners here; choose from "
                          f"{', '.join(PRUNERS)}")
    if pruner == "none":
        if options:
            raise ConfigError("--pruner-option", "needs --pruner")
        return None
    values = {}
    for item in options:
        name, sep, value = item.partition("=")
        if not sep or name not in PrunerOptions.model_fields:
            raise ConfigError("--pruner-option", f"{item!r} is not NAME=VALUE with NAME one of "
                              f"{', '.join(PrunerOptions.model_fields)}")
        values[name] = value
    try:
        return PrunerOptions.model_validate(values)
    except ValidationError as err:
        first = err.errors()[0]
        raise ConfigError("--pruner-option", f"{'.'.join(map(str, first['loc']))}: {first['msg']}") from None


@app.command("replay")
def replay_command(
        study_dir: Path = typer.Argument(..., help="a finished study's folder (OUTPUT/STUDY)", show_default=False),
        scheduler: str = typer.Option("asha", "--scheduler", help="none, asha, or first_task (Lee et al. 2024: "
                                      "sets compared on the first --protocol-tasks tasks)"),
        grace_period: int = typer.Option(1, "--grace-period", help="ASHA: orderings before a set can be stopped"),
        reduction_factor: float = typer.Option(2.0, "--reduction-factor", help="ASHA: keep the top 1/this at a rung"),
        protocol_tasks: int = typer.Option(1, "--protocol-tasks", help="first_task: the tasks sets are compared on"),
        pruner: str = typer.Option("none", "--pruner", help="one of Optuna's pruners instead of --scheduler: median, "
                                   "percentile, successive_halving or hyperband (search.pruner)"),
        pruner_option: List[str] = typer.Option([], "--pruner-option", help="NAME=VALUE of search.pruner_options "
                                                "(n_startup_trials, n_warmup_steps, percentile, min_resource, "
                                                "reduction_factor); repeat it"),
        table: bool = typer.Option(False, "--table", help="every protocol side by side with its regret on D^E (a "
                                   "study with every set evaluated: gtep evaluate --sets all)"),
        json_out: Optional[Path] = typer.Option(None, "--json", help="with --table: also write the table as JSON "
                                                "to this file ('-': print it instead)"),
) -> None:
    """Replay a finished study through a cheaper protocol's rule; trains nothing.

    It prints which H* the rule would have chosen, the training time it would have spent relative to the full
    study, and that set's evaluation-phase score when the study evaluated it. Results are taken in the order the study
    finished them (ASHA's decisions depend on it)."""
    def go() -> None:
        from gtep.orchestration.replay import load_study, replay_pruned, replay_study
        from gtep.protocol.replay import REPLAY_RULES

        if json_out is not None and not table:
            raise ConfigError("--json", "writes the regret table; add --table")
        if table:
            regret_table(study_dir, json_out)
            return
        pruning = pruner_settings(pruner, pruner_option)
        if pruning is not None and scheduler not in ("asha", "none"):
            raise ConfigError("--pruner", f"replays Optuna's {pruner} pruner on its own; drop --scheduler {scheduler}")
        if scheduler not in REPLAY_RULES:
            raise ConfigError("--scheduler", f"{scheduler!r} cannot be replayed; choose from {', '.join(REPLAY_RULES)}"
                              " (hyperband's synchronous brackets are not replayed)")
        if grace_period < 1:
            raise ConfigError("--grace-period", "must be at least 1 ordering")
        if reduction_factor <= 1:
            raise ConfigError("--reduction-factor", "must be above 1")
        if protocol_tasks < 1:
            raise ConfigError("--protocol-tasks", "must be at least 1 task")
        try:
            study = load_study(study_dir)
        except FileNotFoundError as err:
            raise ConfigError("STUDY_DIR", str(err)) from None
        except ConfigError as err:  # a damaged manifest or record: named as the argument the user typed
            raise ConfigError("STUDY_DIR", err.reason) from None
        if not study.units:
            raise ConfigError("STUDY_DIR", f"{study_dir} has no tuning results to replay")
        if pruning is not None:
            rule = f"the {pruner} pruner"
            outcome = replay_pruned(study, pruner, pruning)
        else:
            if scheduler == "asha" and grace_period >= study.orderings:
                raise ConfigError("--grace-period", f"must be below the study's {study.orderings} orderings")
            rule = scheduler
            outcome = replay_study(study, scheduler, grace_period=grace_period, reduction_factor=reduction_factor,
                                   protocol_tasks=protocol_tasks)
        label = "none" if outcome.best_index is None else f"set{outcome.best_index:03d}"
        full = "none" if study.best_index is None else f"set{study.best_index:03d}"
        console.print(f"replay {rule} of {study.root.name}: H* = {label} (the full study's: {full})")
        console.print(f"training time: {outcome.seconds:.1f} s of {outcome.full_seconds:.1f} s "
                      f"({100 * outcome.fraction:.1f}% of the full study)")
        if outcome.stopped:
            console.print(f"stopped early: {len(outcome.stopped)} of {len(study.sets)} sets ("
                          + ", ".join(f"set{i:03d}" for i in outcome.stopped) + ")")
        for name, index in (("replayed H*", outcome.best_index), ("full study's H*", study.best_index)):
            score = study.evaluation_score(index)
            text = "not evaluated by the study" if score is None else f"{100 * score:.2f}"
            console.print(f"evaluation-phase score ({study.criterion.name}) of the {name}: {text}")
    run_guarded(go)


def regret_table(study_dir: Path, json_out: Optional[Path]) -> None:
    """`gtep replay STUDY --table`: each protocol's pick, compute and regret, as a table (and JSON)."""
    import json

    from gtep.orchestration.replay import load_study, protocol_table, set_ranking
    from gtep.protocol.regret import json_ready

    try:
        study = load_study(study_dir)
    except FileNotFoundError as err:
        raise ConfigError("STUDY_DIR", str(err)) from None
    except ConfigError as err:
        raise ConfigError("STUDY_DIR", err.reason) from None
    if not study.units:
        raise ConfigError("STUDY_DIR", f"{study_dir} has no tuning results to replay")
    try:
        rows = protocol_table(study)
    except ConfigError as err:  # a set not evaluated: named as the argument the user typed
        raise ConfigError("STUDY_DIR", err.reason) from None
    ranking = set_ranking(study)
    document: dict[str, Any] = {"study": study.root.name, "criterion": study.criterion.name,
                                "ranking": ranking.as_dict(), "protocols": [row.as_dict() for row in rows]}
    if json_out is not None and str(json_out) == "-":
        print(json.dumps(json_ready(document), indent=1, default=str))
        return
    console.print(render_table(document))
    if json_out is not None:
        json_out.write_text(json.dumps(json_ready(document), indent=1, default=str))
        console.print(f"table written to {json_out}")


def render_table(document: dict[str, Any]) -> Any:
    """The regret table of `gtep replay --table`, with the study's set ranking under its title."""
    from rich.table import Table

    ranking = document["ranking"]
    rank = ranking["best_rank"] if ranking["best_rank"] is not None else "diverged"
    caption = (f"Kendall's tau {ranking['kendall_tau']:.2f}, Spearman's rho {ranking['spearman_rho']:.2f} between "
               f"the {ranking['ranked']} sets' tuning and evaluation scores; H* ranks {rank} of {ranking['sets']} "
               "on D^E. Regret: the best set's evaluation score minus the pick's, in points "
               f"({document['criterion']}); compute: tuning seconds relative to the full study.")
    out = Table(title=f"Protocols replayed on {document['study']}", caption=caption)
    for column in ("protocol", "options", "picks", "compute", "regret (points)", "note"):
        out.add_column(column, justify="right" if column in ("compute", "regret (points)") else "left")
    for row in document["protocols"]:
        picked = "-" if row["picked"] is None else f"set{row['picked']:03d}"
        compute = "-" if row["fraction"] != row["fraction"] else f"{row['fraction']:.2f}"
        regret = "-" if row["regret"] != row["regret"] else f"{100 * row['regret']:.2f}"
        out.add_row(row["protocol"], row["options"], picked, compute, regret, row["note"])
    return out
