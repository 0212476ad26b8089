"""`gtep check --calibrate` against what the tuning unit then takes (issue 45, item 1).

For the default preset and one preset of each scenario family, with `--trials 1 --orderings 1`: the calibration's
estimate of the tuning unit's training seconds (gtep/preflight/calibration.py: estimate), then the unit itself trained
through gtep's engine as a trial trains it (its job from gtep/orchestration/trial_job.py, the trial's threads, the
phase's data), without Ray, and the estimate again: the mean of the two is compared with the measurement (the
machine's load drifts). Where the preset has a pretrain section, its pretraining runs first (into the run's own
folder, never a cache) and is a row of its own: the pretraining estimate taken before and after it against its
seconds. Prints one table (preset, family, estimate s, measured s, estimate/measured; the target is 0.5 to 2)
and writes it as JSON. A family whose cost the calibration cannot estimate gets its measurement and the reason.

    TINYIMAGENET_NPZ=../shared/data/tinyimagenet200_32.npz .venv/bin/python benchmarks/calibration.py \\
        [--presets default,tinyimagenet-smoke] [--json benchmarks/results/calibration.json]

Every preset runs in this process one after the other; on a shared machine both figures move with its load.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

# one preset a family: the default (class-incremental on Omniglot) and the smallest preset of each family
PRESETS = ("default", "tinyimagenet-smoke", "tinyimagenet-fscil", "omniglot-iirc", "omniglot-cfsl",
           "tinyimagenet-fluid")
TARGET = (0.5, 2.0)


@dataclass(frozen=True)
class Row:
    preset: str
    family: str
    estimate_s: float | None  # None: the calibration gives no estimate for the family (`note` says why)
    measured_s: float
    note: str = ""
    estimates_s: tuple[float, ...] = ()  # the calibrations before and after the measurement (their mean above)

    @property
    def ratio(self) -> float | None:
        return None if self.estimate_s is None or self.measured_s <= 0 else self.estimate_s / self.measured_s

    @property
    def within_target(self) -> bool | None:
        ratio = self.ratio
        return None if ratio is None else TARGET[0] <= ratio <= TARGET[1]


def table(rows: list[Row]) -> str:
    """The rows as a Markdown table, as docs/preflight.md shows it."""
    lines = ["| preset | family | estimate s | measured s | estimate/measured |", "|---|---|---:|---:|---:|"]
    for row in rows:
        estimate = "-" if row.estimate_s is None else f"{row.estimate_s:.1f}"
        ratio = row.ratio
        shown = f"no estimate: {row.note}" if ratio is None else f"{ratio:.2f}" + ("" if row.within_target else " (!)")
        lines.append(f"| {row.preset} | {row.family} | {estimate} | {row.measured_s:.1f} | {shown} |")
    return "\n".join(lines)


def estimate_unit(plan: Any) -> tuple[float | None, str]:
    """The calibration's seconds for one tuning unit, or None and why not (what `gtep check` says)."""
    from gtep.preflight import estimate, no_estimate_reason

    reason = no_estimate_reason(plan)
    if reason is not None:
        return None, reason
    return float(estimate(plan)["unit_seconds"]), ""


def estimate_pretraining(plan: Any) -> float | None:
    """The pretrain section's estimated seconds (what `gtep check --calibrate` prints), None without one or when
    its weights are cached already (then the measurement would not pretrain either)."""
    from gtep.orchestration.pretraining import pretrain_spec, pretrained_path
    from gtep.preflight import pretrain_estimate

    if plan.resolved.pretraining is None or pretrained_path(plan.resolved).exists():
        return None
    tic = time.perf_counter()
    seconds = pretrain_estimate(plan, pretrain_spec(plan.resolved)).seconds
    print(f"pretraining estimate {seconds:.1f} s (timed in {time.perf_counter() - tic:.1f} s)", flush=True)
    return seconds


def measure_unit(plan: Any, say: Callable[[str], None]) -> tuple[float, float]:
    """Pretrain where the preset says so (timed), then train the study's tuning unit (set 0, ordering 0) as a
    trial does, without Ray: (its training seconds, the pretraining's seconds)."""
    import torch

    from gtep.data import resolve_dataset
    from gtep.engine import run_ordering
    from gtep.orchestration.pretraining import with_pretrained_weights
    from gtep.orchestration.trial_job import trial_job
    from gtep.preflight import sampled_params

    tic = time.perf_counter()
    resolved = with_pretrained_weights(plan.resolved, say)
    pretraining = time.perf_counter() - tic
    job = trial_job(resolved, "tune")
    spec = resolved.phase("tune")
    extra = resolved.family.data_classes(resolved.config.scenario.family_options)
    data = resolve_dataset(spec.dataset).load().subset(sorted({*spec.classes, *extra}))
    hparams = sampled_params(plan)[0][1]
    before = torch.get_num_threads()
    torch.set_num_threads(job.resources.threads)
    try:
        outcome = run_ordering(job.ordering(hparams, 0), data)
    finally:
        torch.set_num_threads(before)
    return float(outcome.train_seconds), pretraining


def timed_estimate(preset: str, plan: Any) -> tuple[float | None, str]:
    tic = time.perf_counter()
    estimate, note = estimate_unit(plan)
    print(f"{preset}: calibration {time.perf_counter() - tic:.1f} s, estimate "
          f"{'-' if estimate is None else f'{estimate:.1f} s'}", flush=True)
    return estimate, note


def run_preset(preset: str, output: Path) -> list[Row]:
    """Calibrate, measure, calibrate again: on a shared machine whose load drifts, the mean of the estimates
    taken on either side of the measurement saw the load it saw. A preset with a pretrain section gets a second
    row: the pretraining's estimate (taken before it) against its measurement."""
    from gtep import api
    from gtep.preflight import preflight

    cfg = api.experiment(None, preset=preset, trials=1, orderings=1, output=output / preset)
    plan = preflight(cfg)
    before, note = timed_estimate(preset, plan)
    pretrain_estimated = estimate_pretraining(plan)
    measured, pretraining = measure_unit(plan, lambda line: print(f"{preset}: {line}", flush=True))
    print(f"{preset}: measured {measured:.1f} s, pretraining {pretraining:.1f} s", flush=True)
    family = plan.resolved.family.name
    extra = []
    if pretrain_estimated is not None:  # timed again after it, as the unit's estimate is (the load drifts)
        from gtep.orchestration.pretraining import pretrain_spec
        from gtep.preflight import pretrain_estimate

        again = pretrain_estimate(plan, pretrain_spec(plan.resolved)).seconds
        extra.append(Row(f"{preset} (pretraining)", family, (pretrain_estimated + again) / 2, pretraining, "",
                         (pretrain_estimated, again)))
    if before is None:
        return [Row(preset, family, None, measured, note), *extra]
    after, _ = timed_estimate(preset, plan)
    assert after is not None
    return [Row(preset, family, (before + after) / 2, measured, note, (before, after)), *extra]


def results(rows: list[Row], command: str) -> dict[str, Any]:
    return {"command": command, "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                                            "load_average": os.getloadavg()},
            "target": list(TARGET), "rows": [{**asdict(r), "ratio": r.ratio, "within_target": r.within_target}
                                             for r in rows]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", default=",".join(PRESETS))
    parser.add_argument("--json", type=Path, default=Path("benchmarks/results/calibration.json"))
    args = parser.parse_args()
    os.environ.setdefault("TINYIMAGENET_NPZ", str(Path("../shared/data/tinyimagenet200_32.npz").resolve()))
    os.environ.pop("GTEP_CACHE", None)  # pretrain into the run's own folder: a cached file would not pretrain
    args.json.parent.mkdir(parents=True, exist_ok=True)
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="gtep-calibration-") as tmp:
        for name in args.presets.split(","):
            try:
                rows.extend(run_preset(name, Path(tmp)))
            except Exception as err:  # noqa: BLE001 - one preset's failure is its row, the others still run
                rows.append(Row(name, "?", None, float("nan"), f"failed: {type(err).__name__}: {err}"))
            # written after every preset: a long run stopped half-way keeps what it measured
            args.json.write_text(json.dumps(results(rows, "benchmarks/calibration.py --presets " + args.presets),
                                            indent=2) + "\n")
    print(table(rows))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
