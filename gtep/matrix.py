"""A matrix of GTEP studies: algorithms x scenarios x dataset pairings, as the paper runs them (section 4.1,
Tables 1-2). Every cell is one study (tune on D^HT, evaluate H* on D^E) with its own folder and MLflow
experiment; one store holds the matrix.

    matrix: small                      # cells are <matrix>-<algorithm>-<scenario>-<pairing>
    algorithms: [replay, icarl]
    scenarios:                         # increments, or a shape each pairing's class count fills in
      3tasks: 5x3
      6tasks: {tasks: 6, first: half}  # C25xT1+C5xT5 on 50 classes, C50xT1+C10xT5 on 100 (Table 1)
      iirc6: {family: iirc, iirc: {classes_per_task: 6, ...}}  # or a family's scenario section, as in an experiment
    pairings:
      tiny:   {similarity: high, datasets: {split: {dataset: ..., classes_per_phase: 15}}}
      tiny-omniglot:
        similarity: low
        datasets: {tuning: {dataset: ...}, evaluation: {dataset: ...}}
        overrides: {training: {memory_size: 100}}      # experiment fields for this pairing's cells
    base: {backbone: resnet8, search: {trials: 3, orderings: 2}, training: ..., compute: ..., tracking: ..., seed: 0,
           pretrain: ...}                # pretrain: the backbone pretrained once before the phases (cached)
    algorithm_overrides: {icarl: {backbone: resnet18}} # experiment fields for one algorithm's cells
    original: true                     # also evaluate each algorithm's `original` preset on D^E
    protocol: gtep                     # or conventional: also re-run H* on D^HT (section 3.1)

Pure: the file's model, the expansion into ExperimentConfig objects and their validation. Validation reads
dataset metadata only, and a bad cell is one ConfigError naming the matrix field and the cell. Running a
matrix is gtep/orchestration/matrix.py.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic_core import ErrorDetails

from gtep.config import (
    ConfigError,
    DatasetsSpec,
    ExperimentConfig,
    ResolvedExperiment,
    _expand_env,
    _phase_classes,
    read_yaml,
    with_added_defaults,
)
from gtep.data.file_parsing import parse_yaml
from gtep.preflight import preflight
from gtep.protocol.phases import study_phases
from gtep.protocol.scenarios import parse_increments

NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"
# compared when a matrix is run again: a finished cell must be the cell the file describes now
RESULT_FIELDS = ("algorithm", "backbone", "weights", "pretrain", "scenario", "datasets", "search", "first_task",
                 "training", "seed")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ExperimentFields(_Strict):
    """Experiment-file fields shared by the cells (`base`) or changed for a pairing's or an algorithm's cells.
    Nested blocks are checked on each merged cell, so a value set in one layer may rely on another layer's."""

    backbone: str | None = None
    weights: str | None = None
    pretrain: dict[str, Any] | None = None
    search: dict[str, Any] | None = None
    first_task: dict[str, Any] | None = None
    training: dict[str, Any] | None = None
    compute: dict[str, Any] | None = None
    tracking: dict[str, Any] | None = None
    seed: int | None = None

    def layer(self) -> dict[str, Any]:
        return self.model_dump(mode="python", exclude_unset=True)


class ScenarioShape(_Strict):
    """A scenario by its shape (paper Table 1): '10 Tasks' is C10xT10 on 100 classes and C5xT10 on 50; '6 Tasks'
    puts half of the classes in the first task and the rest in 5 equal tasks."""

    tasks: int = Field(ge=2)
    first: Literal["equal", "half"] = "equal"

    def increments(self, classes: int) -> list[int]:
        later = self.tasks - 1 if self.first == "half" else self.tasks
        first = classes // 2 if self.first == "half" else 0
        if (self.first == "half" and classes % 2) or (classes - first) % later:
            shape = f"half of them first, then {later} equal tasks" if self.first == "half" else f"{later} equal tasks"
            raise ValueError(f"{classes} classes cannot be cut into {shape}")
        return ([first] if first else []) + [(classes - first) // later] * later


class FamilyScenario(BaseModel):
    """A scenario as an experiment file's `scenario:` section (a family and its options, increments where the
    family takes them); checked on each cell by the experiment's own model, so its messages name the family's
    fields."""

    model_config = ConfigDict(extra="allow", frozen=True)
    family: str

    def section(self) -> dict[str, Any]:
        return self.model_dump(mode="python")


class PairingSpec(_Strict):
    """D^HT and D^E of a cell: one dataset split in two (high similarity) or two datasets (section 3.2)."""

    similarity: Literal["high", "low"]
    datasets: DatasetsSpec
    overrides: ExperimentFields = ExperimentFields()


class MatrixConfig(_Strict):
    matrix: str = Field(pattern=NAME)
    algorithms: list[str] = Field(min_length=1)
    scenarios: dict[str, str | list[int] | ScenarioShape | FamilyScenario] = Field(min_length=1)
    pairings: dict[str, PairingSpec] = Field(min_length=1)
    base: ExperimentFields = ExperimentFields()
    algorithm_overrides: dict[str, ExperimentFields] = {}
    original: bool = False  # also evaluate each algorithm's `original` preset on D^E (the paper's "Original")
    protocol: Literal["gtep", "conventional"] = "gtep"  # conventional: also re-run H* on D^HT, orderings S..2S-1

    def phases(self) -> list[str]:
        """The phases the matrix file asks every cell to run, in the study plan's order (study_phases, the order
        `gtep run` runs them in); a cell whose evaluation.sets is `all` runs evaluate_sets too."""
        return study_phases(self.protocol, with_original=self.original).names


@dataclass(frozen=True)
class MatrixCell:
    """One study of the matrix and where it sits in it."""

    matrix: str
    name: str
    algorithm: str
    scenario: str
    pairing: str
    similarity: str
    config: ExperimentConfig

    @property
    def tags(self) -> dict[str, str]:
        """Tags of every phase run of the cell, which `gtep report --matrix` groups by."""
        return {"gtep.matrix": self.matrix, "gtep.cell": self.name, "gtep.scenario": self.scenario,
                "gtep.pairing": self.pairing, "gtep.similarity": self.similarity}


@dataclass(frozen=True)
class ResolvedCell:
    cell: MatrixCell
    resolved: ResolvedExperiment


# ---------------------------------------------------------------- loading

def _loc(error: ErrorDetails) -> str:
    union_tags = {"str", "list[int]", "ScenarioShape", "FamilyScenario", "function-after", "function-before",
                  "function-wrap"}
    return ".".join(str(p) for p in error["loc"] if str(p) not in union_tags and not str(p).startswith("function-"))


def parse_matrix(data: Any, source: str) -> MatrixConfig:
    """Shape and types (pydantic, extra fields forbidden), then the checks that span fields."""
    if not isinstance(data, dict):
        raise ConfigError("--config", f"{source} must be a YAML mapping (matrix, algorithms, scenarios, pairings, ...)")
    try:
        matrix = MatrixConfig.model_validate(_expand_env(data, ""))
    except ValidationError as err:
        first = max(err.errors(), key=lambda e: len(e["loc"]))  # the deepest: a union's own member, not its tag
        message = first["msg"].removeprefix("Value error, ")
        if first["type"] == "extra_forbidden":
            message = "is not a known field; remove it or check its spelling"
        elif first["type"] == "missing":
            message = "is required; add it to the matrix file"
        raise ConfigError(_loc(first) or "matrix", f"{message} (in {source})") from None
    check_matrix(matrix)
    return matrix


def check_matrix(m: MatrixConfig) -> None:
    """Names usable in folder and run names, no duplicate, overrides that leave the cell's own fields alone."""
    named = (("algorithms", m.algorithms), ("scenarios", list(m.scenarios)), ("pairings", list(m.pairings)))
    for field, names in named:
        for name in names:
            if not re.match(NAME, name):
                raise ConfigError(f"{field}.{name}", "names may use letters, digits, '_', '.' and '-' only")
    duplicated = sorted({a for a in m.algorithms if m.algorithms.count(a) > 1})
    if duplicated:
        raise ConfigError("algorithms", f"lists {duplicated} twice; give each algorithm once")
    for name, value in m.scenarios.items():
        if not isinstance(value, (ScenarioShape, FamilyScenario)):
            try:
                parse_increments(value)
            except ValueError as err:
                raise ConfigError(f"scenarios.{name}", str(err)) from None
    for name, pairing in m.pairings.items():
        if pairing.datasets.split is not None and pairing.similarity != "high":
            raise ConfigError(f"pairings.{name}.similarity", "a split of one dataset is high similarity (paper "
                              "section 3.2); set similarity: high, or give tuning and evaluation datasets")
    unknown = sorted(set(m.algorithm_overrides) - set(m.algorithms))
    if unknown:
        raise ConfigError(f"algorithm_overrides.{unknown[0]}", f"is not in algorithms {m.algorithms}; add it there "
                          "or remove its overrides")
    layers = [(f"pairings.{n}.overrides", p.overrides) for n, p in m.pairings.items()]
    layers += [(f"algorithm_overrides.{n}", o) for n, o in m.algorithm_overrides.items()]
    for where, fields in layers:  # one store and one Ray session serve the whole matrix
        if fields.tracking is not None:
            raise ConfigError(f"{where}.tracking", "one MLflow store serves the matrix; set tracking in base only")
        if fields.compute and "ray_address" in fields.compute:
            raise ConfigError(f"{where}.compute.ray_address", "the matrix runs in one Ray session; set it in base "
                              "or pass --address")


def load_matrix(path: Path) -> MatrixConfig:
    path = Path(path)
    data = read_yaml(path, "--config", "a matrix YAML file")  # a missing file, a folder, bad syntax (line, column)
    return parse_matrix(data, str(path))


def matrix_preset_names() -> list[str]:
    folder = resources.files("gtep.presets").joinpath("matrix")
    return sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".yaml"))


def matrix_preset_text(name: str) -> str:
    if name not in matrix_preset_names():
        raise ConfigError("--preset", f"unknown matrix preset {name!r}; choose from {matrix_preset_names()} "
                          "(gtep matrices)")
    return resources.files("gtep.presets").joinpath("matrix", f"{name}.yaml").read_text()


def load_matrix_preset(name: str) -> MatrixConfig:
    return parse_matrix(parse_yaml(matrix_preset_text(name), f"matrix preset {name}"), f"matrix preset {name}")


# ---------------------------------------------------------------- cells

def cell_name(m: MatrixConfig, algorithm: str, scenario: str, pairing: str) -> str:
    return f"{m.matrix}-{algorithm}-{scenario}-{pairing}"


def cell_keys(m: MatrixConfig) -> list[tuple[str, str, str]]:
    """(algorithm, scenario, pairing) in running order: a pairing's and a scenario's cells together, so each of
    the paper's tables (one per scenario and pairing, algorithms as rows) completes as early as possible."""
    return [(a, s, p) for p in m.pairings for s in m.scenarios for a in m.algorithms]


def matrix_root(m: MatrixConfig, output: Path | None = None) -> Path:
    """<output>/<matrix>: the cells' study folders, the state file and the default MLflow store."""
    return Path(output or (m.base.tracking or {}).get("output") or "gtep-runs") / m.matrix


def _merge(low: dict[str, Any], high: dict[str, Any]) -> dict[str, Any]:
    out = dict(low)
    for key, value in high.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def _has(layer: dict[str, Any], dotted: str) -> bool:
    node: Any = layer
    for key in dotted.split("."):
        if not isinstance(node, dict) or key not in node:
            return False
        node = node[key]
    return True


def _where(m: MatrixConfig, field: str, algorithm: str, scenario: str, pairing: str, cli: dict[str, Any]) -> str:
    """The place in the matrix file (or the command line) that a cell's config field came from."""
    head = field.split(".")[0]
    if head == "algorithm":
        return "algorithms"
    if head == "study":
        return "matrix"
    if head == "scenario":  # a family section's own field keeps its path below the scenario's name
        inner = field.split(".")[1:] if isinstance(m.scenarios[scenario], FamilyScenario) else []
        return ".".join([f"scenarios.{scenario}", *inner])
    if head == "datasets":
        return f"pairings.{pairing}.{field}"
    if _has(cli, field):
        return f"{field} (command line)"
    overrides = m.algorithm_overrides.get(algorithm)
    if overrides is not None and _has(overrides.layer(), field):
        return f"algorithm_overrides.{algorithm}.{field}"
    if _has(m.pairings[pairing].overrides.layer(), field):
        return f"pairings.{pairing}.overrides.{field}"
    return f"base.{field}"


def _increments_text(increments: list[int]) -> str:
    """[25, 5, 5, 5, 5, 5] -> 'C25xT1+C5xT5', the paper's notation."""
    runs: list[list[int]] = []
    for value in increments:
        if runs and runs[-1][0] == value:
            runs[-1][1] += 1
        else:
            runs.append([value, 1])
    return "+".join(f"C{c}xT{t}" for c, t in runs)


def _cell_config(m: MatrixConfig, name: str, algorithm: str, scenario: str, pairing: str, increments: Any,
                 root: Path, cli: dict[str, Any]) -> ExperimentConfig:
    spec = m.pairings[pairing]
    data = _merge(m.base.layer(), spec.overrides.layer())
    if algorithm in m.algorithm_overrides:
        data = _merge(data, m.algorithm_overrides[algorithm].layer())
    data = _merge(data, cli)
    scenario_section = increments.section() if isinstance(increments, FamilyScenario) else {"increments": increments}
    data = _merge(data, {"study": name, "algorithm": algorithm, "scenario": scenario_section,
                         "datasets": spec.datasets.model_dump(mode="python", exclude_none=True),
                         "tracking": {"output": root}})
    try:
        return ExperimentConfig.model_validate(data)
    except ValidationError as err:
        first = err.errors()[0]
        field = ".".join(str(p) for p in first["loc"] if not str(p).startswith("function-")) or "base"
        message = first["msg"].removeprefix("Value error, ")
        if first["type"] == "extra_forbidden":
            message = "is not a known field; remove it or check its spelling"
        raise ConfigError(_where(m, field, algorithm, scenario, pairing, cli), f"{message} (cell {name})") from None


def _cli_layer(overrides: dict[str, Any] | None) -> dict[str, Any]:
    """Dotted command-line overrides ({'search.trials': 3}) as a nested layer; None means 'not given'."""
    layer: dict[str, Any] = {}
    for dotted, value in (overrides or {}).items():
        if value is None:
            continue
        *parents, leaf = dotted.split(".")
        node = layer
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    return layer


def expand_cells(m: MatrixConfig, output: Path | None = None,
                 overrides: dict[str, Any] | None = None) -> list[MatrixCell]:
    """Every cell as an ExperimentConfig: base, then the pairing's overrides, the algorithm's, the command line's.
    A scenario given by its shape reads the pairing's class count from the dataset's metadata."""
    root = matrix_root(m, output).resolve()
    cli = _cli_layer(overrides)
    names = [cell_name(m, *key) for key in cell_keys(m)]
    if len(set(names)) != len(names):
        clash = sorted({n for n in names if names.count(n) > 1})[0]
        raise ConfigError("scenarios", f"two cells are both named {clash!r}; rename a scenario or a pairing")
    counts: dict[str, int] = {}
    cells = []
    for (algorithm, scenario, pairing), name in zip(cell_keys(m), names):
        shape = m.scenarios[scenario]
        increments = shape
        if isinstance(shape, ScenarioShape):
            if pairing not in counts:  # the tuning phase's class count (resolve checks the evaluation phase's)
                probe = _cell_config(m, name, algorithm, scenario, pairing, [1], root, cli)
                try:
                    counts[pairing] = len(_phase_classes(probe)[0].classes)
                except ConfigError as err:
                    message = str(err).removeprefix(f"{err.field}: ")
                    raise ConfigError(_where(m, err.field, algorithm, scenario, pairing, cli),
                                      f"{message} (cell {name})") from None
            try:
                increments = _increments_text(shape.increments(counts[pairing]))
            except ValueError as err:
                raise ConfigError(f"scenarios.{scenario}", f"{err} in pairing {pairing} (cell {name}); give "
                                  "explicit increments or change the pairing's classes") from None
        config = _cell_config(m, name, algorithm, scenario, pairing, increments, root, cli)
        cells.append(MatrixCell(m.matrix, name, algorithm, scenario, pairing, m.pairings[pairing].similarity, config))
    return cells


def resolve_cells(m: MatrixConfig, output: Path | None = None,
                  overrides: dict[str, Any] | None = None) -> list[ResolvedCell]:
    """Expand and resolve every cell before any compute (names, data, increments, disjoint phases, search
    spaces, the `original` preset when asked for). The first bad cell is one ConfigError; nothing is written."""
    from gtep.spaces import load_space

    resolved = []
    for cell in expand_cells(m, output, overrides):
        try:
            r = preflight(cell.config).resolved
        except ConfigError as err:
            # the experiment's field names in the message become the matrix file's
            message = str(err).removeprefix(f"{err.field}: ")
            message = message.replace(" datasets.", f" pairings.{cell.pairing}.datasets.")
            where = _where(m, err.field, cell.algorithm, cell.scenario, cell.pairing, _cli_layer(overrides))
            raise ConfigError(where, f"{message} (cell {cell.name})") from None
        if m.original and "original" not in load_space(cell.algorithm, r.space_path).presets:
            raise ConfigError("original", f"{r.space_path} has no 'original' preset for {cell.algorithm} (cell "
                              f"{cell.name}); add presets.original there or set original: false")
        resolved.append(ResolvedCell(cell, r))
    return resolved


def changed_field(stored: dict[str, Any], cell: MatrixCell) -> str | None:
    """The first result-defining field in which a cell's recorded config differs from the file's, if any."""
    current = cell.config.model_dump(mode="json")
    stored = with_added_defaults(stored)  # a cell recorded before fields were added compares at their defaults
    for name in RESULT_FIELDS:
        if stored.get(name) != current.get(name):
            return name
    return None
