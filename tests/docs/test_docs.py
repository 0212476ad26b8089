"""The documentation cannot drift from the code: every example in docs/**/*.md and README.md is checked.

Every fenced block says whether a test runs it, in an HTML comment among the comment lines just before its fence
(blank lines allowed between):

    <!-- runs: tests/FILE.py -->             that test file runs the block; it must exist and name the page's path
                                               (e.g. "docs/python-api.md": tests/api/test_api_docs.py runs that page)
    <!-- not run: REASON -->                 no test runs it, and why (it trains a study, needs a cluster...)
    <!-- yaml: KIND -->                      a yaml block validated here as KIND (below): that counts as checked

A block with none of them fails. This file runs the blocks marked `runs: tests/docs/test_docs.py` (the read-only
commands of docs/algorithms.md and docs/cli.md: gtep algorithms, spaces, presets, matrices) through the CLI,
each command exiting 0. The command blocks marked not run are still parsed, as below: parsing is not running.

YAML blocks (```yaml) are validated as what they are. The kind comes from an HTML comment alone on the last
non-blank line before the fence (indented as the block may be), or else from the content:

    <!-- yaml: config -->                    a whole experiment file             (content: has `study:`)
    <!-- yaml: fragment -->                  some top-level sections of one      (content: only experiment-file
    <!-- yaml: fragment preset=NAME -->        sections); they replace those sections of the shipped preset
                                               `default` (or NAME), and the result is validated as a config
    <!-- yaml: matrix -->                    a `gtep matrix` file                 (content: has `matrix:`)
    <!-- yaml: space -->                     a search-space file                  (content: `algorithm:` + `space:`)
    <!-- yaml: other -->                     anything else (cluster files, a plugin's space): parsed only

A block whose kind neither a marker nor its content gives fails, asking for a marker; a marker that is not
followed by a yaml block fails. A config is checked by gtep.config's schema (validate_config), then by name:
its algorithm, backbone, family and criterion against the registries, its search space loaded (paths relative
to the repository root). A matrix is parsed by gtep.matrix and every cell's merged config is checked the same
way; a search space is loaded by gtep.spaces against its algorithm. `${VAR}` becomes a placeholder path, so no
data root need exist. `--8<-- "path"` lines (pymdownx.snippets, as the site includes files) become the file.

Command blocks (```bash, ```console, ```sh, ```shell; in console blocks only `$ ` lines): every command, also
after `&&`, `||`, `|` or `;`, that runs `gtep` or `.venv/bin/gtep` (after any `VAR=value` assignments) is parsed by
the real Typer app (gtep.cli.app, through typer.main.get_command and each command's make_context) without
running it: an unknown command or option, a bad value or a missing argument fails, and so does a --preset or
--algorithm that names nothing shipped or registered. `python benchmarks/X.py` must name an existing file.

Also: `mkdocs build --strict` succeeds; README's test command is .ci/run's; README's benchmark tables are those of
docs/benchmarks.md; every registered algorithm, every family option and every CLI command is documented.
"""
from __future__ import annotations

import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
README = ROOT / "README.md"
PAGES = sorted(DOCS.rglob("*.md")) + [README]

FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})[ \t]*(?P<lang>[\w+-]*)")
MARKER = re.compile(r"^\s*<!--\s*yaml:\s*(?P<kind>[\w-]+)(?P<options>(\s+[\w-]+=\S+)*)\s*-->\s*$")
SNIPPET = re.compile(r'^\s*--8<--\s+"(?P<path>[^"]+)"\s*$')
ENV = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
YAML_LANGS = {"yaml", "yml"}
COMMAND_LANGS = {"bash", "console", "sh", "shell"}
KINDS = {"config", "fragment", "matrix", "space", "other"}
GTEP = {"gtep", ".venv/bin/gtep"}
PYTHON = {"python", "python3", ".venv/bin/python"}
ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
PLACEHOLDER = re.compile(r"^[A-Z][A-Z0-9_]*$")  # NAME, ALGO, JOB_ID: a value the reader supplies
RUN_MARKER = re.compile(r"^\s*<!--\s*(?P<what>runs|not run):\s*(?P<text>.*?)\s*-->\s*$")
READ_ONLY_COMMANDS = {"algorithms", "spaces", "presets", "matrices"}  # what this file may run from the docs


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # 1-based line of the opening fence
    lang: str
    text: str
    marker: str | None  # the marker comment's kind and options, e.g. "fragment preset=omniglot-iirc"
    runs: str | None = None  # "runs: tests/X.py" or "not run: REASON", from the comments before the fence

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def _closes(line: str, fence: str) -> bool:
    stripped = line.strip()
    return len(stripped) >= len(fence) and set(stripped) == {fence[0]}


def _dedent(line: str, indent: int) -> str:
    cut = 0
    while cut < indent and cut < len(line) and line[cut] in " \t":
        cut += 1
    return line[cut:]


def _expand_snippets(lines: list[str]) -> list[str]:
    out = []
    for line in lines:
        match = SNIPPET.match(line)
        out.extend((ROOT / match["path"]).read_text().splitlines() if match else [line])
    return out


def _run_marker(lines: list[str], fence: int) -> str | None:
    """The `runs:` or `not run:` comment among the comment (and blank) lines just before the fence at `fence`."""
    i = fence - 1
    while i >= 0 and (not lines[i].strip() or lines[i].strip().startswith("<!--")):
        match = RUN_MARKER.match(lines[i])
        if match:
            return f"{match['what']}: {match['text']}"
        i -= 1
    return None


def read_blocks(page: Path) -> tuple[list[Block], list[tuple[int, str]]]:
    """The page's fenced blocks, and its yaml markers that precede no yaml block (line, text)."""
    lines = page.read_text().splitlines()
    blocks: list[Block] = []
    stray: list[tuple[int, str]] = []
    markers = {i for i, line in enumerate(lines) if MARKER.match(line)}
    i = 0
    while i < len(lines):
        match = FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        start, indent, fence, lang = i, len(match["indent"]), match["fence"], match["lang"].lower()
        before = start - 1
        while before >= 0 and not lines[before].strip():
            before -= 1
        marker = MARKER.match(lines[before]) if before >= 0 else None
        if marker and lang in YAML_LANGS:
            markers.discard(before)
        i += 1
        body = []
        while i < len(lines) and not _closes(lines[i], fence):
            body.append(_dedent(lines[i], indent))
            i += 1
        i += 1  # the closing fence
        text = "\n".join(_expand_snippets(body)) + "\n"
        blocks.append(Block(page, start + 1, lang, text,
                            f"{marker['kind']}{marker['options']}".strip() if marker else None,
                            _run_marker(lines, start)))
    stray = [(i + 1, lines[i].strip()) for i in sorted(markers)]
    return blocks, stray


BLOCKS = [block for page in PAGES for block in read_blocks(page)[0]]
YAML_BLOCKS = [b for b in BLOCKS if b.lang in YAML_LANGS]
COMMAND_BLOCKS = [b for b in BLOCKS if b.lang in COMMAND_LANGS]


# ---------------------------------------------------------------- run, or say why not

def marker_problems(blocks: list[Block]) -> list[str]:
    """The blocks that neither say how they run nor why not, and the `runs:` markers whose test cannot run them."""
    problems = []
    for block in blocks:
        if block.runs is None:
            if not (block.lang in YAML_LANGS and block.marker):
                problems.append(f"{block.where}: no <!-- runs: tests/FILE.py --> or <!-- not run: REASON --> "
                                "before this block")
            continue
        what, _, text = block.runs.partition(": ")
        if what == "not run":
            if not text:
                problems.append(f"{block.where}: <!-- not run: --> needs its reason")
            continue
        test = ROOT / text
        page = str(block.page.relative_to(ROOT))
        if not (text.startswith("tests/") and text.endswith(".py") and test.is_file()):
            problems.append(f"{block.where}: runs: {text} is not a test file in tests/")
        elif page not in test.read_text():
            problems.append(f"{block.where}: {text} does not mention {page}, so it cannot be running this block")
    return problems


def test_every_block_runs_in_a_test_or_says_why_not() -> None:
    problems = marker_problems(BLOCKS)
    assert not problems, "\n".join(problems)


def test_the_marker_check_refuses_what_it_should(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("Text.\n\n```bash\ngtep run\n```\n\n<!-- not run:  -->\n```python\nx = 1\n```\n\n"
                    "<!-- runs: tests/docs/test_docs.py -->\n```python\nx = 2\n```\n\n"
                    "<!-- yaml: other -->\n```yaml\na: 1\n```\n"
                    "\n<!-- not run: needs a cluster -->\n\n<!-- yaml: other -->\n```yaml\nb: 2\n```\n")
    blocks = [Block(ROOT / "docs" / "page.md", b.line, b.lang, b.text, b.marker, b.runs) for b in read_blocks(page)[0]]
    problems = marker_problems(blocks)
    assert [p.split(":")[1] for p in problems] == ["3", "8", "13"], problems  # unmarked, no reason, not named
    assert blocks[-1].runs == "not run: needs a cluster" and blocks[-1].marker == "other"


def _gtep_words(block: Block) -> list[list[str]]:
    return [words[1:] for line in command_lines(block) for words in segments(line) if words[0] in GTEP]


@pytest.mark.parametrize("block", [b for b in BLOCKS if b.runs == "runs: tests/docs/test_docs.py"],
                         ids=[b.where for b in BLOCKS if b.runs == "runs: tests/docs/test_docs.py"])
def test_read_only_command_blocks_run(block: Block) -> None:
    """docs/algorithms.md's and docs/cli.md's information commands, run as printed: each exits 0 and prints."""
    from typer.testing import CliRunner

    from gtep.cli import app

    commands = _gtep_words(block)
    assert commands and len(commands) == len(command_lines(block)), f"{block.where}: only gtep commands run here"
    for args in commands:
        assert args[0] in READ_ONLY_COMMANDS, f"{block.where}: gtep {args[0]} is not read-only; mark it not run"
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 0 and result.output.strip(), f"{block.where}: gtep {' '.join(args)}: {result.output}"


# ---------------------------------------------------------------- YAML

def _placeholders(value: Any) -> Any:
    """${VAR} -> /data/VAR: presets' data roots need not exist (nothing here reads the data)."""
    if isinstance(value, dict):
        return {k: _placeholders(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_placeholders(v) for v in value]
    if isinstance(value, str):
        return ENV.sub(lambda m: f"/data/{m.group(1)}", value)
    return value


def check_names(cfg: Any, where: str) -> None:
    """What gtep.config.resolve checks by name (without reading any data): algorithm, backbone, family and
    criterion, the search space."""
    from gtep.algorithms import ALGORITHMS
    from gtep.config.family_checks import _check_family
    from gtep.models import backbone_exists
    from gtep.models.vit import is_vit
    from gtep.spaces import default_space_file, load_space

    assert cfg.algorithm in ALGORITHMS, f"{where}: unknown algorithm {cfg.algorithm!r}; see {ALGORITHMS.names()}"
    assert backbone_exists(cfg.backbone), f"{where}: unknown backbone {cfg.backbone!r}"
    if ALGORITHMS.get(cfg.algorithm).uses_pretrained:
        assert is_vit(cfg.backbone), f"{where}: {cfg.algorithm} needs a ViT backbone, not {cfg.backbone!r}"
    _check_family(cfg)
    space = Path(cfg.search.space) if cfg.search.space else default_space_file(cfg.algorithm)
    space = space if space.is_absolute() else ROOT / space
    if cfg.search.space is not None or space.exists():  # finetune and simplecil have no search space
        load_space(cfg.algorithm, space)


def check_config(data: Any, where: str) -> None:
    from gtep.config import validate_config

    check_names(validate_config(_placeholders(data), where), where)


def check_fragment(data: Any, where: str, preset: str) -> None:
    from gtep.config import preset_text

    assert isinstance(data, dict), f"{where}: a fragment is a mapping of experiment-file sections"
    base = yaml.safe_load(preset_text(preset))
    check_config({**base, **data}, f"{where} (merged into preset {preset})")


def check_matrix_file(data: Any, where: str) -> None:
    from gtep.algorithms import ALGORITHMS
    from gtep.matrix import ScenarioShape, _cell_config, cell_keys, cell_name, parse_matrix

    matrix = parse_matrix(_placeholders(data), where)
    for algorithm in matrix.algorithms:
        assert algorithm in ALGORITHMS, f"{where}: unknown algorithm {algorithm!r} in algorithms"
    for algorithm, scenario, pairing in cell_keys(matrix):
        shape = matrix.scenarios[scenario]
        increments = [1] if isinstance(shape, ScenarioShape) else shape  # a shape needs the data's class count
        name = cell_name(matrix, algorithm, scenario, pairing)
        cfg = _cell_config(matrix, name, algorithm, scenario, pairing, increments, ROOT / "gtep-runs", {})
        check_names(cfg, f"{where} (cell {name})")


def check_space(data: Any, where: str, tmp_path: Path) -> None:
    from gtep.spaces import load_space

    assert isinstance(data, dict) and "algorithm" in data, f"{where}: a search space names its algorithm"
    path = tmp_path / f"{data['algorithm']}.yaml"
    path.write_text(yaml.safe_dump(data))
    load_space(data["algorithm"], path)


def kind_of(block: Block, data: Any) -> tuple[str, dict[str, str]]:
    """The block's kind and the marker's options (preset=NAME)."""
    from gtep.config import ExperimentConfig

    if block.marker:
        kind, *options = block.marker.split()
        assert kind in KINDS, f"{block.where}: unknown marker kind {kind!r}; use one of {sorted(KINDS)}"
        return kind, dict(option.split("=", 1) for option in options)
    if isinstance(data, dict):
        if "matrix" in data:
            return "matrix", {}
        if "space" in data and "algorithm" in data:
            return "space", {}
        if "study" in data:
            return "config", {}
        if data and set(data) <= set(ExperimentConfig.model_fields):
            return "fragment", {}
    raise AssertionError(f"{block.where}: cannot tell what this yaml block is; put a marker such as "
                         "<!-- yaml: other --> on the line before it (tests/docs/test_docs.py's docstring lists them)")


@pytest.mark.parametrize("block", YAML_BLOCKS, ids=[b.where for b in YAML_BLOCKS])
def test_yaml_example_is_valid(block: Block, tmp_path: Path) -> None:
    data = yaml.safe_load(block.text)
    kind, options = kind_of(block, data)
    if kind == "config":
        check_config(data, block.where)
    elif kind == "fragment":
        check_fragment(data, block.where, options.get("preset", "default"))
    elif kind == "matrix":
        check_matrix_file(data, block.where)
    elif kind == "space":
        check_space(data, block.where, tmp_path)


def test_every_yaml_marker_precedes_a_yaml_block() -> None:
    stray = [f"{page.relative_to(ROOT)}:{line}: {text}" for page in PAGES for line, text in read_blocks(page)[1]]
    assert not stray, f"markers that precede no ```yaml block: {stray}"


# ---------------------------------------------------------------- commands

def command_lines(block: Block) -> list[str]:
    """The block's command lines: continuation lines joined, comments and (in console blocks) output left out."""
    lines = block.text.splitlines()
    if block.lang == "console":
        lines = [line[2:] for line in lines if line.startswith("$ ")]
    commands: list[str] = []
    pending = ""
    for line in lines:
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        line, pending = pending + line, ""
        if line.strip() and not line.strip().startswith("#"):
            commands.append(line.strip())
    return commands


def segments(line: str) -> list[list[str]]:
    """The simple commands of a line: split at &&, ||, |, ;, & and redirections, comments dropped."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    parts: list[list[str]] = [[]]
    for token in lexer:
        if token and set(token) <= set("();<>|&"):
            parts.append([])
        else:
            parts[-1].append(token)
    return [p for p in parts if p]


def parse_cli(args: list[str]) -> tuple[list[str], dict[str, Any]]:
    """Parse `gtep ARGS` as the CLI would, without running anything: the command's path and its parameters."""
    import typer

    from gtep.cli import app

    command = typer.main.get_command(app)
    context = command.context_class(command, info_name="gtep")
    path = ["gtep"]
    while hasattr(command, "get_command"):  # a group: the next word names a command
        if not args or args[0].startswith("-"):
            raise AssertionError(f"`{' '.join(path)}` needs a command: {command.list_commands(context)}")
        name, args = args[0], args[1:]
        sub = command.get_command(context, name)
        if sub is None:
            raise AssertionError(f"`{' '.join(path)}` has no command {name!r}: {command.list_commands(context)}")
        path.append(name)
        command = sub
        if hasattr(command, "get_command"):
            context = command.context_class(command, info_name=name, parent=context)
    try:
        parsed = command.make_context(path[-1], list(args), parent=context)
    except Exception as err:  # click's UsageError, NoSuchOption, BadParameter, MissingParameter
        message = err.format_message() if hasattr(err, "format_message") else str(err)
        raise AssertionError(f"`{' '.join(path)}`: {message}") from None
    return path, parsed.params


def check_names_in_command(path: list[str], params: dict[str, Any]) -> None:
    from gtep.algorithms import ALGORITHMS
    from gtep.config import preset_names
    from gtep.matrix import matrix_preset_names

    def given(name: str) -> str | None:
        value = params.get(name)
        return None if value is None or PLACEHOLDER.match(str(value)) else str(value)

    matrix_command = path[1] in ("matrix", "matrices")
    preset = given("preset") or (given("show") if path[1] == "matrices" else None)
    if preset is not None:
        names = matrix_preset_names() if matrix_command else preset_names()
        assert preset in names, f"`{' '.join(path)}`: no preset {preset!r}; shipped: {names}"
    algorithm = given("algorithm")  # --algorithm, and `gtep spaces ALGORITHM`
    if algorithm is not None:
        assert algorithm in ALGORITHMS, f"`{' '.join(path)}`: no algorithm {algorithm!r}"


def check_command_line(line: str, where: str) -> None:
    for words in segments(line):
        while words and ASSIGNMENT.match(words[0]):
            words = words[1:]
        if not words:
            continue
        if words[0] in GTEP:
            try:
                path, params = parse_cli(words[1:])
                check_names_in_command(path, params)
            except AssertionError as err:
                raise AssertionError(f"{where}: {line}\n  {err}") from None
        elif words[0] in PYTHON and len(words) > 1 and words[1].endswith(".py"):
            assert (ROOT / words[1]).is_file(), f"{where}: {line}\n  {words[1]} does not exist"


@pytest.mark.parametrize("block", COMMAND_BLOCKS, ids=[b.where for b in COMMAND_BLOCKS])
def test_command_example_parses(block: Block) -> None:
    for line in command_lines(block):
        check_command_line(line, block.where)


def test_the_command_checks_see_gtep_commands() -> None:
    """The parser above is not vacuous: the docs hold gtep commands, and it finds them."""
    found = [words for b in COMMAND_BLOCKS for line in command_lines(b) for words in segments(line)
             if any(w in GTEP for w in words[:3])]
    assert len(found) > 50


# ---------------------------------------------------------------- the site and what it must cover

def test_site_builds_strictly(tmp_path: Path) -> None:
    if find_spec("mkdocs") is None or find_spec("material") is None:
        pytest.skip("mkdocs or mkdocs-material is not installed (the dev extra installs both)")
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                            cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, f"mkdocs build --strict failed:\n{result.stdout}{result.stderr}"


def _test_command(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("python3 -m venv .venv && .venv/bin/pip install -q "
                                                                   "-e '.[dev]'")]


def test_readme_test_command_is_what_ci_runs() -> None:
    ci = (ROOT / ".ci" / "run").read_text().strip().splitlines()[-1]
    assert _test_command(README.read_text()) == [ci]
    for page in DOCS.rglob("*.md"):  # the site's copies of it too
        for line in _test_command(page.read_text()):
            assert line.strip() == ci, f"{page.relative_to(ROOT)} shows another test command than .ci/run's"


def test_readme_benchmark_tables_are_the_sites() -> None:
    """README keeps the headline figures and points at docs/benchmarks.md for the tables; a table row it shows
    is one of the site's."""
    readme = README.read_text()
    section = readme[readme.index("\n## Benchmarks"):]
    assert "(docs/benchmarks.md" in section
    rows = [line for line in section.splitlines() if line.startswith("|") and not set(line) <= set("|-: ")]
    site = (DOCS / "benchmarks.md").read_text().splitlines()
    missing = [row for row in rows if row not in site]
    assert not missing, f"README's benchmark rows that docs/benchmarks.md does not have: {missing}"


def test_readme_stays_short() -> None:
    """The figures and tables live on the site; README is what a visitor reads first."""
    assert len(README.read_text().splitlines()) <= 250


def test_every_registered_algorithm_is_documented() -> None:
    from gtep.algorithms import ALGORITHMS

    text = "\n".join(p.read_text() for p in [DOCS / "algorithms.md", *sorted((DOCS / "families").glob("*.md"))])
    own = [n for n in ALGORITHMS.names() if ALGORITHMS.get(n).__module__.startswith("gtep.")]  # not plugins
    assert len(own) > 30
    missing = [name for name in own if f"`{name}`" not in text]
    assert not missing, f"algorithms without documentation in docs/algorithms.md or docs/families/: {missing}"


def test_every_family_option_is_documented() -> None:
    from gtep.config.scenario import SECTIONS
    from gtep.protocol.families import FAMILIES

    for name in FAMILIES.names():
        family = FAMILIES.get(name)
        if not type(family).__module__.startswith("gtep."):
            continue
        page = DOCS / "families" / f"{name.replace('_', '-')}.md"
        assert page.is_file(), f"the family {name} has no page {page.relative_to(ROOT)}"
        if family.section:
            text = page.read_text()
            missing = [f for f in SECTIONS[family.section].model_fields if f"`{f}`" not in text]
            assert not missing, f"{page.relative_to(ROOT)} does not describe scenario.{family.section}: {missing}"


def test_every_command_is_documented() -> None:
    import typer

    from gtep.cli import app

    group = typer.main.get_command(app)
    context = group.context_class(group, info_name="gtep")
    text = (DOCS / "cli.md").read_text()
    missing = []
    for name in group.list_commands(context):
        command = group.get_command(context, name)
        subs = command.list_commands(context) if hasattr(command, "list_commands") else [None]
        missing += [f"gtep {name} {sub}" if sub else f"gtep {name}" for sub in subs
                    if not re.search(rf"`gtep {name}{' ' + sub if sub else ''}[` ]", text)]
    assert not missing, f"commands docs/cli.md does not list: {missing}"


def test_readme_links_resolve() -> None:
    """README's relative links (into docs/, so they work on GitHub) name files that exist."""
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", README.read_text())
    local = [link for link in links if "://" not in link]
    assert any(link.startswith("docs/") for link in local)
    missing = [link for link in local if not (ROOT / link).exists()]
    assert not missing, f"README links to files that do not exist: {missing}"
