"""Choosing what a report reads from the store's runs (frames from gtep.orchestration.report_store).

The store gives every phase, trial and ordering run of the selected studies as rows; this keeps, per (study,
matrix cell, phase label), the latest phase run that ended: FINISHED, or FAILED because its orderings diverged
(the paper shows those as NaN, Tables 7-13 for BEEF), with its trials, orderings and acc_t steps. Nothing is re-run.
"""
from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field

import pandas as pd

from gtep.config import ConfigError
from gtep.orchestration.report_store import CURVE_COLUMNS, GACC_COLUMNS, PREFIX, RunStore
from gtep.protocol.families import FAMILIES
from gtep.protocol.phases import REGRET_FILE, TUNE, fixed_set_phases, phase_named, phases_in_order

NOT_A_RESULT = ("incomplete", "interrupted")  # a phase run's gtep.status when fewer than S orderings finished
LEFT_OUT_COLUMNS = ["experiment", "study", "cell", "phase", "run_id", "scenario", "pairing", "reason", "note"]


@dataclass
class StoreData:
    """What a report reads. `phases`: one row per selected phase run; `trials`: the tuning trials of the selected
    tune phases; `hparams`: their hyperparameter sets, long (trial run, name, value); `orderings`: the ordering runs
    under the selected phases; `steps`: acc_t of the evaluation-like orderings and of H*'s tuning orderings, long
    (run, t, acc), a fraction; `left_out`: the phase runs not reported (incomplete, interrupted, crashed, running)
    that no later usable run of their label replaced, with the reason in `note`; `gacc`: gAcc(alpha) of the selected
    FSCIL phase runs, long (run, k, alpha = k/12, gacc), a fraction; `family_curves`: every other curve of the
    phase runs' family tables (RunStore.family_curves)."""
    phases: pd.DataFrame
    trials: pd.DataFrame
    hparams: pd.DataFrame
    orderings: pd.DataFrame
    steps: pd.DataFrame
    left_out: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=LEFT_OUT_COLUMNS))
    gacc: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=GACC_COLUMNS))
    family_curves: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=CURVE_COLUMNS))
    # evaluate_sets phase run id -> its protocol_regret.json (the set ranking and the protocols' regret table)
    set_evaluations: dict[str, dict] = field(default_factory=dict)


# ---------------------------------------------------------------- the experiments a report names

def match_experiments(known: dict[str, str], selectors: list[str], matrix: str | None) -> dict[str, str]:
    """The study experiments (name -> id) the selectors name: study names (`tiny`), experiment names (`gtep/tiny`)
    or shell globs over either (`gtep/mx-*`). Every selector must match something, so a typo is an error rather
    than a silently smaller report."""
    if not selectors:
        if matrix is None:
            raise ConfigError("SELECTORS", "name at least one study or experiment (e.g. tiny, gtep/tiny, "
                              "'gtep/mx-*'), or --matrix NAME")
        return known
    chosen: dict[str, str] = {}
    for selector in selectors:
        pattern = selector if selector.startswith(PREFIX) else PREFIX + selector
        hits = [name for name in known if fnmatch.fnmatchcase(name, pattern)]
        if not hits:
            listing = ", ".join(sorted(known)[:12]) or "none"
            raise ConfigError("SELECTORS", f"{selector!r} matches no experiment in the store (gtep experiments: "
                              f"{listing}); give a study name, gtep/<study> or a glob such as 'gtep/tiny-*'")
        chosen.update({name: known[name] for name in hits})
    return chosen


# ---------------------------------------------------------------- choosing the phase runs

def usable(phase: pd.Series, trials: pd.DataFrame) -> bool:
    """FINISHED, or FAILED because of divergence: an evaluation with diverged orderings, or a tuning phase whose
    every set diverged (no H* could be selected). A crashed or still running phase is not reported, nor one tagged
    gtep.status=incomplete (fewer than S orderings finished) or interrupted, even when some orderings diverged."""
    if phase.get("status_tag", "") in NOT_A_RESULT:
        return False
    if phase["status"] == "FINISHED":
        return True
    if phase["status"] != "FAILED":
        return False
    if phase["phase"] == TUNE.name:
        own = trials[trials["phase_run_id"] == phase["run_id"]]
        return bool(len(own)) and bool((own["diverged_orderings"].fillna(0) > 0).all())
    return bool(phase["diverged"] > 0)


def latest_phases(phases: pd.DataFrame, trials: pd.DataFrame) -> pd.DataFrame:
    """The latest usable phase run per (study, cell, phase label): a re-run replaces the earlier attempt."""
    if phases.empty:
        return phases
    ok = phases[[usable(row, trials) for _, row in phases.iterrows()]]
    ok = ok.sort_values("start_time", kind="stable")
    latest = ok.groupby(["experiment", "study", "cell", "phase"], as_index=False, sort=False).tail(1)
    return latest.reset_index(drop=True)


def why_left_out(phase: pd.Series) -> str:
    """'incomplete (1/2 orderings)', 'interrupted', 'crashed (FAILED)', 'still running'."""
    tag, orderings = str(phase.get("status_tag", "") or ""), str(phase.get("orderings_tag", "") or "")
    if tag in NOT_A_RESULT:
        return f"{tag} ({orderings} orderings)" if "/" in orderings else tag
    if phase["status"] == "RUNNING":
        return "still running (or stopped without closing its run)"
    if phase["status"] == "KILLED":
        return "stopped (KILLED)"
    return f"crashed ({phase['status']})"


def left_out_phases(phases: pd.DataFrame, chosen: pd.DataFrame) -> pd.DataFrame:
    """The phase runs a report leaves out that matter: unusable ones newer than the run reported for their label
    (or of a label with none), e.g. "evaluate of study X: incomplete (1/2 orderings)". An older failed attempt
    that a later run replaced is not listed."""
    key = ["experiment", "study", "cell", "phase"]
    reported = {tuple(r[k] for k in key): r["start_time"] for _, r in chosen.iterrows()}
    rows = []
    for _, row in phases[~phases["run_id"].isin(chosen["run_id"])].sort_values("start_time").iterrows():
        if row["start_time"] <= reported.get(tuple(row[k] for k in key), -1):
            continue
        reason = why_left_out(row)
        rows.append({**{k: row[k] for k in LEFT_OUT_COLUMNS if k in row and k not in ("reason", "note")},
                     "reason": reason, "note": f"{row['phase']} of study {row['study']}: {reason}"})
    return pd.DataFrame(rows, columns=LEFT_OUT_COLUMNS)


def label_groups(phases: pd.DataFrame) -> pd.DataFrame:
    """Scenario, dataset pairing and similarity of every phase run, taken per (study, cell) so all phases of one
    study land in one paper table: the matrix tags when present; otherwise the increments and
    "<D^HT> → <D^E>" from the tune and evaluate phases' datasets (same dataset split = high similarity)."""
    out = phases.copy()
    scenario, pairing, similarity = [], [], []
    for _, row in out.iterrows():
        mates = out[(out["experiment"] == row["experiment"]) & (out["cell"] == row["cell"])]
        tuned = _first(mates, [p.name for p in phases_in_order() if p.on_tuning_data], "dataset")
        evaluated = _first(mates, [p.name for p in fixed_set_phases() if not p.on_tuning_data], "dataset")
        scenario.append(row["scenario_tag"] or row["increments"])
        pairing.append(row["pairing_tag"] or f"{tuned or '?'} → {evaluated or '?'}")
        derived = "" if not (tuned and evaluated) else "high" if tuned == evaluated else "low"
        similarity.append(row["similarity_tag"] or derived)
    out["scenario"], out["pairing"], out["similarity"] = scenario, pairing, similarity
    return out


def _first(mates: pd.DataFrame, labels: list[str], column: str) -> str:
    for label in labels:
        values = mates.loc[mates["phase"] == label, column]
        if len(values):
            return str(values.iloc[0])
    return ""


def ranks_every_set(phases: pd.DataFrame) -> pd.Series:
    """Which phase runs ranked every tuned set on D^E (their record writes_regret: evaluation.sets: all)."""
    return phases["phase"].map(lambda name: (phase := phase_named(name)) is not None and phase.writes_regret)


# ---------------------------------------------------------------- everything a report needs

def collect(store: RunStore, selectors: list[str], matrix: str | None = None) -> StoreData:
    """Read the selected studies: phase runs (latest usable per label), their trials, orderings and acc_t steps."""
    if matrix is not None and not matrix.replace("-", "").replace("_", "").replace(".", "").isalnum():
        raise ConfigError("--matrix", f"{matrix!r} is not a matrix name (letters, digits, '-', '_', '.')")
    experiments = match_experiments(store.study_experiments(), selectors, matrix)
    ids = sorted(experiments.values())
    phases = store.phase_runs(experiments, matrix)
    if phases.empty and matrix is not None and not store.phase_runs(experiments).empty:
        # the studies have runs, none of this matrix: the matrix name is what to fix, not the selectors
        raise ConfigError("--matrix", f"no phase runs tagged gtep.matrix={matrix} in "
                          f"{', '.join(sorted(experiments)) or 'the store'}; give the matrix: name of a matrix gtep "
                          "matrix ran, or leave --matrix out")
    if phases.empty:
        scope = f" tagged gtep.matrix={matrix}" if matrix else ""
        raise ConfigError("--matrix" if matrix and not selectors else "SELECTORS",
                          f"no phase runs{scope} in {', '.join(sorted(experiments)) or 'the store'}; "
                          "run gtep run (or gtep matrix) first, or name other studies")
    trials, hparams = store.trial_runs(ids, phases["run_id"].tolist())
    everything = label_groups(phases)
    chosen = latest_phases(phases, trials)["run_id"]
    phases = everything[everything["run_id"].isin(chosen)].sort_values("start_time", kind="stable")
    phases = phases.reset_index(drop=True)
    left_out = left_out_phases(everything, phases)
    if phases.empty:
        why = "; ".join(left_out["note"]) or "only running or crashed ones"
        raise ConfigError("SELECTORS", f"the selected studies have no finished phase run yet ({why}); wait for "
                          "them or resume them (gtep run --resume, gtep evaluate --resume)")
    trials = trials[trials["phase_run_id"].isin(phases["run_id"])].reset_index(drop=True)
    orderings = store.ordering_runs(ids, read_trials(phases, trials, experiments))
    orderings = orderings.merge(trials[["run_id", "phase_run_id"]].rename(columns={"run_id": "trial_run_id"}),
                                on="trial_run_id", how="inner")
    # a unit logged twice (should not happen: writes are idempotent) counts once, the latest
    orderings = orderings.sort_values("end_time", kind="stable").drop_duplicates(
        ["trial_run_id", "ordering"], keep="last").reset_index(drop=True)
    trials_tuned = trials[trials["phase_run_id"].isin(phases.loc[phases["phase"] == TUNE.name, "run_id"])]
    hparams = hparams[hparams["trial_run_id"].isin(trials_tuned["run_id"])].reset_index(drop=True)
    data = StoreData(phases, trials_tuned.reset_index(drop=True), hparams, orderings, orderings.iloc[:0], left_out)
    evaluated = phases.loc[phases["phase"].isin([p.name for p in fixed_set_phases()]), "run_id"]
    best = [best_trial_id(data, phase) for _, phase in phases[phases["phase"] == TUNE.name].iterrows()]
    drawn = orderings[orderings["phase_run_id"].isin(evaluated) | orderings["trial_run_id"].isin(best)]
    data.steps = store.accuracy_steps(drawn["run_id"].tolist(), drawn.loc[drawn["percent"].astype(bool), "run_id"])
    draws_gacc = phases["family"].map(lambda f: f in FAMILIES and FAMILIES.get(f).metric("gacc_alpha") is not None)
    with_gacc = phases[draws_gacc.astype(bool)]
    data.gacc = store.gacc_alpha(with_gacc["run_id"].tolist(),
                                 with_gacc.loc[with_gacc["percent"].astype(bool), "run_id"])
    data.family_curves = store.family_curves(phases)
    data.set_evaluations = {run_id: store.json_artifact(run_id, REGRET_FILE) or {}
                            for run_id in phases.loc[ranks_every_set(phases), "run_id"]}
    return data


def read_trials(phases: pd.DataFrame, trials: pd.DataFrame,
                experiments: dict[str, str]) -> dict[str, tuple[str, int]] | None:
    """The tuning trials whose ordering runs a report reads (trial run id -> experiment id, set index): H*'s of
    each tuning
    phase (its curves and its row of the table); the other sets are read as their trial runs. None (read every
    ordering run) when a tuning phase predates the compute_seconds metric: its cost is then summed from all its
    orderings (protocols.compute_seconds)."""
    tuned = phases[phases["phase"] == TUNE.name]
    if "compute_seconds" not in tuned or tuned["compute_seconds"].isna().any():
        return None
    own = StoreData(phases, trials, pd.DataFrame(columns=["trial_run_id"]), pd.DataFrame(), pd.DataFrame())
    chosen = {}
    for _, phase in tuned.iterrows():
        best = best_trial_id(own, phase)
        if best is not None:
            index = trials.loc[trials["run_id"] == best, "set_index"].iloc[0]
            chosen[best] = (experiments[phase["experiment"]], int(index))
    return chosen


def best_trial_id(data: StoreData, phase: pd.Series) -> str | None:
    """H*'s trial run: the tuning phase's gtep.best_trial_run_id tag, else its trial with gtep.best_set_index."""
    own = data.trials[data.trials["phase_run_id"] == phase["run_id"]]
    if phase["best_trial_run_id"] in set(own["run_id"]):
        return str(phase["best_trial_run_id"])
    index = phase["best_set_index_tag"] or phase["best_set_index"]
    try:
        hits = own[own["set_index"] == int(float(index))]
    except (TypeError, ValueError):
        return None
    return str(hits["run_id"].iloc[0]) if len(hits) else None
