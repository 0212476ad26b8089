"""benchmarks/protocol_atlas.py (issues 49 and 60) without running a study: its table and verdict from hand-made
study results; the tables docs/tuning-protocols.md shows are the ones the stored results give, and every cell of
them is recomputed from the stored raw results alone by tests/atlas_recompute.py, which imports nothing of gtep."""
from __future__ import annotations

import json
import math
import random
import re
from fractions import Fraction
from pathlib import Path

import pytest

from tests import atlas_recompute as recompute
from tests.helpers import benchmark_imports

ROOT = Path(__file__).resolve().parents[2]


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
    missing = {"gtep (full)": (0.0, 1.0), "first_task": (float("nan"), float("nan"))}  # not applicable
    results = [study("a", 1, applies, tau=1.0), study("b", 3, missing, tau=-0.2)]
    table = atlas.summary(results)
    assert next(r for r in table if r["protocol"] == "first_task (k=1)")["studies"] == 1
    assert atlas.verdict(table, 2).startswith("no protocol")
    assert atlas.verdict_where_it_applies(table, 2) == ("among the studies it applies to, first_task (k=1) "
                                                        "(1 study) reaches the bar")
    premise = atlas.premise(results)
    assert premise["median_kendall_tau"] == pytest.approx(0.4) and premise["lowest_kendall_tau"] == -0.2
    assert premise["h_star_best"] == 0.5 and premise["h_star_rank_median"] == 2


def test_a_tie_is_counted_among_a_protocols_studies_but_never_within_1_point(atlas):
    tie = study("t", 1, {"gtep (full)": (0.0, 1.0), "first_task": (float("nan"), 0.1)})
    tie["protocols"][1]["tied"] = 4
    picked = study("p", 1, {"gtep (full)": (0.0, 1.0), "first_task": (0.002, 0.1)})
    row = next(r for r in atlas.summary([tie, picked]) if r["protocol"] == "first_task (k=1)")
    assert row["studies"] == 2 and row["ties"] == 1 and row["within_1_point"] == 0.5
    assert row["median_regret"] == pytest.approx(0.2) and row["safe_and_cheap"] == 0.5


def docs_block(name: str) -> str:
    docs = (ROOT / "docs" / "tuning-protocols.md").read_text()
    shown = re.search(rf"<!-- atlas-table {name} -->\n(.*?)\n<!-- /atlas-table {name} -->", docs, re.S)
    assert shown, (f"docs/tuning-protocols.md marks the {name} table with <!-- atlas-table {name} --> ... "
                   f"<!-- /atlas-table {name} -->")
    return shown.group(1).strip()


def test_the_docs_show_the_tables_of_the_stored_studies(atlas):
    assert atlas.legacy(), "benchmarks/results/protocol_atlas/legacy/ holds the first atlas's studies"
    for block in atlas.BLOCKS:
        assert docs_block(block) == atlas.markdown(atlas.stored(block), block).strip(), (
            f"the docs' {block} table differs from the stored studies: paste `protocol_atlas.py --markdown`")
    assert docs_block("legacy") == atlas.markdown(atlas.legacy()).strip()
    readme = " ".join((ROOT / "README.md").read_text().split())
    for block in atlas.BLOCKS:
        results = atlas.stored(block)
        if results:
            verdict = atlas.verdict(atlas.summary(results), len(results)).replace("H*", "H\\*")
            assert verdict in readme, f"README states the {block} block's verdict"


def test_what_changes_between_the_blocks_is_their_tables_and_the_docs_claims_hold(atlas):
    """The comparison table is printed from the stored studies, each cell is the one the block's own table shows
    (whose cells are recomputed from the raw results), and the sentence above it stays true of the data: every
    stopping rule spends less at R = 30, S = 5 and is within 1 point at least as often, and none is within 1 point at
    <= 0.4 of the compute at R = 6, S = 3 while at R = 30, S = 5 some are, in at most a quarter of the studies."""
    by_block = {block: atlas.stored(block) for block in atlas.BLOCKS}
    assert docs_block("change") == atlas.comparison(by_block).strip()
    compared = shown_rows("change")
    blocks = {block: shown_rows(block) for block in ("r6s3", "paper")}
    assert compared, "the comparison table has rows"
    for protocol, cells in compared.items():
        for block, (compute, within, cheap) in zip(blocks, (cells[0:3], cells[3:6])):
            row = blocks[block].get(protocol)
            if row is None:
                assert (compute, within, cheap) == ("-", "-", "-")
                continue
            studies, _, _, _, share, median_compute, least, at_04 = row
            assert (compute, within, cheap) == (f"{median_compute} ({least})", f"{share} of {studies}", at_04)
    rules = [p for p in compared if p.startswith(("asha", "optuna-"))]
    assert len(rules) == 5

    def lead(shown: str) -> float:  # a shown cell's leading figure: '0.79 (0.44)', '75 % of 12', '12 %'
        return float(shown.split()[0])

    for protocol in rules:
        small, paper = compared[protocol][:3], compared[protocol][3:]
        assert lead(paper[0]) < lead(small[0]), f"{protocol} spends less at R = 30, S = 5"
        assert lead(paper[1]) >= lead(small[1]), f"{protocol} is within 1 point as often at R = 30, S = 5"
        assert small[2] == "0 %", f"{protocol} is never within 1 point at <= 0.4 of the compute at R = 6, S = 3"
        assert lead(paper[2]) <= 25, f"{protocol} is within 1 point at <= 0.4 in at most a quarter"
    assert any(lead(compared[p][5]) > 0 for p in rules), "some stopping rule gets there at R = 30, S = 5"


def shown_rows(block: str) -> dict[str, list[str]]:
    rows = {}
    for line in docs_block(block).splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and cells[0] not in ("protocol", "---"):
            rows[cells[0]] = cells[1:]
    return rows


@pytest.mark.parametrize("block", ["r6s3", "paper"])
def test_every_cell_of_the_docs_table_is_recomputed_from_the_raw_results_alone(block):
    """tests/atlas_recompute.py recomputes each study's picks, compute, regret, ties and least possible compute
    from its raw results, then the block's table, and every cell must be the one the docs print."""
    results = recompute.stored(block)
    shown = shown_rows(block)
    if not results:
        assert not shown, f"the docs show a {block} table but no study of the block has raw results stored"
        return
    assert shown == recompute.table(results)
    premise = recompute.premise(results)
    text = " ".join(docs_block(block).split())
    if premise:
        studies = f"{premise['studies']} {'study' if premise['studies'] == 1 else 'studies'}"
        assert (f"Over the {studies}, Kendall's tau between the sets' tuning and evaluation scores "
                f"has median {premise['tau']:.2f} (lowest {premise['lowest']:.2f}) and Spearman's rho median "
                f"{premise['rho']:.2f}; H\\* is the best set on D^E in {premise['best']:.0f} % of them (median rank "
                f"{premise['rank']:g} of {results[0]['trials']}) and {premise['regret']:.2f} points (median) "
                "below the best set.") in text


def test_the_recomputation_imports_nothing_of_gtep():
    source = (ROOT / "tests" / "atlas_recompute.py").read_text()
    assert not re.search(r"^\s*(from|import) (gtep|benchmarks|protocol_atlas)", source, re.M)


def test_every_stored_file_is_standard_json():
    def refuse(constant: str) -> None:
        raise ValueError(f"{constant} is not JSON")

    paths = sorted((ROOT / "benchmarks" / "results" / "protocol_atlas").rglob("*.json"))
    assert paths
    for path in paths:
        json.loads(path.read_text(), parse_constant=refuse)


def test_a_diverged_units_nan_score_is_stored_as_null_with_the_reason_and_derives_the_same(atlas):
    """A diverged unit has NaN scores (paper-ci-bic-5x3-low's tuning had six): stored, they are null with the
    reason beside them, and the rows derived from the stored file are the ones derived before storing."""
    unit = {"set_index": 3, "ordering": 1, "status": "diverged", "acc": math.nan, "avg_acc": math.nan,
            "train_seconds": 2.5, "first_task": "reused"}
    stored = json.loads(atlas.dump({"unit": atlas.kept(unit, ("acc", "avg_acc"))}))["unit"]
    assert stored["acc"] is None and stored["avg_acc"] is None and stored["train_seconds"] == 2.5
    assert stored["nulls"] == {"acc": "no score: the unit's status is 'diverged'",
                               "avg_acc": "no score: the unit's status is 'diverged'"}
    assert atlas.kept({**unit, "status": "finished", "acc": 0.5, "avg_acc": 0.6}, ("acc", "avg_acc")) == {
        **unit, "status": "finished", "acc": 0.5, "avg_acc": 0.6}  # finite scores: nothing added
    raw = synthetic_raw(3)
    for u in raw["tuning"]:
        if u["set_index"] == 2 and u["ordering"] == 0:
            u.update(status="diverged", acc=math.nan, avg_acc=math.nan)
    raw["tuning"] = [atlas.kept(u, ("acc", "avg_acc")) | {"arrival": u["arrival"]} for u in raw["tuning"]]
    raw["best_index"] = recompute.pick(recompute.scores_of(raw, raw["tuning"]))[0]
    assert raw["best_index"] != 2  # a set that diverged on an ordering is never H*
    assert atlas.dump(atlas.derive(json.loads(atlas.dump(raw)))) == atlas.dump(atlas.derive(raw))


def synthetic_raw(seed: int, sets: int = 6, orderings: int = 3, tasks: int = 3, groups: int = 2) -> dict:
    """A study's raw results by hand: sets in `groups` sharing their first task (the same task-1 accuracy and
    the unit that trained it; the others reuse it), random later tasks, a diverged evaluation now and then."""
    rng = random.Random(seed)
    tuning, evaluation = [], {}
    for o in range(orderings):
        first = [rng.uniform(0.3, 0.6) for _ in range(groups)]
        for i in range(sets):
            g = i % groups
            matrix = [[first[g], None, None][:tasks]] + [
                [rng.uniform(0.05, 0.5) for _ in range(t + 1)] + [None] * (tasks - t - 1) for t in range(1, tasks)]
            counts = [50] * tasks
            acc_t = [sum(m * c for m, c in zip(row[:t + 1], counts)) / sum(counts[:t + 1])
                     for t, row in enumerate(matrix)]
            tuning.append({"set_index": i, "ordering": o, "status": "finished", "acc": acc_t[-1],
                           "avg_acc": sum(acc_t) / tasks, "acc_matrix": matrix, "test_counts": counts,
                           "task_seconds": [rng.uniform(1, 3) for _ in range(tasks)],
                           "first_task": "trained" if i < groups else "reused", "unit_file": f"set{i:03d}-o{o}",
                           "finished_at": rng.random()})
    for n, unit in enumerate(sorted(tuning, key=lambda u: (u["finished_at"], u["set_index"], u["ordering"]))):
        unit["arrival"] = n
    for i in range(sets):
        units = [{"set_index": i, "ordering": o, "acc": rng.uniform(0.1, 0.4), "avg_acc": rng.uniform(0.2, 0.5),
                  "status": "diverged" if rng.random() < 0.05 else "finished"} for o in range(orderings)]
        finished = [u for u in units if u["status"] == "finished"]
        summary = {"diverged": len(units) - len(finished),
                   **{c: (sum(u[c] for u in units) / len(units) if len(finished) == len(units) else None)
                      for c in ("acc", "avg_acc")}}
        evaluation[str(i)] = {"units": units, "summary": summary}
    return {"criterion": "hmean_acc_avgacc", "components": ["acc", "avg_acc"], "combine": "harmonic_mean",
            "selection": "hmean_of_means", "orderings": orderings, "tasks": tasks, "sets": list(range(sets)),
            "best_index": None, "tuning": tuning, "evaluation": evaluation}


@pytest.mark.parametrize("seed", range(6))
def test_the_independent_recomputation_agrees_with_gtep_on_hand_made_studies(atlas, seed):
    """The two implementations (gtep's replay code through the atlas's derive, and tests/atlas_recompute.py) agree
    row by row on studies with shared first tasks (so first_task k = 1 ties), reuse and divergence."""
    raw = synthetic_raw(seed, sets=6 if seed % 2 else 10, orderings=3 if seed < 3 else 5, tasks=3 + seed % 2)
    raw["best_index"] = recompute.pick(recompute.scores_of(raw, raw["tuning"]))[0]
    derived = atlas.derive(raw)
    result = {"raw": raw, "trials": len(raw["sets"]), **derived}
    ours = recompute.study_rows(result)
    theirs = {atlas.key_of(row): row for row in derived["protocols"]}
    assert set(ours) == {k for k, row in theirs.items() if row["fraction"] is not None}
    for key, row in ours.items():
        assert row["fraction"] == pytest.approx(theirs[key]["fraction"], abs=1e-12), key
        assert row["least"] == pytest.approx(derived["floors"][key], abs=1e-12), key
        if row["regret"] is None:
            assert theirs[key]["regret"] is None and (row["tie"] == (theirs[key]["tied"] > 1)), key
        else:
            assert row["regret"] == pytest.approx(theirs[key]["regret"], abs=1e-12), key
    assert ours["first_task (k=1)"]["tie"], "sets sharing task 1 tie at k = 1"
    ranking = recompute.ranking(result)
    for mine, gteps in (("tau", "kendall_tau"), ("rho", "spearman_rho")):
        value = derived["ranking"][gteps]
        assert (math.isnan(ranking[mine]) and value is None) or ranking[mine] == pytest.approx(value), mine
    assert ranking["rank"] == derived["ranking"]["best_rank"]


def test_the_least_possible_compute_at_r6_s3_is_the_issues(atlas):
    """With equal set costs ASHA and Hyperband cannot go below 8/18 of the compute at R = 6, S = 3, the median
    pruner below 10/18 (2 startup sets finish); at the paper's R = 30, S = 5 the first rung is a fifth of a set."""
    floors = atlas.floors(synthetic_raw(0))
    assert floors["asha (grace 1, reduction 2)"] == pytest.approx(8 / 18)
    assert floors["asha (grace 1, reduction 4)"] == pytest.approx(8 / 18)
    assert floors["optuna-median (defaults)"] == pytest.approx(10 / 18)
    paper = atlas.floors(synthetic_raw(0, sets=30, orderings=5))
    assert paper["asha (grace 1, reduction 4)"] == pytest.approx((5 + 29) / 150)
    assert paper["optuna-median (defaults)"] == pytest.approx((10 + 28) / 150)


def scores_summed(raw: dict, order: str) -> tuple[dict[int, float], dict[int, float]]:
    """Each set's tuning and evaluation score from the stored units, the S values summed in `order`: 'forward'
    (ordering 0 first, as numpy's mean), 'backward' (the last first) or 'exact' (math.fsum, correctly rounded)."""
    def mean(values: list[float]) -> float:
        if order == "exact":
            return math.fsum(values) / len(values)
        return sum(values if order == "forward" else values[::-1]) / len(values)

    def score(units: list[dict]) -> float:
        if any(u["status"] == "diverged" for u in units):
            return math.nan
        return recompute.combine(raw, [mean([float(u[c]) for u in units]) for c in raw["components"]])

    tuning = {int(i): score(sorted((u for u in raw["tuning"] if u["set_index"] == int(i)), key=lambda u: u["ordering"]))
              for i in raw["sets"]}
    evaluation = {int(i): score(sorted(r["units"], key=lambda u: u["ordering"])) for i, r in raw["evaluation"].items()}
    return tuning, evaluation


@pytest.mark.parametrize("order", ["forward", "backward", "exact"])
def test_the_iirc_finetune_tau_in_any_summation_order_is_the_stored_one(order):
    """Issue 68: sets 0 and 1 of atlas-iirc-iirc_finetune have mathematically equal tuning scores that differ in
    the 17th digit when summed forward (0.14503296703296706 against ...703); their tie decided by rounding gave a
    stored tau of 0.467 where another order gives 0.414. Summed in any order, the recomputed tau and rho are the
    stored ones."""
    result = json.loads((ROOT / "benchmarks" / "results" / "protocol_atlas" /
                         "atlas-iirc-iirc_finetune.json").read_text())
    tuning, evaluation = scores_summed(result["raw"], order)
    if order == "forward":
        assert tuning[0] != tuning[1], "summed forward, the two sets' scores are different floats"
    both = [i for i in sorted(evaluation) if not math.isnan(tuning[i]) and not math.isnan(evaluation[i])]
    x, y = [tuning[i] for i in both], [evaluation[i] for i in both]
    stored = result["ranking"]
    assert recompute.kendall_tau_b(x, y) == pytest.approx(stored["kendall_tau"], abs=1e-12)
    assert recompute.spearman_rho(x, y) == pytest.approx(stored["spearman_rho"], abs=1e-12)
    assert round(stored["kendall_tau"], 3) == 0.414


def exact_score(units: list[dict]) -> Fraction:
    """A set's harmonic mean of mean Acc and mean AvgAcc in exact arithmetic: each accuracy-matrix entry is the
    float32 quotient correct / count, so round(entry x count) / count is the exact fraction it rounds."""
    accs, avgs = [], []
    for u in units:
        counts, acc_t = u["test_counts"], []
        for t, row in enumerate(u["acc_matrix"]):
            correct = sum(Fraction(round(row[j] * counts[j])) for j in range(t + 1))
            acc_t.append(correct / sum(counts[: t + 1]))
        accs.append(acc_t[-1])
        avgs.append(sum(acc_t) / len(acc_t))
    a, b = sum(accs) / len(accs), sum(avgs) / len(avgs)
    return 2 * a * b / (a + b) if a + b else Fraction(0)


def test_the_tie_tolerance_ties_exactly_the_stored_scores_that_are_equal_in_exact_arithmetic():
    """The tolerance (gtep/protocol/ties.py) against the stored atlas: every pair of sets whose scores (as gtep
    computes them, in floats) are within it is equal when recomputed exactly from the accuracy matrices, and every
    pair that is equal there is within it; the stored pairs that really differ are 2.5e-5 apart or more."""
    from gtep.protocol.ties import same_score

    checked = tied = 0
    for path in sorted((ROOT / "benchmarks" / "results" / "protocol_atlas").glob("*.json")):
        raw = json.loads(path.read_text()).get("raw")
        if not raw or raw["criterion"] != "hmean_acc_avgacc":
            continue
        tuning, evaluation = recompute.scores_of(raw, raw["tuning"]), recompute.evaluation_scores(raw)
        for phase, scores in (("tuning", tuning), ("evaluation", evaluation)):
            units = {i: ([u for u in raw["tuning"] if u["set_index"] == i] if phase == "tuning"
                         else raw["evaluation"][str(i)]["units"]) for i in scores}
            finite = sorted(i for i, s in scores.items() if not math.isnan(s)
                            and all(u.get("acc_matrix") for u in units[i]))
            exact = {i: exact_score(units[i]) for i in finite}
            for n, i in enumerate(finite):
                for j in finite[n + 1:]:
                    assert same_score(scores[i], scores[j]) == (exact[i] == exact[j]), (path.name, phase, i, j)
                    checked += 1
                    tied += scores[i] != scores[j] and exact[i] == exact[j]
    assert checked > 1000 and tied >= 10  # the pairs that rounding alone set apart
