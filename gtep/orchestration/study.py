"""The study folder and its manifest: what was drawn and what finished, independent of Ray's internals.

<output>/<study>/manifest.json   the R sets (written before any training), phase runs, finished units
<output>/<study>/best.yaml       H* with its score and the tuning run it came from
<output>/<study>/<phase>_results.csv   one row per (set, ordering)
<output>/<study>/ray/            Ray Tune's own storage
<output>/<study>/units/<phase>-<attempt>/        one JSON per finished (set, ordering): reused on retry/resume
<output>/<study>/checkpoints/<phase>-<attempt>/  the last finished task of each running ordering
<output>/<study>/first_tasks/    task 1 of each ordering, trained once and shared by the sets (engine/first_task.py)
<output>/<study>/tracking/       the MLflow write journal (see journal.py)
<output>/<study>/events.jsonl    unit events from the trials (started, trained, reused), phase events from the driver
"""
from __future__ import annotations

import json
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gtep.config.private import private_folder
from gtep.protocol.phases import Phase


def write_atomic(path: Path, text: str) -> None:
    """Write via a temporary file and rename, so a crash never leaves a half-written file. The file is its owner's
    (mkstemp's 0600), and so is any folder made for it (a study's, its units': gtep.config.private)."""
    private_folder(path.parent)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.replace(tmp, path)


def json_by_entry(data: dict[str, Any]) -> str:
    """JSON with one line per top-level field and per entry of a top-level mapping or list (a set, a phase,
    a unit): as readable as `indent=`, which selects json's pure-Python encoder, and 3x faster. The manifest
    is saved after every unit: at 1,000 units an indented save took 35-40 ms of the driver, this one 12."""
    one = json.JSONEncoder(default=str).encode

    def entries(value: Any) -> str:
        if isinstance(value, dict) and value:
            return "{\n" + ",\n".join(f"  {one(str(k))}: {one(v)}" for k, v in value.items()) + "\n }"
        if isinstance(value, list) and value:
            return "[\n" + ",\n".join(f"  {one(v)}" for v in value) + "\n ]"
        return one(value)
    return "{\n" + ",\n".join(f" {one(str(k))}: {entries(v)}" for k, v in data.items()) + "\n}\n"


@dataclass
class StudyPaths:
    root: Path

    @property
    def manifest(self) -> Path:
        return self.root / "manifest.json"

    @property
    def best(self) -> Path:
        return self.root / "best.yaml"

    def results(self, phase: Phase) -> Path:
        return self.root / phase.results_csv

    @property
    def ray_storage(self) -> Path:
        return self.root / "ray"

    @property
    def first_tasks(self) -> Path:
        return self.root / "first_tasks"


class Manifest:
    """A JSON document kept on disk after every change (one writer: the driver). What Ray Tune's loop records per
    unit and per trial is the exception: saved at most every UNIT_SAVE_SECONDS (and at the phase's end), since
    every unit is also a file of its own on the study's storage that a resumed phase reports again, and a trial's
    run key follows from its set; saving the whole manifest each time cost the driver ~15 ms a unit at 1,000."""

    UNIT_SAVE_SECONDS = 5.0

    def __init__(self, path: Path, data: dict[str, Any]) -> None:
        self.path, self.data = path, data
        self._saved_at = 0.0
        self._unsaved = False

    @classmethod
    def create(cls, path: Path, header: dict[str, Any]) -> "Manifest":
        manifest = cls(path, {**header, "sets": [], "phases": {}, "units": {}})
        manifest.save()
        return manifest

    @classmethod
    def load(cls, path: Path) -> "Manifest":
        return cls(path, json.loads(path.read_text()))

    def save(self) -> None:
        write_atomic(self.path, json_by_entry(self.data))
        self._saved_at, self._unsaved = time.monotonic(), False

    def save_units(self, force: bool = False) -> None:
        """Save what was recorded with deferred=True when the last save is old enough."""
        if self._unsaved and (force or time.monotonic() - self._saved_at >= self.UNIT_SAVE_SECONDS):
            self.save()

    def set_sets(self, sets: list[dict[str, Any]]) -> None:
        self.data["sets"] = [{"index": i, "hparams": h} for i, h in enumerate(sets)]
        self.save()

    def add_set(self, hparams: dict[str, Any]) -> int:
        index = len(self.data["sets"])
        self.data["sets"].append({"index": index, "hparams": hparams})
        self.save()
        return index

    def hparams(self, index: int) -> dict[str, Any]:
        return self.data["sets"][index]["hparams"]

    def set_phase(self, phase: str, deferred: bool = False, **info: Any) -> None:
        self.data["phases"].setdefault(phase, {}).update(info)
        self._unsaved = True
        self.save_units(force=not deferred)

    def record_unit(self, phase: str, set_index: int, ordering: int, record: dict[str, Any],
                    deferred: bool = False) -> None:
        self.data["units"][f"{phase}/{set_index}/{ordering}"] = record
        self._unsaved = True
        self.save_units(force=not deferred)

    def clear_units(self, phase: str) -> None:
        """A fresh run of a phase starts without the units of the previous one."""
        self.data["units"] = {k: u for k, u in self.data["units"].items() if not k.startswith(f"{phase}/")}
        self.save()

    def units(self, phase: str) -> list[dict[str, Any]]:
        return [u for key, u in sorted(self.data["units"].items()) if key.startswith(f"{phase}/")]


def full_units(root: Path, phase: str, attempt: str, recorded: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A phase's units with everything their trials wrote: the manifest keeps a slim record of each (`recorded`),
    its unit file (units/<phase>-<attempt>/<unit_file>.json; set007-o2.json when older than that field) adds
    the accuracy matrix and the task seconds. A unit whose file is missing stays as the manifest has it; a file
    of a sampled set the manifest has not recorded yet (a study stopped before saving it) is added."""
    folder = Path(root) / "units" / f"{phase}-{attempt}"
    units: dict[tuple[int, int], dict[str, Any]] = {}
    for unit in recorded:
        key = (int(unit["set_index"]), int(unit["ordering"]))
        path = folder / f"{unit.get('unit_file') or f'set{key[0]:03d}-o{key[1]}'}.json"
        record = json.loads(path.read_text()) if path.is_file() else {}
        # the manifest's values win: it knows the set, and when the driver received the unit (a unit reused
        # from another set's file keeps that set's finished_at in the file)
        units[key] = {**record, **unit, "set_index": key[0], "ordering": key[1]}
    for path in sorted(folder.glob("set*-o*.json")) if folder.is_dir() else []:
        record = json.loads(path.read_text())
        key = (int(record["set_index"]), int(record["ordering"]))
        if key[0] >= 0 and key not in units:
            units[key] = record
    return list(units.values())


def write_best(path: Path, best: dict[str, Any]) -> None:
    write_atomic(path, yaml.safe_dump(best, sort_keys=False))


def read_best(path: Path) -> dict[str, Any]:
    data = yaml.safe_load(Path(path).read_text())
    if not isinstance(data, dict) or "hparams" not in data or "algorithm" not in data:
        raise ValueError(f"{path} is not a gtep best.yaml (it needs 'algorithm' and 'hparams')")
    return data
