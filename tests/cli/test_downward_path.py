"""The config of `gtep tune`, `gtep evaluate` and `gtep run` on its way from the command line to Ray goes down only
(DESIGN.md, "Downward only": the CLI resolves the experiment once and hands it down; nothing below calls back up).

The test runs each command on a tiny study (the `default` preset, Omniglot bundled, R = S = 1; `gtep evaluate` with
the algorithm's original preset or a best.yaml; `gtep run` also under its first_task protocol with the original
preset beside H*, and under the conventional protocol) in this process with a profiler recording every call between
gtep's modules, and stops where the study is handed to Ray: the first phase's trainable (`trainable_for`) raises
instead of being built, and Ray itself is never started, so nothing trains.
A call is (caller file, callee file, function), both files under gtep/, with when it began and when it returned;
module bodies (imports) are left out. A file's layer is its top-level package or module, ranked as pyproject's
[tool.importlinter] "Layers" contract lists them (cli above api above ... above plugins).

The path is downward when all of these hold:

1. No call climbs a layer: every call goes to a module of the caller's own layer or of a layer below it.
2. The experiment is resolved exactly once: gtep.config.resolution.resolve runs once.
3. The CLI calls down once before that: of the calls from the cli layer into a lower layer, only one begins
   before the resolution has returned, and the resolution runs inside it. (The climb back this replaced: the CLI
   called api.experiment, which returned an unresolved config to the CLI, which then called api.tune, api.evaluate
   or api.run, which resolved it.)
4. The tracking address is resolved and checked once: the one rule on an address (config.uris.check_no_userinfo,
   reached through config.checks.check_tracking_uri) runs once, inside the resolution, and is never run again
   below it; and the address does not go back and forth between gtep/config/uris.py and
   gtep/orchestration/tracking_auth.py: the calls that enter those two files from other files, with consecutive
   entries into the same file taken as one, visit them in at most two stretches (uris, then tracking_auth; never
   uris -> tracking_auth -> uris).
5. Above orchestration (the cli and api layers) no call climbs back to a file already left: no call enters a
   file that an unfinished call lower on the stack is in, from another file (before: cli/study.py called
   cli/common.py's run_guarded, which called the command's body back in cli/study.py).
"""
from __future__ import annotations

import contextlib
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import pytest

import gtep

GTEP = Path(gtep.__file__).resolve().parent
PYPROJECT = GTEP.parent / "pyproject.toml"
URIS, AUTH = "config/uris.py", "orchestration/tracking_auth.py"


def layer_ranks() -> dict[str, int]:
    """Each layer's name (a top-level package or module of gtep) and its rank, 0 the highest."""
    contracts = tomllib.loads(PYPROJECT.read_text())["tool"]["importlinter"]["contracts"]
    layers = next(c for c in contracts if c["type"] == "layers")["layers"]
    return {name.strip(): rank for rank, names in enumerate(layers) for name in names.split("|")}


RANKS = layer_ranks()


def layer(file: str) -> str:
    return file.split("/")[0].removesuffix(".py")


@dataclass
class Call:
    caller: str  # the file of the nearest gtep frame that made the call
    callee: str
    name: str
    start: int
    end: int = -1  # the index the call returned at (-1: it never did)


class HandedToRay(Exception):
    """Raised where the phase's trainable would be built: the study has reached Ray."""


def gtep_file(filename: str) -> str | None:
    try:
        return Path(filename).resolve().relative_to(GTEP).as_posix()
    except ValueError:
        return None


@contextlib.contextmanager
def recording() -> Iterator[list[Call]]:
    """Every call from one gtep module's function into another's (or the same's), in order, on this thread."""
    calls: list[Call] = []
    open_calls: dict[int, Call] = {}
    files: dict[str, str | None] = {}
    clock = [0]

    def file_of(frame: Any) -> str | None:
        name = frame.f_code.co_filename
        if name not in files:
            files[name] = gtep_file(name)
        return files[name]

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event not in ("call", "return"):
            return
        clock[0] += 1
        if event == "return":
            call = open_calls.pop(id(frame), None)
            if call is not None:
                call.end = clock[0]
            return
        callee = file_of(frame)
        if callee is None or frame.f_code.co_name == "<module>":
            return
        caller_frame = frame.f_back
        while caller_frame is not None and file_of(caller_frame) is None:
            caller_frame = caller_frame.f_back
        if caller_frame is None or caller_frame.f_code.co_name == "<module>":
            return
        call = Call(file_of(caller_frame) or "", callee, frame.f_code.co_name, clock[0])
        calls.append(call)
        open_calls[id(frame)] = call

    sys.setprofile(profile)
    try:
        yield calls
    finally:
        sys.setprofile(None)


@contextlib.contextmanager
def no_ray(address: str | None) -> Iterator[None]:
    yield


def original_best(tmp_path: Path) -> str:
    """A best.yaml as gtep tune writes it, holding the default preset's algorithm's original values."""
    import yaml

    from gtep.config import load_preset
    from gtep.spaces import load_space

    algorithm = load_preset("default").algorithm
    path = tmp_path / "best.yaml"
    path.write_text(yaml.safe_dump({"algorithm": algorithm, "set_index": 0, "tuning_run_id": "",
                                    "hparams": load_space(algorithm).presets["original"]}))
    return str(path)


TINY = ["--preset", "default", "--orderings", "1"]
# each command as a user types it, up to its study folder (--output is added); the phase it hands to Ray first and
# the search.protocol of the experiment it hands down (first_task set before the one resolution)
COMMANDS = {
    "tune": (lambda tmp: ["tune", *TINY, "--trials", "1"], "tune", "gtep"),
    "evaluate-hparams": (lambda tmp: ["evaluate", *TINY, "--hparams", "original"], "evaluate", "gtep"),
    "evaluate-best": (lambda tmp: ["evaluate", *TINY, "--best", original_best(tmp)], "evaluate", "gtep"),
    "run": (lambda tmp: ["run", *TINY, "--trials", "1"], "tune", "gtep"),
    "run-first-task": (lambda tmp: ["run", *TINY, "--trials", "1", "--protocol", "first_task", "--protocol-tasks",
                                    "1", "--with-original"], "tune", "first_task"),
    "run-conventional": (lambda tmp: ["run", *TINY, "--trials", "1", "--protocol", "conventional"], "tune", "gtep"),
}


def traced(argv: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[list[Call], tuple[str, str]]:
    """The calls of a command (`argv`) on a tiny study, up to where it hands the study to Ray; and the phase it
    hands to Ray with the search.protocol of the experiment it hands with it."""
    from typer.testing import CliRunner

    from gtep.cli import app
    from gtep.orchestration import phase_run, ray_search

    reached: list[tuple[str, str]] = []

    def handed(resolved: Any, phase: Any, *args: Any, **kwargs: Any) -> Any:
        reached.append((getattr(phase, "name", phase), resolved.config.search.protocol))
        raise HandedToRay()

    monkeypatch.setattr(ray_search, "ray_session", no_ray)  # no Ray started: nothing runs on it
    monkeypatch.setattr(phase_run, "check_resources", lambda *args, **kwargs: None)
    monkeypatch.setattr(phase_run, "trainable_for", handed)
    argv = [*argv, "--output", str(tmp_path / "runs")]
    with recording() as calls:
        result = CliRunner().invoke(app, argv)
    assert isinstance(result.exception, HandedToRay), result.output + repr(result.exception)
    return calls, reached[0]


@pytest.mark.parametrize("command", list(COMMANDS))
def test_the_command_hands_the_resolved_experiment_down_once(command, tmp_path, monkeypatch):
    argv, phase, protocol = COMMANDS[command]
    calls, reached = traced(argv(tmp_path), tmp_path, monkeypatch)
    assert reached == (phase, protocol), f"handed to Ray: {reached}"
    assert all(layer(c.caller) in RANKS and layer(c.callee) in RANKS for c in calls
               if c.caller != "__init__.py" and c.callee != "__init__.py"), "a gtep module has no layer"
    ranked = [c for c in calls if layer(c.caller) in RANKS and layer(c.callee) in RANKS]

    # 1. no call climbs a layer
    climbs = [f"{c.caller} -> {c.callee}:{c.name}" for c in ranked
              if RANKS[layer(c.callee)] < RANKS[layer(c.caller)]]
    assert climbs == [], f"calls back up a layer: {climbs}"

    # 2. resolved exactly once
    resolutions = [c for c in calls if c.callee == "config/resolution.py" and c.name == "resolve"]
    assert len(resolutions) == 1, f"the experiment is resolved {len(resolutions)} times"
    resolution = resolutions[0]

    # 3. the CLI calls down once before the experiment is resolved, and that call resolves it
    down = [c for c in ranked if layer(c.caller) == "cli" and layer(c.callee) != "cli"]
    early = [f"{c.caller} -> {c.callee}:{c.name}" for c in down if c.start < resolution.end]
    assert len(early) == 1, f"the CLI calls down {len(early)} times before the experiment is resolved: {early}"
    first = down[0]
    assert first.start < resolution.start and resolution.end <= first.end, (
        f"the CLI's first call down ({first.callee}:{first.name}) returned before the experiment was resolved")

    # 4. the address is checked once, inside the resolution, and does not go back and forth
    rule = {("config/uris.py", "check_no_userinfo"), ("config/checks.py", "check_tracking_uri"),
            ("orchestration/tracking_auth.py", "refuse_password_in_uri")}
    checks = [c for c in calls if (c.callee, c.name) in rule]
    assert sorted(c.name for c in checks) == ["check_no_userinfo", "check_tracking_uri"], (
        f"the tracking address is checked {len(checks)} times: {[f'{c.caller} -> {c.name}' for c in checks]}")
    assert all(resolution.start < c.start and c.end <= resolution.end for c in checks)
    stretches: list[str] = []
    for c in calls:
        if c.callee in (URIS, AUTH) and c.caller != c.callee and (not stretches or stretches[-1] != c.callee):
            stretches.append(c.callee)
    assert len(stretches) <= 2, f"the address goes back and forth: {' -> '.join(stretches)}"

    # 5. no callback into a file left on the way down, in the cli and api layers
    callbacks = [f"{c.caller} -> {c.callee}:{c.name}" for c in calls
                 if layer(c.callee) in ("cli", "api") and c.caller != c.callee
                 and any(o.callee == c.callee and o.start < c.start and (o.end == -1 or o.end > c.start)
                         for o in calls)]
    assert callbacks == [], f"calls back into a file already left: {callbacks}"
