"""paper_scale.py's overhead breakdown, on events whose times are known: each part is the span its events bound,
a cell's parts add up to its wall time, and the slot parts to the slot time its phases' units ran."""
import json

import pytest

from tests.helpers import benchmark_imports


@pytest.fixture(scope="module")
def paper_scale():
    with benchmark_imports():  # paper_scale.py imports its neighbours (its learners' profiles)
        import paper_scale

        yield paper_scale


def event(time, name, phase, **extra):
    return json.dumps({"time": time, "event": name, "phase": phase, **extra})


def test_each_part_is_the_span_its_events_bound(paper_scale, tmp_path):
    root = tmp_path / "matrix"
    (root / "c1").mkdir(parents=True)
    (root / "matrix.json").write_text(json.dumps({"cells": {"c1": {"started_at": 100.0, "finished_at": 140.0}}}))
    lines = [
        event(105.0, "phase_started", "tune", pid=1),
        # the first trial's worker process started at 106, its trial at 107.5 (the second trial's came later)
        event(107.5, "trial_started", "tune", pid=10, set_index=0, process_started=106.0),
        event(108.5, "trial_started", "tune", pid=11, set_index=1, process_started=106.2),
        # two trial processes (slots), two sets: set 0 in pid 10 (two units), set 1 in pid 11, then set 2 in pid 10
        event(108.0, "unit_started", "tune", pid=10, set_index=0, ordering=0),
        event(109.0, "unit_trained", "tune", pid=10, set_index=0, ordering=0, train_seconds=0.5),
        event(109.5, "unit_started", "tune", pid=10, set_index=0, ordering=1),
        event(110.0, "unit_trained", "tune", pid=10, set_index=0, ordering=1, train_seconds=0.5),
        event(109.0, "unit_started", "tune", pid=11, set_index=1, ordering=0),
        event(111.0, "unit_trained", "tune", pid=11, set_index=1, ordering=0, train_seconds=1.0),
        event(112.0, "unit_started", "tune", pid=10, set_index=2, ordering=0),
        event(113.0, "unit_trained", "tune", pid=10, set_index=2, ordering=0, train_seconds=1.0),
        event(115.0, "phase_trials_done", "tune", pid=1),
        event(120.0, "phase_writes_done", "tune", pid=1),
        event(121.0, "phase_finished", "tune", pid=1),
        event(122.0, "phase_started", "evaluate", pid=1),
        event(130.0, "unit_started", "evaluate", pid=12, set_index=2, ordering=0),
        event(131.0, "unit_trained", "evaluate", pid=12, set_index=2, ordering=0, train_seconds=1.0),
        event(132.0, "phase_trials_done", "evaluate", pid=1),
        event(135.0, "phase_writes_done", "evaluate", pid=1),
        event(136.0, "phase_finished", "evaluate", pid=1),
    ]
    (root / "c1" / "events.jsonl").write_text("\n".join(lines) + "\n")
    found = paper_scale.overhead_breakdown(root, slots=2)
    cell = {name: part["s"] for name, part in found["cell_parts"].items()}
    # tune: setup 105 -> 106, process 106 -> 107.5, trial 107.5 -> 108; evaluate (no trial event): all setup
    assert cell == {"cell_start": 5.0, "phase_setup": 1.0 + 8.0, "trial_process": 1.5, "trial_setup": 0.5,
                    "phase_units": 5.0 + 1.0, "phase_tail": 2.0 + 1.0, "phase_writes": 5.0 + 3.0,
                    "phase_finish": 1.0 + 1.0, "between_phases": 1.0, "cell_end": 4.0}
    assert sum(cell.values()) == pytest.approx(found["cells_wall_s"]) == 40.0
    assert found["largest_cell_part"] == "phase_setup" and found["units"] == 5
    slot = {name: part["s"] for name, part in found["slot_parts"].items()}
    assert slot["unit_train"] == 4.0 and slot["unit_other"] == 0.5 + 0.0 + 1.0 + 0.0 + 0.0  # beyond train_seconds, unit by unit
    assert slot["between_units"] == 0.5 and slot["between_trials"] == 2.0
    assert sum(slot.values()) == pytest.approx(2 * (5.0 + 1.0))  # the slots' time while the phases' units ran
    assert found["slot_parts"]["unit_train"]["ms_per_unit"] == pytest.approx(800.0)
