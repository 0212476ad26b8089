"""benchmarks/fusion_drift.py's stored result (benchmarks/results/fusion_drift.json) and what docs/configuration.md
says of it: a fused run of the default study's task 1 drifts from the plain run no more than a plain run with another
thread count does, epoch by epoch, and the docs' figures are the file's."""
from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULT = json.loads((ROOT / "benchmarks" / "results" / "fusion_drift.json").read_text())
DOCS = (ROOT / "docs" / "configuration.md").read_text()
FACTOR = 1.5  # how far the fused drift may stand above the rounding control's and still be rounding


def stated(name: str) -> str:
    match = re.search(rf"<!-- drift:{name} -->(.*?)<!-- /drift -->", DOCS, re.S)
    assert match, f"docs/configuration.md has no drift:{name} figure"
    return " ".join(match.group(1).split())


def test_the_fused_run_drifts_no_more_than_the_rounding_control_epoch_by_epoch():
    assert RESULT["task1_epochs"] == 20 and all(RESULT["plain_reproduces_itself"])
    for control, fused in zip(RESULT["drift"]["control"], RESULT["drift"]["fused"]):
        assert len(control) == len(fused) == RESULT["task1_epochs"]
        assert all(f <= FACTOR * c for c, f in zip(control, fused)), (control, fused)
    counts = {name: [row["images_trained"] for row in rows] for name, rows in RESULT["outcomes"].items()}
    assert counts["fused"] == counts["plain"] == counts["control"], "the fused run counts the same images"


def test_the_docs_state_the_stored_figures():
    last = {name: " and ".join(f"{rows[-1]:.3f}" for rows in RESULT["drift"][name]) for name in ("control", "fused")}
    assert stated("control") == last["control"] and stated("fused") == last["fused"]
    task1 = {name: [row["task1_acc"] for row in rows] for name, rows in RESULT["outcomes"].items()}
    moved = max(abs(a - b) for name in ("control", "fused") for a, b in zip(task1[name], task1["plain"]))
    assert stated("points") == f"{round(100 * moved):d}"
