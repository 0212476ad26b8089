"""gtep algorithms | spaces | presets: what is registered and shipped (no compute)."""
from __future__ import annotations

import re
import sys
from typing import Any, Optional

import typer
from rich.table import Table

from gtep.cli.common import console, described_presets, fail, preset_table
from gtep.config import preset_names, preset_text

app = typer.Typer()


def _algorithms() -> Any:
    """ALGORITHMS with the plugins' algorithms loaded; a plugin that cannot be loaded is the command's error."""
    from gtep.plugins import PluginError

    try:
        from gtep.algorithms import ALGORITHMS

        ALGORITHMS.names()
    except PluginError as err:
        fail(str(err))
    return ALGORITHMS


@app.command()
def algorithms() -> None:
    """List the registered algorithms and their tuned hyperparameter counts (Figure 10).

    A plugin's algorithm also says where it comes from: the distribution of its entry point, or GTEP_PLUGINS."""
    from gtep.plugins import source_of
    from gtep.spaces import NoSearchSpace, SearchSpaceError, load_space

    ALGORITHMS = _algorithms()
    names = ALGORITHMS.names()
    sources = {name: source_of(ALGORITHMS.get(name).__module__) for name in names}
    table = Table(title="algorithms")
    columns = ("name", "method", "tuned hyperparameters", "presets") + (("plugin",) if any(sources.values()) else ())
    for column in columns:
        table.add_column(column, no_wrap=column in ("name", "plugin"))
    for name in names:
        cls = ALGORITHMS.get(name)
        try:
            space = load_space(name)
            tuned, presets = str(len(space.space.names)), ", ".join(space.presets)
        except NoSearchSpace:
            tuned, presets = "-", "(no search space)"
        except SearchSpaceError:  # one is shipped or declared but cannot be used: gtep spaces NAME says why
            tuned, presets = "-", f"(invalid search space: gtep spaces {name})"
        doc = (cls.__doc__ or sys.modules[cls.__module__].__doc__ or "").strip()
        flat = " ".join(doc.split())
        cited = re.match(r"^[^(:.]*\([^)]*\)", flat)  # "BiC (Wu et al., CVPR 2019)"
        summary = cited.group(0) if cited else flat.split(". ")[0]
        table.add_row(name, summary[:60], tuned, presets, *([sources[name] or ""] if len(columns) > 4 else []))
    console.print(table)


@app.command()
def spaces(algorithm: Optional[str] = typer.Argument(None, help="an algorithm; all if omitted")) -> None:
    """Show a search space with its value sets and presets."""
    from gtep.spaces import SearchSpaceError, load_space

    ALGORITHMS = _algorithms()
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
    """List the scenarios shipped with gtep (use with --preset NAME)."""
    table = preset_table("presets", ("name", "algorithm", "scenario", "datasets", "R x S", "description"))
    for name, doc, comment in described_presets(preset_names(), preset_text):
        data = doc["datasets"]
        datasets = data["split"]["dataset"] + " (split)" if "split" in data else \
            f"{data['tuning']['dataset']} -> {data['evaluation']['dataset']}"
        search = doc.get("search", {})
        from gtep.config import ScenarioSpec

        table.add_row(name, doc["algorithm"], ScenarioSpec(**doc["scenario"]).describe(), datasets,
                      f"{search.get('trials', 30)} x {search.get('orderings', 5)}", comment[:120])
    console.print(table)
    from gtep.matrix import matrix_preset_names

    console.print(f"matrix presets (gtep matrix --preset NAME; gtep matrices): {', '.join(matrix_preset_names())}")
