"""The IIRC engine path (gtep/engine/flows/multi_label.py) with tiny test-only multi-label learners, and the IIRC
config: its section, the hierarchy source, the superclass split check and the data-flow check."""
from __future__ import annotations

import dataclasses
import importlib
import json
import math
import sys

import numpy as np
import pytest
import yaml

from gtep.config import ConfigError, resolve, validate_config
from gtep.engine import FirstTaskSpec, OrderingJob, run_ordering
from gtep.protocol.families import FAMILIES
from gtep.protocol.families.iirc import metrics as iirc_metrics
from gtep.protocol.families.iirc import phase_hierarchy
from tests.helpers import load

DATA = "synthetic:classes=12,train=20,test=6"  # groups group0..group3: 4 superclasses of 3 subclasses
OPTIONS = {"first_task_superclasses": 2, "classes_per_task": 5, "hierarchy": "groups", "sub_keep": 0.8,
           "super_share": 0.4}
HPARAMS = {"epochs": 2, "lr": 0.05, "batch_size": 16, "scheduler": "constant", "weight_decay": 5e-4}


@pytest.fixture(scope="module", autouse=True)
def learners():
    module = importlib.import_module("tests.engine.multilabel_learner")
    yield module
    module.unregister()
    sys.modules.pop("tests.engine.multilabel_learner", None)


def job(algorithm: str = "tiny_multilabel", ordering: int = 0, seed: int = 3, **options) -> OrderingJob:
    return OrderingJob(algorithm, HPARAMS, "resnet8", (), tuple(range(12)), seed=seed, ordering=ordering,
                       memory_size=0, first_task=FirstTaskSpec(epochs=2, milestones=(1,), batch_size=16),
                       dataset=DATA, device="cpu", family="iirc",
                       family_options=tuple(sorted({**OPTIONS, **options}.items())))


@pytest.fixture(scope="module")
def finetuned(learners):
    learners.RECEIVED.clear()
    outcome = run_ordering(job(), load(DATA))
    return outcome, list(learners.RECEIVED)


def test_the_run_gives_the_task_matrix_and_iircs_metrics(finetuned):
    outcome, _ = finetuned
    assert outcome.status == "finished"
    n_tasks = 4  # 2 superclasses, then 14 labels in tasks of 5, 5, 4
    r = np.array(outcome.acc_matrix, dtype=float)
    assert r.shape == (n_tasks, n_tasks)
    assert all(math.isnan(r[k, j]) for k in range(n_tasks) for j in range(n_tasks) if j > k)
    assert np.all((r[np.tril_indices(n_tasks)] >= 0) & (r[np.tril_indices(n_tasks)] <= 1))
    assert len(outcome.test_counts) == n_tasks and all(c > 0 for c in outcome.test_counts)
    family = FAMILIES.get("iirc")
    assert set(family.metric_names) <= set(outcome.metrics)
    assert set(family.curve_metrics) <= set(outcome.metrics)
    assert outcome.metrics["acc"] == outcome.metrics["pw_js"]
    assert outcome.metrics["avg_acc"] == outcome.metrics["mean_pw_js"]
    assert outcome.metrics["pw_js_current_t"] == pytest.approx([r[k, k] for k in range(n_tasks)], nan_ok=True)
    assert len(outcome.metrics["pw_js_t"]) == n_tasks
    assert outcome.params_total > 0 and len(outcome.task_seconds) == n_tasks
    assert len(outcome.class_order) == 16  # every label, in order of appearance


def test_training_labels_are_the_current_tasks_only(finetuned):
    outcome, received = finetuned
    data = load(DATA)
    hierarchy = phase_hierarchy(range(12), "groups", data.class_names, data.class_groups)
    assert [t["index"] for t in received] == [0, 1, 2, 3]
    for task in received:
        y = task["y"].numpy()
        assert y.dtype == np.float32 and y.shape == (task["n"], task["total"])
        assert set(np.unique(y)) <= {0.0, 1.0}
        assert not y[:, : task["known"]].any()  # no label of an earlier task
        assert (y.sum(1) >= 1).all()  # every image carries its current-task label
    first = received[0]["y"].numpy()
    assert first.shape[1] == 2 and (first.sum(1) == 1).all()
    # task 0's images are the superclasses' borrowed share: 40% of each of their subclasses' 20 images
    assert received[0]["n"] == sum(8 * len(hierarchy.superclasses[s]) for s in outcome.class_order[:2])


def test_complete_history_gets_every_image_so_far_with_complete_labels(learners):
    learners.RECEIVED.clear()
    outcome = run_ordering(job("tiny_multilabel_joint"), load(DATA))
    assert outcome.status == "finished"
    received = list(learners.RECEIVED)
    sizes = [t["n"] for t in received]
    assert sizes == sorted(sizes) and sizes[-1] > sizes[0]
    last = received[-1]["y"].numpy()
    # complete information: images of a subclass under a seen superclass carry both labels
    assert (last.sum(1) == 2).sum() > 0
    assert last.shape[1] == 16


def test_the_same_seed_gives_the_same_run(finetuned):
    outcome, _ = finetuned
    again = run_ordering(job(), load(DATA))
    np.testing.assert_allclose(np.array(again.acc_matrix, dtype=float), np.array(outcome.acc_matrix, dtype=float))
    assert again.metrics["mean_pw_js"] == outcome.metrics["mean_pw_js"]
    assert again.class_order == outcome.class_order


def test_orderings_differ_in_their_tasks_but_not_their_samples():
    data = load(DATA)
    family = FAMILIES.get("iirc")
    hierarchy = phase_hierarchy(range(12), "groups", data.class_names, data.class_groups)
    options = {**OPTIONS, "superclasses": dict(hierarchy.superclasses)}
    orders = {tuple(family.tasks(range(12), options, 3, s)[-1].seen_classes) for s in range(5)}
    assert len(orders) > 1
    assert family.increments({**options, "classes": list(range(12))}) == [2, 5, 5, 4]


def test_the_matrix_agrees_with_the_protocols_task_matrix():
    """R from the engine is iirc_metrics.task_matrix of the engine's own predictions and targets."""
    from gtep.engine.flows.multi_label import MultiLabelRun

    run = MultiLabelRun(job(), load(DATA))
    for task in run.tasks[:2]:
        run.train_task(task)
    expected = iirc_metrics.task_matrix(run.predictions, run.targets, run.members[:2])
    np.testing.assert_allclose(np.array(run.outcome.acc_matrix, dtype=float)[:, :2], expected)


# ---------------------------------------------------------------- issue 31: memory, in-task validation, diagnostics

def test_the_outcome_carries_the_papers_diagnostics(finetuned):
    from gtep.engine.flows.multi_label import MultiLabelRun
    from gtep.protocol.families.iirc.generator import label_kinds

    outcome, _ = finetuned
    run = MultiLabelRun(job(), load(DATA))
    for task in run.tasks:
        run.train_task(task)
    curves = iirc_metrics.after_each_task(run.predictions, run.targets, run.members,
                                          label_kinds(run.hierarchy, run.labels))
    metrics = run.finish().metrics
    for name in iirc_metrics.DIAGNOSTICS:
        np.testing.assert_allclose(metrics[f"{name}_t"], curves[f"{name}_t"])
        assert metrics[name] == outcome.metrics[name] or math.isnan(outcome.metrics[name])
    assert 0 <= metrics["superclass_pw_js"] <= 1
    assert math.isnan(metrics["subclass_precision_standalone"])  # groups: every class is under a superclass


def test_memory_per_class_gives_the_learner_the_papers_budget():
    from gtep.engine.flows.multi_label import MultiLabelRun

    data = load(DATA)
    replay = MultiLabelRun(dataclasses.replace(job(memory_per_class=20), algorithm="iirc_replay", memory_size=0), data)
    assert replay.learner.label_memory.per_label == 20 and replay.learner.label_memory.per_class(14) == 20
    fixed = MultiLabelRun(dataclasses.replace(job(), algorithm="iirc_replay", memory_size=140), data)
    assert fixed.learner.label_memory.per_label is None and fixed.learner.label_memory.per_class(14) == 10


def validation_job(**options) -> OrderingJob:
    hparams = {**HPARAMS, "epochs": 5, "lr_decay": 0.5}
    return dataclasses.replace(job(in_task_validation=0.2, plateau_patience=1, **options), hparams=hparams)


def test_held_out_images_are_never_trained_on_and_the_same_in_every_ordering():
    from gtep.engine.flows.multi_label import MultiLabelRun
    from gtep.protocol.families.iirc.generator import task_training_indices

    data = load(DATA)
    run = MultiLabelRun(validation_job(), data)
    held = np.flatnonzero(run.held_out)
    assert len(held) == 12 * 4  # 20% of each subclass's 20 training images
    held_pixels = {data.x_train[i].tobytes() for i in held}
    for task in run.tasks:
        trained = run.task_data(task).x.pixels.permute(0, 2, 3, 1).cpu().numpy()
        assert not held_pixels & {image.tobytes() for image in trained}, task.index
        assert set(task_training_indices(run.per_class_validation, task)) <= set(held)
    joint = MultiLabelRun(dataclasses.replace(validation_job(), algorithm="tiny_multilabel_joint"), data)
    everything = joint.task_data(joint.tasks[-1]).x.pixels.permute(0, 2, 3, 1).cpu().numpy()
    assert not held_pixels & {image.tobytes() for image in everything}  # the complete history: none either
    other = MultiLabelRun(validation_job(ordering=1), data)
    assert np.array_equal(other.held_out, run.held_out) and other.tasks != run.tasks
    assert not MultiLabelRun(job(), data).held_out.any()  # off by default


def test_a_plateau_of_the_in_task_validation_score_decays_the_lr():
    from gtep.engine.flows.multi_label import MultiLabelRun
    from gtep.protocol.families.iirc.generator import task_training_indices

    run = MultiLabelRun(validation_job(), load(DATA))
    real = run.validation_score
    seen: list[int] = []

    def flat(images, targets) -> float:  # the real score, then a plateau whatever it was
        seen.append(len(images))
        assert 0 <= real(images, targets) <= 1 and run.learner.net.training  # the score leaves train mode on
        return 0.5

    run.validation_score = flat  # type: ignore[method-assign]
    for task in run.tasks[:2]:
        run.train_task(task)
    first, second = run.plateaus  # one per training stage: tiny_multilabel trains once per task
    assert len(first.lrs) == 2 and len(second.lrs) == 5  # the first task's 2 epochs, then the set's 5
    # patience 1: the best at epoch 1, no gain at epochs 2 and 3: the lr halves (lr_decay); again after epoch 5
    assert second.lrs == pytest.approx([0.05, 0.05, 0.025, 0.025, 0.0125])
    validation = len(task_training_indices(run.per_class_validation, run.tasks[1]))
    assert seen[2:] == [validation] * 5 and validation > 0


# ---------------------------------------------------------------- config

def config(tmp_path, algorithm="tiny_multilabel", **scenario):
    (tmp_path / "space.yaml").write_text(yaml.safe_dump({"algorithm": algorithm, "space": {"lr": [0.05]}}))
    data = {"study": "iirc", "algorithm": algorithm, "backbone": "resnet8",
            "scenario": {"family": "iirc", "iirc": {"first_task_superclasses": 1, "classes_per_task": 3}, **scenario},
            "datasets": {"split": {"dataset": "synthetic:classes=16,train=10,test=4", "by": "group",
                                   "tuning_groups": ["group0", "group1"]}},
            "search": {"trials": 2, "orderings": 2, "space": str(tmp_path / "space.yaml")},
            "tracking": {"output": str(tmp_path / "out")}}
    return data


def test_a_good_iirc_config_resolves(tmp_path):
    resolved = resolve(validate_config(config(tmp_path), "test"))
    assert resolved.family.name == "iirc" and resolved.criterion.name == "mean_pw_js"
    assert len(resolved.tuning.classes) == 8 and len(resolved.evaluation.classes) == 8
    assert resolved.increments == (1, 3, 3, 3)  # 2 superclasses + 8 subclasses
    assert resolved.config.scenario.describe() == "iirc 1 superclasses+3/task (groups)"


def test_the_omniglot_preset_resolves_with_a_multi_label_learner():
    from gtep.config import load_preset

    resolved_cfg = load_preset("omniglot-iirc").with_overrides(algorithm="tiny_multilabel")
    with pytest.raises(ConfigError) as err:  # the test learner has no bundled search space
        resolve(resolved_cfg)
    assert err.value.field == "search.space"


@pytest.mark.parametrize("change, field", [
    ({"iirc": None}, "scenario"),
    ({"iirc": {"first_task_superclasses": 1}}, "scenario.iirc.classes_per_task"),
    ({"iirc": {"first_task_superclasses": 1, "classes_per_task": 0}}, "scenario.iirc.classes_per_task"),
    ({"iirc": {"first_task_superclasses": 1, "classes_per_task": 3, "sub_keep": 1.5}}, "scenario.iirc.sub_keep"),
    ({"iirc": {"first_task_superclasses": 1, "classes_per_task": 3, "colour": 1}}, "scenario.iirc.colour"),
    ({"iirc": {"first_task_superclasses": 1, "classes_per_task": 3, "hierarchy": "/no/such.json"}},
     "scenario.iirc.hierarchy"),
    ({"increments": "5x2"}, "scenario"),
    ({"iirc": {"first_task_superclasses": 1, "classes_per_task": 3, "memory_per_class": 0}},
     "scenario.iirc.memory_per_class"),
    ({"iirc": {"first_task_superclasses": 1, "classes_per_task": 3, "memory_per_class": 2.5}},
     "scenario.iirc.memory_per_class"),
    ({"iirc": {"first_task_superclasses": 1, "classes_per_task": 3, "in_task_validation": 1}},
     "scenario.iirc.in_task_validation"),
    ({"iirc": {"first_task_superclasses": 1, "classes_per_task": 3, "plateau_patience": 0}},
     "scenario.iirc.plateau_patience"),
])
def test_a_bad_iirc_section_is_one_error_naming_the_field(tmp_path, change, field):
    data = config(tmp_path)
    data["scenario"].update(change)
    data["scenario"] = {k: v for k, v in data["scenario"].items() if v is not None}
    with pytest.raises(ConfigError) as err:
        validate_config(data, "test")
    assert err.value.field == field


def test_memory_per_class_replaces_the_fixed_total_and_refuses_both(tmp_path):
    from gtep.config import load_preset, with_added_defaults

    data = config(tmp_path, iirc={"first_task_superclasses": 1, "classes_per_task": 3, "memory_per_class": 20})
    cfg = validate_config(data, "test")
    assert cfg.training.memory_size == 0 and cfg.scenario.family_options["memory_per_class"] == 20
    resolve(cfg)
    again = cfg.with_overrides(seed=1)  # dumped and read again (overrides, manifests): still one budget
    assert again.training.memory_size == 0 and again.scenario.iirc.memory_per_class == 20
    resolve(again)
    data["training"] = {"memory_size": 500}
    with pytest.raises(ConfigError) as err:
        resolve(validate_config(data, "test"))
    assert err.value.field == "scenario.iirc.memory_per_class" and "training.memory_size" in str(err.value)
    plain = validate_config(config(tmp_path), "test")  # no per-class budget: the fixed total as before
    assert plain.training.memory_size == 1000 and plain.scenario.family_options["memory_per_class"] is None
    preset = load_preset("omniglot-iirc")  # the paper's 20 per label in the IIRC preset
    assert preset.scenario.iirc.memory_per_class == 20 and preset.training.memory_size == 0
    assert preset.scenario.describe() == "iirc 1 superclasses+10/task (groups), 20/label memory"  # MLflow, names
    old = json.loads(plain.model_dump_json())  # a study recorded before these options compares equal
    for name in ("memory_per_class", "in_task_validation", "plateau_patience"):
        del old["scenario"]["iirc"][name]
    assert with_added_defaults(old)["scenario"] == json.loads(plain.model_dump_json())["scenario"]


def test_too_many_first_task_superclasses_is_refused_before_compute(tmp_path):
    data = config(tmp_path, iirc={"first_task_superclasses": 3, "classes_per_task": 3})
    with pytest.raises(ConfigError) as err:
        resolve(validate_config(data, "test"))
    assert err.value.field == "scenario.iirc.first_task_superclasses"


def test_a_class_incremental_algorithm_is_refused(tmp_path):
    with pytest.raises(ConfigError) as err:
        resolve(validate_config(config(tmp_path, algorithm="replay"), "test"))
    assert err.value.field == "algorithm" and "multi_label" in str(err.value)


def test_phases_that_split_a_superclass_are_refused(tmp_path):
    data = config(tmp_path)
    data["datasets"] = {"split": {"dataset": "synthetic:classes=16,train=10,test=4", "by": "class", "seed": 0}}
    with pytest.raises(ConfigError) as err:
        resolve(validate_config(data, "test"))
    assert err.value.field == "scenario.iirc.hierarchy" and "both phases" in str(err.value)


def test_a_hierarchy_file_names_superclasses_by_class_names_or_ids(tmp_path):
    tree = {"animals": ["class0", "class1", 2], "plants": ["3", "class4"]}
    (tmp_path / "tree.json").write_text(json.dumps(tree))
    data = config(tmp_path, iirc={"first_task_superclasses": 1, "classes_per_task": 2,
                                  "hierarchy": str(tmp_path / "tree.json")})
    data["datasets"] = {"tuning": {"dataset": "synthetic:classes=16,train=10,test=4", "classes": [0, 1, 2, 3, 4, 5]},
                        "evaluation": {"dataset": "synthetic:classes=16,train=10,test=4",
                                       "classes": [8, 9, 10, 11]}}
    with pytest.raises(ConfigError) as err:  # the evaluation phase has no superclass for task 0
        resolve(validate_config(data, "test"))
    assert err.value.field == "scenario.iirc.first_task_superclasses"
    data["datasets"]["evaluation"]["classes"] = [0, 1, 2, 6, 7]
    with pytest.raises(ConfigError) as err:
        resolve(validate_config(data, "test"))
    assert err.value.field == "datasets.evaluation.classes"  # shares classes: the generic disjointness check
    tree["trees"] = [8, 9]
    (tmp_path / "tree.json").write_text(json.dumps(tree))
    data["datasets"]["evaluation"]["classes"] = [8, 9, 10, 11]
    resolved = resolve(validate_config(data, "test"))
    # tuning: 2 superclasses, 5 subclasses under them, 1 standalone = 8 labels; 1 + 7 in tasks of 2
    assert resolved.increments == (1, 2, 2, 2, 1)
    hierarchy = phase_hierarchy([0, 1, 2, 3, 4, 5], tree, [f"class{i}" for i in range(16)], None)
    assert hierarchy.standalone == (5,) and sorted(hierarchy.superclasses) == [16, 17]
    (tmp_path / "bad.json").write_text(json.dumps({"animals": ["no-such-class"]}))
    data["scenario"]["iirc"]["hierarchy"] = str(tmp_path / "bad.json")
    with pytest.raises(ConfigError) as err:
        resolve(validate_config(data, "test"))
    assert err.value.field == "scenario.iirc.hierarchy" and "no-such-class" in str(err.value)
    (tmp_path / "bad.json").write_text("[1, 2]")
    with pytest.raises(ConfigError) as err:
        validate_config(data, "test")
    assert err.value.field == "scenario.iirc.hierarchy" and "not a hierarchy file" in str(err.value)
