"""`gtep check --calibrate` calibrates as a trial trains (issue 45, item 1): the trial's threads, the sampled sets'
batch size and the learner's own `fit` calls; it names the trial slots its wall time assumes; the estimate counts
task 1 once per ordering where the study shares it; `training.device: cuda` without CUDA is refused by the
pre-flight pass; and benchmarks/calibration.py computes its ratio table right."""
from __future__ import annotations

import os
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import yaml
from typer.testing import CliRunner

from gtep import api
from gtep.algorithms.base import FitRecipe
from gtep.cli import app
from gtep.config import ConfigError
from gtep.config.files import preset_text
from gtep.engine.loop import FitCall, Trainer
from gtep.preflight.calibration import (
    FLOW_FIT_BATCHES,
    Calibration,
    FlowCalibration,
    SampledFit,
    compute_estimate,
    compute_flow_estimate,
    pretrain_estimate,
    sampled_params,
)
from gtep.preflight.checks import check_device, preflight

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import calibration as bench  # noqa: E402

runner = CliRunner()
# the default preset on the smallest backbone: a calibration of a few seconds
SMALL = {"backbone": "resnet8"}


def small_plan(tmp_path: Path, trials: int = 1, **fields):
    cfg = api.experiment(preset="default", trials=trials, orderings=1, output=tmp_path / "runs", fields=fields,
                         **SMALL)
    return preflight(cfg)


def config_file(tmp_path: Path, **sections) -> Path:
    """The default preset as a file, each section updated with `sections` (training={"device": "cuda"}...)."""
    text = yaml.safe_load(preset_text("default"))
    for name, values in sections.items():
        text.setdefault(name, {}).update(values)
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(text))
    return path


def test_check_calibrates_with_the_trials_threads_and_the_sets_batch_size_and_names_its_slots(tmp_path, monkeypatch):
    """Every timed `fit` runs with compute.cpus_per_trial threads (torch's own count before and after), task 1
    with the first task's batch size and the later tasks with the sampled sets' median; the output says so and
    names the trial slots the wall time assumes."""
    seen: list[tuple[int, int]] = []  # (threads, batch size) of each fit
    real_fit = Trainer.fit

    def spy(self, parameters, loss_fn, x, y, recipe, **kwargs):
        seen.append((torch.get_num_threads(), recipe.batch_size))
        return real_fit(self, parameters, loss_fn, x, y, recipe, **kwargs)

    monkeypatch.setattr(Trainer, "fit", spy)
    # one batch a task, once: seconds, not a minute
    monkeypatch.setattr("gtep.preflight.calibration.CALIBRATION_REPEATS", 1)
    monkeypatch.setattr("gtep.preflight.calibration.CALIBRATION_BATCHES", 1)
    path = config_file(tmp_path, compute={"cpus_per_trial": 1})
    before = torch.get_num_threads()
    torch.set_num_threads(2)  # torch's own count, as on a 2-core machine
    try:
        result = runner.invoke(app, ["check", "-c", str(path), "--trials", "3", "--orderings", "1", "--backbone",
                                     "resnet8", "--output", str(tmp_path / "runs"), "--calibrate"],
                               env={"COLUMNS": "300"})
        assert torch.get_num_threads() == 2  # restored
    finally:
        torch.set_num_threads(before)
    assert result.exit_code == 0, result.output
    cfg = api.experiment(path, trials=3, orderings=1, output=tmp_path / "runs", **SMALL)
    median = sorted(p.batch_size for p, _ in sampled_params(preflight(cfg)))[1]
    assert seen and {threads for threads, _ in seen} == {1}
    assert {batch for _, batch in seen} == {cfg.first_task.batch_size, median}
    out = " ".join(result.output.split())
    assert f"with 1 thread(s), batch size {median} (the sampled sets' median)" in out
    assert "ms per training image from task 2 on" in out
    cpus = os.cpu_count() or 1
    assert (f"trial slots: {min(cpus, 3)} trial(s) at a time with 1 CPU thread(s) each; {cpus} trial slot(s) on "
            f"this machine ({cpus} CPUs / compute.cpus_per_trial 1) -> tuning wall about") in out


def fixed(first: float = 0.0, later: float = 0.0, growth: float = 0.0) -> Calibration:
    return Calibration(first_task=first, later_tasks=later, growth=growth, outside_fit=0.0, test=0.0,
                       batch_size=32, threads=1, device="cpu")


def test_the_estimate_counts_a_shared_first_task_once_per_ordering(tmp_path):
    """Three sets share task 1 of their ordering (training.reuse_first_task): it is trained once, not three times;
    without sharing, three times."""
    shared = compute_estimate(small_plan(tmp_path, trials=3), fixed(first=1.0))
    alone = compute_estimate(small_plan(tmp_path, trials=3, **{"training.reuse_first_task": False}), fixed(first=1.0))
    assert shared["tuning_seconds"] > 0
    assert alone["tuning_seconds"] == pytest.approx(3 * shared["tuning_seconds"])


def test_a_learner_that_grows_a_backbone_a_task_costs_more_on_each_later_task(tmp_path):
    """Task 2 timed with two backbones (growth 0.5): task 3 has three, so it costs 1.5 times task 2's rate."""
    plan = small_plan(tmp_path)  # C10xT1 + C5xT2: tasks 2 and 3 of equal images (and memory full by then)
    flat = compute_estimate(plan, fixed(later=1.0))["tuning_seconds"]
    grown = compute_estimate(plan, fixed(later=1.0, growth=0.5))["tuning_seconds"]
    assert flat > 0 and grown > flat
    assert fixed(later=1.0, growth=0.5).image_epoch_seconds(2) == pytest.approx(1.5)


def test_check_refuses_cuda_on_a_machine_without_it(tmp_path, monkeypatch):
    """Today's `tune` would fail in every trial once Ray started, and --calibrate end in a traceback."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    path = config_file(tmp_path, training={"device": "cuda"})
    result = runner.invoke(app, ["check", "-c", str(path), "--output", str(tmp_path / "runs"), "--calibrate"],
                           env={"COLUMNS": "300"})
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "training.device" in lines[0] and "'auto'" in lines[0] and "'cpu'" in lines[0]
    assert not (tmp_path / "runs").exists()


def test_cuda_on_a_cluster_is_left_to_its_workers(monkeypatch):
    """The driver of a cluster study may have no GPU while its workers do: only a local study is refused."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    local = api.experiment(preset="default", fields={"training.device": "cuda"})
    with pytest.raises(ConfigError, match="training.device"):
        check_device(local)
    check_device(api.experiment(preset="default", address="ray://head:10001", fields={"training.device": "cuda"}))
    check_device(api.experiment(preset="default", fields={"training.device": "auto", "compute.gpus_per_trial": 1}))


def test_the_benchmark_table_divides_estimate_by_measurement():
    rows = [bench.Row("default", "class_incremental", 60.0, 40.0),
            bench.Row("tinyimagenet-fscil", "fscil", 10.0, 30.0),
            bench.Row("omniglot-iirc", "iirc", None, 12.0, "its multi_label data flow's work is not tasks")]
    assert [r.ratio for r in rows] == [pytest.approx(1.5), pytest.approx(1 / 3), None]
    assert [r.within_target for r in rows] == [True, False, None]
    lines = bench.table(rows).splitlines()
    assert lines[2] == "| default | class_incremental | 60.0 | 40.0 | 1.50 |"
    assert lines[3] == "| tinyimagenet-fscil | fscil | 10.0 | 30.0 | 0.33 (!) |"
    assert lines[4].startswith("| omniglot-iirc | iirc | - | 12.0 | no estimate: its multi_label")
    stored = bench.results(rows, "cmd")["rows"]
    assert stored[0]["ratio"] == pytest.approx(1.5) and stored[2]["within_target"] is None


# ---------------------------------------------------------------- the IIRC, CFSL and FLUID flows (issue 45, item 1)

def fluid_file(tmp_path: Path, total_samples: int = 60) -> Path:
    """A FLUID study on synthetic images, small enough to calibrate in a second or two."""
    section = {"pretrain_classes": [0, 1, 2, 3], "n_pretrain_classes": 2, "n_novel_classes": 4,
               "total_samples": total_samples, "per_class_cap": 40, "head_cut": 10}
    text = {"study": "f", "algorithm": "fluid_et", "backbone": "resnet8",
            "scenario": {"family": "fluid", "fluid": section},
            "datasets": {"split": {"dataset": "synthetic:classes=20,train=40,test=10", "classes": list(range(4, 20)),
                                   "classes_per_phase": 8}}}
    path = tmp_path / f"fluid-{total_samples}.yaml"
    path.write_text(yaml.safe_dump(text))
    return path


def preset_file(tmp_path: Path, preset: str, **sections) -> Path:
    """The preset as a file, a section's keys (dotted: scenario.cfsl) updated with `sections`' values."""
    text = yaml.safe_load(preset_text(preset))
    for dotted, values in sections.items():
        section = text
        for key in dotted.split("."):
            section = section[key]
        section.update(values)
    path = tmp_path / f"{preset}.yaml"
    path.write_text(yaml.safe_dump(text))
    return path


FLOW_STUDIES = {  # family -> (the study's file, its data flow): each a few tasks, a few seconds to calibrate
    "iirc": (lambda tmp: preset_file(tmp, "omniglot-iirc", **{"scenario.iirc": {"classes_per_task": 25}}),
             "multi_label"),
    "cfsl": (lambda tmp: preset_file(tmp, "omniglot-cfsl", pretrain={"batch_size": 16}, **{
        "scenario.cfsl": {"support_sets": 3, "tasks_per_ordering": 2}}), "continual_few_shot"),
    "fluid": (fluid_file, "stream"),
}


@pytest.mark.parametrize("family", sorted(FLOW_STUDIES))
def test_check_estimates_the_iirc_cfsl_and_fluid_families(tmp_path, monkeypatch, family):
    """Each flow family gets an estimate from a part of its real run, with the scaling rule said, where
    `gtep check` used to print a reason instead; a pretrain section not cached yet gets its own line."""
    monkeypatch.setenv("GTEP_CACHE", str(tmp_path / "cache"))  # an empty cache: the pretraining is to come
    monkeypatch.setattr("gtep.preflight.calibration.FLOW_FIT_BATCHES", 2)
    study_file, flow = FLOW_STUDIES[family]
    result = runner.invoke(app, ["check", "-c", str(study_file(tmp_path)), "--trials", "1", "--orderings", "1",
                                 "--output", str(tmp_path / "runs"), "--calibrate"], env={"COLUMNS": "300"})
    assert result.exit_code == 0, result.output
    out = " ".join(result.output.split())
    assert "no estimate" not in out
    assert f"compute: calibrated as a trial runs the {flow} flow, on cpu with 1 thread(s)" in out
    assert "a unit; tuning about" in out and "scaled to an ordering's" in out
    assert ("pretraining: about" in out and "once per study" in out) == (family == "cfsl")
    assert not (tmp_path / "runs").exists() and not (tmp_path / "cache").exists()  # nothing written


def cfsl_plan(tmp_path: Path, support_sets: int):
    cfg = api.experiment(preset="omniglot-cfsl", trials=2, orderings=3, output=tmp_path / "runs",
                         fields={"scenario.cfsl.support_sets": support_sets})
    return preflight(cfg)


def test_the_flow_estimate_scales_with_the_support_sets_and_the_stream(tmp_path):
    """At fixed calibrated costs, twice the support sets a task or twice the stream is twice the outside-`fit`
    seconds; a FLUID update trains on every sample seen so far, so its `fit` seconds grow with the square."""
    per_unit = FlowCalibration(outside_fit=0.01, fit=0.0, fit_power=1, unit="support set", timed_units=10,
                               timed_seconds=1.0, batch_size=32, threads=1, device="cpu")
    five, ten = (compute_flow_estimate(cfsl_plan(tmp_path, n), per_unit) for n in (5, 10))
    assert five["units"] == {"tune": 50, "evaluate": 50} and ten["units"] == {"tune": 100, "evaluate": 100}
    assert five["unit_seconds"] == pytest.approx(0.5) and ten["unit_seconds"] == pytest.approx(1.0)
    assert ten["tuning_seconds"] == pytest.approx(2 * 3 * 1.0)  # R x S units
    short, long = (preflight(api.experiment(fluid_file(tmp_path, n), trials=1, orderings=1,
                                            output=tmp_path / "runs")) for n in (60, 120))
    stream = replace(per_unit, unit="stream sample", fit_power=2)
    assert compute_flow_estimate(long, stream)["unit_seconds"] == pytest.approx(
        2 * compute_flow_estimate(short, stream)["unit_seconds"])
    updates = replace(stream, outside_fit=0.0, fit=1e-4)
    assert compute_flow_estimate(long, updates)["unit_seconds"] == pytest.approx(
        4 * compute_flow_estimate(short, updates)["unit_seconds"])


def test_a_sampled_fit_trains_a_few_batches_once_and_counts_the_full_call(monkeypatch):
    """The calibration's stand-in for `fit` trains one epoch of at most FLOW_FIT_BATCHES batches, and counts the
    call at its images x epochs (here a fit that takes 1 ms an image: 200 images x 5 epochs, about 1 s). The
    calibration's clock is a fake that the fit advances, so a loaded machine's late wake-ups cannot move it."""
    from types import SimpleNamespace

    import gtep.preflight.calibration as calibration

    seen: list[tuple[int, int]] = []
    clock = [0.0]
    monkeypatch.setattr(calibration, "time", SimpleNamespace(perf_counter=lambda: clock[0]))

    def plain(self, call):
        seen.append((len(call.x), call.recipe.epochs))
        clock[0] += 1e-3 * len(call.x) * call.recipe.epochs

    monkeypatch.setattr(SampledFit, "run_plain", plain)
    sampled = SampledFit()
    recipe = FitRecipe(epochs=5, lr=0.1, batch_size=8, weight_decay=0.0, scheduler="steplr", milestones=(3,),
                       lr_decay=0.1)
    sampled.fit(FitCall(Trainer(torch.device("cpu"), 0), [], None, torch.zeros(200, 1), torch.zeros(200), recipe))
    assert {epochs for _, epochs in seen} == {1} and max(n for n, _ in seen) == FLOW_FIT_BATCHES * 8
    assert sampled.seconds < 0.2
    assert 0.8 < sampled.full_seconds < 1.5


def test_the_pretraining_estimate_is_its_images_times_its_epochs(tmp_path, monkeypatch):
    """The pretrain section's seconds: the timed cost per image-epoch times its images (the pretrain classes'
    training images) times its epochs."""
    from gtep.orchestration.pretraining import pretrain_spec

    monkeypatch.setattr("gtep.preflight.calibration.linear_cost", lambda train, device, batch, images: (0.0, 1e-3))
    plan = preflight(api.experiment(preset="omniglot-cfsl", output=tmp_path / "runs"))
    spec = pretrain_spec(plan.resolved)
    cost = pretrain_estimate(plan, spec)
    images = int(sum(plan.tuning.facts.train_counts[list(spec.classes)]))
    assert cost.images == images and cost.epochs == spec.epochs == 30
    assert cost.seconds == pytest.approx(1e-3 * images * 30)
    assert pretrain_estimate(plan, replace(spec, epochs=60)).seconds == pytest.approx(2 * cost.seconds)
