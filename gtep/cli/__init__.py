"""The gtep command line: parse, validate everything, then call one function.

gtep run | tune | evaluate           the protocol's phases on Ray Tune, tracked in MLflow    (cli/study.py)
gtep pretrain                        backbone weights from held-out classes                  (cli/pretrain.py)
gtep check                           the pre-flight checks alone, and the plan            (cli/check.py)
gtep ui | server | sync              the MLflow side                                         (cli/tracking.py)
gtep submit | jobs ...               studies as Ray Jobs on a cluster                        (cli/cluster.py)
gtep algorithms | spaces | presets   what is registered                                      (cli/info.py)
gtep report                          the paper's tables and figures from MLflow              (cli/report.py)
gtep matrix | matrices               algorithms x scenarios x dataset pairings, one study per cell (cli/matrix.py)

Each command module has a Typer app of its own and imports only cli/common.py (options, consoles, the error exit);
this module merges them into `app`, the `gtep` entry point, in the order `gtep --help` lists them.
"""
from __future__ import annotations

import typer

from gtep.cli import check, cluster, info, matrix, pretrain, replay, report, study, tracking

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="GTEP: tune continual-learning hyperparameters on one scenario, "
                       "evaluate them on a disjoint one.")
for commands in (study.app, check.app, pretrain.app, tracking.app, cluster.app, info.app, report.app, replay.app,
                 matrix.app):
    app.add_typer(commands)
app.add_typer(cluster.jobs_app, name="jobs")

__all__ = ["app"]
