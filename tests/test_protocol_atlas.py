"""benchmarks/protocol_atlas.py (issue 49, item 3) without running a study: its table and verdict from hand-made
study results, and the table docs/tuning-protocols.md shows is the one the stored results give."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.helpers import benchmark_imports

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def atlas():
    with benchmark_imports():
        import protocol_atlas

        yield protocol_atlas


def study(name: str, best_rank: int, rows: dict[str, tuple[float, float]], tau: float = 0.5) -> dict:
    """A stored study: per protocol (regret, compute fraction); full GTEP's regret is rows['gtep (full)']."""
    return {"study": name, "ranking": {"kendall_tau": tau, "spearman_rho": tau + 0.1, "best_rank": best_rank,
                                       "regret": rows["gtep (full)"][0]},
            "protocols": [{"protocol": p, "options": "k=1" if p == "first_task" else "", "regret": r,
                           "fraction": f} for p, (r, f) in rows.items()]}


def test_a_shortcut_within_1_point_at_04_in_9_of_10_studies_passes_and_one_at_08_does_not(atlas):
    def rows(cheap_regret: float) -> dict[str, tuple[float, float]]:
        return {"gtep (full)": (0.02, 1.0), "conventional": (0.0, 1.0), "random": (0.05, 0.0),
                "first_task": (cheap_regret, 0.3), "asha": (0.02, 0.8)}

    results = [study(f"s{i}", 2, rows(0.025)) for i in range(9)] + [study("s9", 1, rows(0.06))]
    table = {r["protocol"]: r for r in atlas.summary(results)}
    cheap = table["first_task (k=1)"]
    assert cheap["within_1_point"] == cheap["safe_and_cheap"] == pytest.approx(0.9)
    assert cheap["median_regret"] == pytest.approx(2.5) and cheap["worst_regret"] == pytest.approx(6.0)
    assert table["asha ()"]["within_1_point"] == 1.0 and table["asha ()"]["safe_and_cheap"] == 0.0
    verdict = atlas.verdict(atlas.summary(results), len(results))
    assert verdict.endswith("10 studies: first_task (k=1)")
    worse = results[:8] + [study("s8", 1, rows(0.06)), study("s9", 1, rows(0.06))]
    assert atlas.verdict(atlas.summary(worse), 10).startswith("no protocol")


def test_a_protocol_that_does_not_apply_to_every_study_cannot_pass_and_the_premise_is_summarised(atlas):
    applies = {"gtep (full)": (0.0, 1.0), "first_task": (0.0, 0.2)}
    missing = {"gtep (full)": (0.0, 1.0), "first_task": (float("nan"), 0.2)}
    results = [study("a", 1, applies, tau=1.0), study("b", 3, missing, tau=-0.2)]
    table = atlas.summary(results)
    assert next(r for r in table if r["protocol"] == "first_task (k=1)")["studies"] == 1
    assert atlas.verdict(table, 2).startswith("no protocol")
    assert atlas.verdict_where_it_applies(table, 2) == ("among the studies it applies to, first_task (k=1) "
                                                        "(1 study) reaches the bar")
    premise = atlas.premise(results)
    assert premise["median_kendall_tau"] == pytest.approx(0.4) and premise["lowest_kendall_tau"] == -0.2
    assert premise["h_star_best"] == 0.5 and premise["h_star_rank_median"] == 2


def test_the_docs_show_the_table_of_the_stored_studies(atlas):
    results = atlas.stored()
    assert results, "benchmarks/results/protocol_atlas/ holds the atlas's studies"
    docs = (ROOT / "docs" / "tuning-protocols.md").read_text()
    shown = re.search(r"<!-- atlas-table -->\n(.*?)\n<!-- /atlas-table -->", docs, re.S)
    assert shown, "docs/tuning-protocols.md marks the atlas table with <!-- atlas-table --> ... <!-- /atlas-table -->"
    assert shown.group(1).strip() == atlas.markdown(results).strip(), (
        "the docs table differs from the stored studies: paste `protocol_atlas.py --markdown` between the markers")
    verdict = atlas.verdict(atlas.summary(results), len(results))
    readme = (ROOT / "README.md").read_text()
    assert verdict.replace("H*", "H\\*") in readme.replace("\n", " "), "README states the atlas's verdict"
