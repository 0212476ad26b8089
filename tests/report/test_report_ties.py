"""The reports' rankings treat scores within the tie tolerance as ties (issue 68, item 1): two algorithms whose
harmonic means differ only by summation order share a rank, are listed by name, and give the tau of an exact tie;
a protocol table lists tied evaluation scores in the frame's order, not in the order rounding chose."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from gtep.protocol.phases import EVALUATE, TUNE
from gtep.reporting.protocols import PROTOCOL_COLUMNS, protocol_table
from gtep.reporting.summary import gaps, rankings

UP, DOWN = float(np.mean([0.1, 0.2, 0.3])), float(np.mean([0.3, 0.2, 0.1]))  # one number, two floats


def summary(tuning: dict[str, float], evaluation: dict[str, float]) -> pd.DataFrame:
    """Per algorithm and phase, Acc = AvgAcc = HM = the given score (a harmonic mean of two equal numbers)."""
    rows = [{"scenario": "s", "pairing": "p", "label": label, "phase": phase, "acc": v, "avg_acc": v, "hmean": v}
            for phase, scores in ((TUNE.name, tuning), (EVALUATE.name, evaluation)) for label, v in scores.items()]
    return pd.DataFrame(rows)


@pytest.mark.parametrize("a,b", [(UP, DOWN), (DOWN, UP)], ids=["a-rounded-up", "b-rounded-up"])
def test_algorithms_tied_by_summation_order_share_a_rank_and_the_exact_ties_tau(a, b):
    near = summary({"a": a, "b": b, "c": 0.1}, {"a": 0.5, "b": 0.6, "c": 0.2})
    exact = summary({"a": UP, "b": UP, "c": 0.1}, {"a": 0.5, "b": 0.6, "c": 0.2})
    ranks = gaps(near).set_index("label")["rank_tuning"].to_dict()
    assert ranks == {"a": 1, "b": 1, "c": 3} == gaps(exact).set_index("label")["rank_tuning"].to_dict()
    ranked, reference = rankings(near).set_index("metric"), rankings(exact).set_index("metric")
    assert ranked.at["hmean", "order_tuning"] == "a > b > c"  # tied: by label, whatever rounding favoured
    assert ranked.at["hmean", "tau"] == reference.at["hmean", "tau"] == pytest.approx(2 / math.sqrt(2 * 3))


def test_a_protocol_table_keeps_tied_evaluation_scores_in_the_frames_order():
    def row(protocol: str, score: float) -> dict:
        return {**dict.fromkeys(PROTOCOL_COLUMNS, math.nan), "scenario": "s", "pairing": "p", "algorithm": "icarl",
                "label": "icarl", "study": protocol, "protocol": protocol, "evaluation_score": score}

    for first, second in ((UP, DOWN), (DOWN, UP)):
        frame = pd.DataFrame([row("gtep", 0.3), row("first_task (k=1)", first), row("gtep + asha", second),
                              row("first_task (k=2)", 0.9)])
        shown = list(protocol_table(frame).index)
        assert shown == ["icarl: gtep", "icarl: first_task (k=2)", "icarl: first_task (k=1)", "icarl: gtep + asha"]
