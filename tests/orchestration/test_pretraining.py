"""The study-level pretraining step and ResNet weights: overlap refused before compute, pretrained once, cached,
reused by a second resolve (as a resume or a later `gtep evaluate` does), and loaded into the backbone."""
import pytest
import torch

from gtep.config import ConfigError, resolve, validate_config
from gtep.engine.pretrain import PretrainSpec, pretrain
from gtep.models import create_backbone
from gtep.models.vit import WeightsError
from gtep.orchestration.pretraining import pretrained_path, with_pretrained_weights

DATA = "synthetic:classes=12,train=16,test=6"


def config(tmp_path, **changes):
    doc = {
        "study": "pre", "algorithm": "replay", "backbone": "resnet8",
        "scenario": {"increments": "2x2"},
        "datasets": {"split": {"dataset": DATA, "classes": list(range(8)), "classes_per_phase": 4}},
        "pretrain": {"classes": [8, 9, 10, 11], "epochs": 1, "batch_size": 16},
        "search": {"trials": 1, "orderings": 1},
        "tracking": {"output": str(tmp_path / "out")},
        "training": {"device": "cpu"},
    }
    doc.update(changes)
    return validate_config(doc, "test")


def test_pretrain_classes_shared_with_a_phase_are_refused_before_compute(tmp_path):
    with pytest.raises(ConfigError) as err:
        resolve(config(tmp_path, pretrain={"classes": [0, 8], "epochs": 1}))
    assert err.value.field == "pretrain.classes" and "kept out of both phases" in str(err.value)


def test_pretrain_and_weights_together_are_refused(tmp_path):
    with pytest.raises(ConfigError) as err:
        resolve(config(tmp_path, weights=str(tmp_path / "w.safetensors")))
    assert err.value.field == "pretrain"


def test_groups_that_the_dataset_lacks_are_refused(tmp_path):
    with pytest.raises(ConfigError) as err:
        resolve(config(tmp_path, pretrain={"groups": ["nope"], "epochs": 1}))
    assert err.value.field == "pretrain.groups"


def test_pretraining_runs_once_and_the_cache_is_reused(tmp_path, monkeypatch):
    torch.set_num_threads(1)
    calls = []
    import gtep.engine.pretrain as engine  # pretrain_with_threads imports it when it runs

    original = engine.pretrain
    monkeypatch.setattr(engine, "pretrain", lambda *a, **k: calls.append(a) or original(*a, **k))
    first = with_pretrained_weights(resolve(config(tmp_path)), lambda _: None)
    assert first.weights is not None and first.weights.exists() and len(calls) == 1
    again = with_pretrained_weights(resolve(config(tmp_path)), lambda _: None)
    assert again.weights == first.weights and len(calls) == 1
    # the config itself keeps no weights path: a resumed study's stored config re-resolves to the same file
    assert again.config.weights is None
    # another recipe is another file
    other = resolve(config(tmp_path, pretrain={"classes": [8, 9, 10, 11], "epochs": 2}))
    assert pretrained_path(other) != first.weights
    net = create_backbone("resnet8", str(first.weights))
    assert torch.equal(net.state_dict()["stem.0.weight"], _state(first.weights)["stem.0.weight"])


def _state(path):
    from safetensors.torch import load_file

    return load_file(str(path))


def test_cnn_weights_of_another_architecture_are_refused(tmp_path):
    from gtep.data import resolve_dataset

    out = tmp_path / "r8.safetensors"
    pretrain(PretrainSpec("resnet8", (8, 9), epochs=1, lr=0.05, batch_size=16, weight_decay=5e-4, device="cpu"),
             resolve_dataset(DATA).load(), DATA, out)
    with pytest.raises(WeightsError, match="do not fit resnet20"):
        create_backbone("resnet20", str(out))


def test_weights_pretrained_on_a_phase_class_are_refused(tmp_path):
    from gtep.data import resolve_dataset

    out = tmp_path / "r8.safetensors"
    pretrain(PretrainSpec("resnet8", (0, 9), epochs=1, lr=0.05, batch_size=16, weight_decay=5e-4, device="cpu"),
             resolve_dataset(DATA).load(), DATA, out)
    doc = config(tmp_path).model_dump(mode="python")
    doc.pop("pretrain")
    doc["weights"] = str(out)
    with pytest.raises(ConfigError, match="pretrained on 1 classes"):
        resolve(validate_config(doc, "test"))


def omniglot(tmp_path, split_groups):
    split = {"dataset": "omniglot-small", "by": "group", "tuning_groups": ["Greek", "Balinese"]}
    if split_groups is not None:
        split["groups"] = split_groups
    return config(tmp_path, scenario={"increments": "24x2"}, datasets={"split": split},
                  pretrain={"groups": ["Korean"], "epochs": 1})


def test_split_groups_leave_the_pretraining_alphabets_out_of_both_phases(tmp_path):
    with pytest.raises(ConfigError) as err:  # the split's pool holds every alphabet, Korean included
        resolve(omniglot(tmp_path, None))
    assert err.value.field == "pretrain.groups" and "evaluate phase" in str(err.value)
    resolved = resolve(omniglot(tmp_path, ["Greek", "Balinese", "Latin", "Early_Aramaic"]))  # 48 classes each
    assert resolved.pretraining is not None and len(resolved.pretraining.classes) == 40  # Korean's characters
    assert not set(resolved.pretraining.classes) & set(resolved.tuning.classes + resolved.evaluation.classes)


def test_an_episodic_pretrain_section_reaches_the_spec_and_its_own_cache_file(tmp_path):
    from gtep.orchestration.pretraining import pretrain_spec

    episodic = {"classes": [8, 9, 10, 11], "epochs": 1, "method": "protonet", "ways": 3, "shots": 2, "queries": 2}
    spec = pretrain_spec(resolve(config(tmp_path, pretrain=episodic)))
    assert (spec.method, spec.ways, spec.shots, spec.queries) == ("protonet", 3, 2, 2)
    supervised = resolve(config(tmp_path, pretrain={"classes": [8, 9, 10, 11], "epochs": 1}))
    assert pretrain_spec(supervised).method == "supervised"
    assert pretrained_path(resolve(config(tmp_path, pretrain=episodic))) != pretrained_path(supervised)
