"""Every set evaluated (issue 49), the quick parts: the sets' rank agreement between the phases, H*'s rank and regret,
each protocol's row of the regret table (gtep/protocol/regret.py), and the options refused before any compute."""
from __future__ import annotations

import math

import numpy as np
import pytest
from typer.testing import CliRunner

from gtep.cli import app
from gtep.config import ConfigError, validate_config
from gtep.protocol.regret import protocol_rows, rank_sets, spearman_rho
from tests.orchestration.test_phases import config
from tests.protocol.test_cheap_tuning import study

# four sets over S=2 orderings of a 3-task scenario; set 0 tunes best, set 1 evaluates best, set 3 diverged on D^E
TUNING = {0: [0.6, 0.6], 1: [0.5, 0.5], 2: [0.4, 0.4], 3: [0.3, 0.3]}
EVALUATION = {0: 0.40, 1: 0.55, 2: 0.30, 3: math.nan}


def by_protocol(rows) -> dict[tuple[str, str], object]:
    return {(r.protocol, r.options): r for r in rows}


def test_spearman_rho_matches_scipy_with_ties_and_drops_nan_pairs():
    from scipy.stats import spearmanr

    rng = np.random.default_rng(0)
    for _ in range(20):
        x, y = rng.integers(0, 4, 9).astype(float), rng.integers(0, 4, 9).astype(float)  # many ties
        if len(set(x)) > 1 and len(set(y)) > 1:
            assert spearman_rho(x, y) == pytest.approx(spearmanr(x, y).statistic)
    assert spearman_rho([1, 2, math.nan, 3], [3, 2, 1, 1]) == pytest.approx(spearman_rho([1, 2, 3], [3, 2, 1]))
    assert math.isnan(spearman_rho([1, 1, 1], [1, 2, 3]))  # a constant side has no ranking


def test_rank_sets_leaves_diverged_sets_out_and_gives_h_star_rank_and_regret():
    tuning = {i: v[0] for i, v in TUNING.items()}
    ranking = rank_sets(tuning, EVALUATION, best_index=0)
    assert ranking.sets == 4 and ranking.ranked == 3 and ranking.diverged == (3,)
    # over sets 0, 1, 2: tuning orders 0 > 1 > 2, evaluation 1 > 0 > 2: one discordant pair of three
    assert ranking.kendall_tau == pytest.approx(1 / 3)
    assert ranking.spearman_rho == pytest.approx(0.5)
    assert ranking.best_rank == 2 and ranking.regret == pytest.approx(0.15)
    assert rank_sets(tuning, EVALUATION, best_index=1).regret == 0.0
    diverged = rank_sets(tuning, EVALUATION, best_index=3)  # H* that diverged on D^E scores 0: no rank, all lost
    assert diverged.best_rank is None and diverged.regret == pytest.approx(0.55)


def test_the_regret_table_gives_each_protocol_its_pick_compute_and_regret():
    units = study(TUNING)  # sets trained in order, 10 s a unit
    stop_all_but_1 = ("custom", "stops every set but 1", lambda i, k, score: i != 1)
    rows = by_protocol(protocol_rows(units, 2, TUNING, EVALUATION, best_index=0, tasks=3,
                                     stop_rules=[stop_all_but_1]))
    full = rows[("gtep (full)", "R=4, S=2")]
    assert full.picked == 0 and full.fraction == 1.0 and full.regret == pytest.approx(0.15)
    conventional = rows[("conventional", "tuned on D^E")]
    assert conventional.picked == 1 and conventional.regret == 0.0 and "optimistic" in conventional.note
    # ASHA at its first rung keeps only the set ahead of every earlier one: sets 1-3 stop after one ordering
    asha = rows[("asha", "grace 1, reduction 2")]
    assert asha.picked == 0 and asha.fraction == pytest.approx(5 / 8) and asha.regret == pytest.approx(0.15)
    custom = rows[("custom", "stops every set but 1")]
    assert custom.picked == 1 and custom.regret == 0.0 and custom.fraction == pytest.approx(5 / 8)
    assert rows[("first_task", "k=1")].fraction == pytest.approx(1 / 3)
    assert rows[("first_task", "k=2")].fraction == pytest.approx(2 / 3)
    k3 = rows[("first_task", "k=3")]
    assert k3.picked is None and math.isnan(k3.regret) and "not applicable" in k3.note
    floor = rows[("random", "uniform over sets")]  # mean of 0.15, 0, 0.25 and 0.55 (set 3 diverged: scores 0)
    assert floor.fraction == 0.0 and floor.regret == pytest.approx(0.2375)


def test_first_task_rows_are_not_applicable_to_a_family_without_tasks():
    rows = protocol_rows(study(TUNING), 2, TUNING, EVALUATION, tasks=None)
    first = [r for r in rows if r.protocol == "first_task"]
    assert len(first) == 3 and all(r.picked is None and "no tasks" in r.note for r in first)


def test_evaluation_sets_is_best_or_all_and_a_typo_is_one_error_naming_the_field():
    assert validate_config(config(), "test").evaluation.sets == "best"
    assert validate_config(config(evaluation={"sets": "all"}), "test").evaluation.sets == "all"
    with pytest.raises(ConfigError) as err:
        validate_config(config(evaluation={"sets": "every"}), "test")
    assert err.value.field == "evaluation.sets" and "use best" in str(err.value) and "or all" in str(err.value)


@pytest.mark.parametrize("argv, needles", [
    (["evaluate", "--sets", "every"], ("--sets", "use best", "or all")),
    (["replay", ".", "--json", "table.json"], ("--json", "add --table")),
])
def test_bad_every_set_options_exit_2_naming_the_option_and_the_fix(argv, needles, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 2, result.output
    assert all(n in result.output for n in needles) and "Traceback" not in result.output, result.output
    assert not any(tmp_path.iterdir())


def test_a_pick_decided_by_a_tie_is_no_pick_and_the_table_is_standard_json():
    """Issue 60: sets scoring the same (a first task shared at k = 1) make the pick undefined: null regret, the tie
    and the tie rule's would-be pick in the note; the full study keeps its H* and says a tie decided it. NaN is
    written as null with the reason beside it."""
    import json

    from gtep.protocol.regret import json_ready

    tied = {0: [0.5, 0.5], 1: [0.5, 0.5], 2: [0.4, 0.4]}
    rows = by_protocol(protocol_rows(study(tied), 2, [0, 1, 2], {0: 0.3, 1: 0.5, 2: 0.4}, tasks=3))
    full = rows[("gtep (full)", "R=3, S=2")]
    assert full.picked == 0 and full.tied == 2 and "decided by a tie of 2 sets" in full.note
    k1 = rows[("first_task", "k=1")]
    assert k1.picked is None and math.isnan(k1.regret) and k1.tied == 2
    assert k1.note.startswith("undefined: a tie of 2 sets") and "lowest set index" in k1.note
    ranking = rank_sets({0: 0.5, 1: 0.5, 2: 0.5}, {0: 0.3, 1: 0.5, 2: 0.4}, 0)
    document = json_ready({"ranking": ranking.as_dict(), "protocols": [r.as_dict() for r in rows.values()]})
    text = json.dumps(document, allow_nan=False)
    assert document["ranking"]["kendall_tau"] is None
    assert "fewer than two" in document["ranking"]["nulls"]["kendall_tau"]
    k3 = next(r for r in document["protocols"] if r["options"] == "k=3")
    assert k3["regret"] is None and "not applicable" in k3["note"] and "regret" in k3["nulls"]
    assert "NaN" not in text
