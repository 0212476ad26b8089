"""gtep algorithms | spaces | presets: what is registered and shipped (no compute)."""
from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any, Optional

import typer
from rich.table import Table

from gtep.cli.common import console, described_presets, fail, whole_words
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
    columns = ("name", "method", "tuned", "presets") + (("plugin",) if any(sources.values()) else ())
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
        table.add_row(name, shortened(summary, 60), tuned, presets,
                      *([sources[name] or ""] if len(columns) > 4 else []))
    console.print(whole_words(table))


def shortened(text: str, limit: int) -> str:
    """`text` cut at the last word boundary before `limit` characters, an ellipsis saying so: never mid-word."""
    if len(text) <= limit:
        return text
    return text[:limit + 1].rsplit(" ", 1)[0].rstrip(",;:") + " …"


def shown_path(path: Path, owner: type) -> str:
    """A shipped or installed file as its path in its package (gtep/search_spaces/icarl.yaml, a plugin's
    my_lab/my_method.yaml), not as the site-packages or source folder it was installed to; any other file (a
    config's search.space) as given."""
    resolved = path.resolve()
    packages = set()
    for module in (sys.modules[__name__.split(".")[0]], sys.modules[owner.__module__.split(".")[0]]):
        if module.__file__:  # the folder it is imported from: a package's parent, a single module's folder
            packages.add(Path(module.__file__).resolve().parents[1 if hasattr(module, "__path__") else 0])
    entries = {Path(entry).resolve() for entry in sys.path if entry}
    roots = sorted(packages | entries, key=lambda root: len(root.parts))
    for root in reversed(roots):  # the innermost import root that holds it
        if len(root.parts) > 1 and resolved.is_relative_to(root):
            return resolved.relative_to(root).as_posix()
    return str(path)


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
        shown = shown_path(space.path, ALGORITHMS.get(name))
        table = Table(title=f"{name}  ({shown}, {space.space.size():,} combinations)")
        table.add_column("hyperparameter")
        table.add_column("values")
        for preset in space.presets:
            table.add_column(f"preset: {preset}")
        for key, values in space.space.sets.items():
            table.add_row(key, ", ".join(map(str, values)), *[str(p.get(key, "")) for p in space.presets.values()])
        console.print(table)


# Where the weights a preset reads from a variable come from (gtep downloads nothing: docs/pretraining.md).
WEIGHTS_SOURCES = {
    "VIT_B16_WEIGHTS": "a local file of ViT-B/16 weights (vit_base_patch16_224, ImageNet-pretrained as in the "
                       "paper, e.g. timm's, saved as safetensors or a state dict)",
    "VIT_MICRO_WEIGHTS": "the file that gtep pretrain --dataset npz:$TINYIMAGENET_NPZ --classes 100-199 "
                         "--backbone vit_micro_patch4_32 --out FILE writes",
}


def weights_note(doc: dict[str, Any]) -> str:
    """What a preset needs before it runs besides its data: a weights file (and where it comes from), or nothing
    because it pretrains its own backbone."""
    weights = doc.get("weights")
    if isinstance(weights, str) and weights:
        named = re.fullmatch(r"\$\{(\w+)\}", weights.strip())
        if named:
            source = WEIGHTS_SOURCES.get(named.group(1), "a local weights file (safetensors or a state dict)")
            return f"needs pretrained weights: set {named.group(1)} to {source}; see docs/pretraining.md"
        return f"needs pretrained weights: {weights}"
    if doc.get("pretrain"):
        return "pretrains its backbone on classes of neither phase before the phases (cached for the next run)"
    return ""


@app.command()
def presets() -> None:
    """List the scenarios shipped with gtep (use with --preset NAME).

    Each preset's algorithm, scenario, R x S and data, what it is, and the pretrained weights it needs, if any."""
    from rich.padding import Padding
    from rich.text import Text

    from gtep.config import ScenarioSpec

    console.print("[bold]presets[/] (gtep run --preset NAME)")
    for name, doc, comment in described_presets(preset_names(), preset_text):
        data = doc["datasets"]
        datasets = data["split"]["dataset"] + " (split)" if "split" in data else \
            f"{data['tuning']['dataset']} -> {data['evaluation']['dataset']}"
        search = doc.get("search", {})
        head = Text.assemble((name, "bold cyan"), f"  {doc['algorithm']}, "
                             f"{ScenarioSpec(**doc['scenario']).describe()}, "
                             f"R x S = {search.get('trials', 30)} x {search.get('orderings', 5)}")
        body = Text("\n".join((f"data: {datasets}", shortened(comment, 240))))
        note = weights_note(doc)
        if note:
            body.append("\n" + note, style="yellow")
        console.print()
        console.print(head)
        console.print(Padding(body, (0, 0, 0, 2), expand=False))
    console.print()
    from gtep.matrix import matrix_preset_names

    console.print(f"matrix presets (gtep matrix --preset NAME; gtep matrices): {', '.join(matrix_preset_names())}")
