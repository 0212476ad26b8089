"""Unit files of sets an adaptive searcher suggests (optuna-tpe, optuna-random): such a trial has no set index,
so its values name its units. Before, every such trial wrote and re-read `set-01-o<s>.json`, and each set after
the first silently reused the first set's results. Here: different values never share a unit, the same values
do (and cost once), and the study reads each unit back under the set the driver gave it."""
from __future__ import annotations

import json

from gtep.orchestration.study import full_units
from gtep.orchestration.trainable import unit_name
from gtep.protocol.replay import spent_seconds

LOW, HIGH = {"lr": 0.001, "epochs": 40}, {"lr": 0.2, "epochs": 40}


def test_suggested_sets_are_named_by_their_values():
    assert unit_name(-1, LOW, 0) != unit_name(-1, HIGH, 0)
    assert unit_name(-1, LOW, 0) == unit_name(-1, {"epochs": 40, "lr": 0.001}, 0)  # key order does not matter
    assert unit_name(-1, LOW, 0) != unit_name(-1, LOW, 1)
    assert unit_name(3, LOW, 2) == "set003-o2"  # sets sampled up front keep their names


def test_units_are_read_back_under_the_set_the_manifest_gave_them(tmp_path):
    folder = tmp_path / "units" / "tune-a1"
    folder.mkdir(parents=True)
    names = {0: unit_name(-1, LOW, 0), 1: unit_name(-1, HIGH, 0), 2: unit_name(-1, LOW, 0)}  # set 2 repeats set 0
    for values, seconds in ((LOW, 5.0), (HIGH, 7.0)):
        record = {"set_index": -1, "ordering": 0, "task_seconds": [seconds], "acc_matrix": [[seconds / 10]]}
        (folder / f"{unit_name(-1, values, 0)}.json").write_text(json.dumps(record))
    recorded = [{"set_index": i, "ordering": 0, "unit_file": name, "train_seconds": 99.0} for i, name in names.items()]
    units = {u["set_index"]: u for u in full_units(tmp_path, "tune", "a1", recorded)}
    assert set(units) == {0, 1, 2}  # no unit of set -1
    assert units[0]["task_seconds"] == [5.0] and units[1]["task_seconds"] == [7.0] and units[2]["task_seconds"] == [5.0]
    assert spent_seconds(list(units.values())) == 12.0  # the repeated values trained once


def test_a_study_older_than_unit_file_names_reads_set_files(tmp_path):
    folder = tmp_path / "units" / "tune-a1"
    folder.mkdir(parents=True)
    (folder / "set000-o0.json").write_text(json.dumps({"set_index": 0, "ordering": 0, "task_seconds": [3.0]}))
    (folder / "set001-o0.json").write_text(json.dumps({"set_index": 1, "ordering": 0, "task_seconds": [4.0]}))
    units = full_units(tmp_path, "tune", "a1", [{"set_index": 0, "ordering": 0, "train_seconds": 3.0}])
    assert sorted((u["set_index"], u["task_seconds"][0]) for u in units) == [(0, 3.0), (1, 4.0)]
