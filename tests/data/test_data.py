"""Dataset sources on generated data and on ../shared/data; phase splits resolved from the config."""
import pickle
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from pydantic import ValidationError

from gtep.config import ConfigError, ExperimentConfig, resolve
from gtep.data import DatasetError, resolve_dataset

SHARED = Path(__file__).resolve().parents[3] / "shared" / "data"


def test_bundled_omniglot_is_rgb_with_alphabets():
    data = resolve_dataset("omniglot-small").load()
    assert data.x_train.shape == (3630, 32, 32, 3) and data.x_test.shape == (1210, 32, 32, 3)
    assert data.num_classes == 242 and len(set(data.class_groups)) == 8
    assert data.x_train.mean() < 60  # inverted: bright strokes on black


@pytest.mark.skipif(not (SHARED / "tinyimagenet200_32.npz").exists(), reason="../shared/data not present")
def test_npz_tinyimagenet():
    source = resolve_dataset(f"npz:{SHARED / 'tinyimagenet200_32.npz'}")
    assert len(source.class_names) == 200
    data = source.load().subset([3, 7])
    assert data.x_train.shape == (150, 32, 32, 3) and set(data.y_test) == {3, 7}


def test_synthetic_is_seeded():
    a, b = resolve_dataset("synthetic:seed=3").load(), resolve_dataset("synthetic:seed=3").load()
    assert np.array_equal(a.x_train, b.x_train)
    assert not np.array_equal(a.x_train, resolve_dataset("synthetic:seed=4").load().x_train)
    with pytest.raises(DatasetError, match="unknown"):
        resolve_dataset("synthetic:colour=red")


def make_imagefolder(root: Path, classes=("cat", "dog", "eel")) -> None:
    rng = np.random.default_rng(0)
    for split, count in (("train", 3), ("val", 2)):
        for name in classes:
            folder = root / split / name
            folder.mkdir(parents=True)
            for i in range(count):
                Image.fromarray(rng.integers(0, 255, (40, 40, 3), dtype=np.uint8)).save(folder / f"{i}.png")


def test_imagefolder_with_class_list(tmp_path):
    make_imagefolder(tmp_path / "tree")
    data = resolve_dataset(f"imagefolder:{tmp_path / 'tree'}?size=16").load()
    assert data.class_names == ["cat", "dog", "eel"] and data.x_train.shape == (9, 16, 16, 3)
    (tmp_path / "half.txt").write_text("eel\ncat\n")
    half = resolve_dataset(f"imagefolder:{tmp_path / 'tree'}?classes={tmp_path / 'half.txt'}").load()
    assert half.class_names == ["eel", "cat"] and sorted(set(half.y_test)) == [0, 1]
    (tmp_path / "bad.txt").write_text("emu\n")
    with pytest.raises(DatasetError, match="emu"):
        resolve_dataset(f"imagefolder:{tmp_path / 'tree'}?classes={tmp_path / 'bad.txt'}").class_names


def test_cifar100_from_a_local_root(tmp_path, monkeypatch):
    from torchvision.datasets import CIFAR100

    base = tmp_path / "cifar" / "cifar-100-python"
    base.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for split, n in (("train", 20), ("test", 10)):
        with open(base / split, "wb") as fh:
            pickle.dump({"data": rng.integers(0, 255, (n, 3072), dtype=np.uint8), "fine_labels": list(range(n))}, fh)
    with open(base / "meta", "wb") as fh:
        pickle.dump({"fine_label_names": [f"c{i}" for i in range(100)]}, fh)
    import torchvision.datasets.cifar as tv_cifar

    # torchvision checks the md5s of the real files; the generated ones share only their format
    monkeypatch.setattr(CIFAR100, "_check_integrity", lambda self: True)
    monkeypatch.setattr(tv_cifar, "check_integrity", lambda *args, **kwargs: True)
    data = resolve_dataset(f"cifar100:{tmp_path / 'cifar'}").load()
    assert data.num_classes == 100 and data.x_train.shape == (20, 32, 32, 3) and len(data.y_test) == 10


def test_cifar100_coarse_labels_are_its_class_groups(tmp_path):
    """The coarse classes of torchvision's files are the fine classes' groups (superclasses for IIRC)."""
    base = tmp_path / "cifar" / "cifar-100-python"
    base.mkdir(parents=True)
    fine = list(range(100)) * 2
    with open(base / "train", "wb") as fh:
        pickle.dump({"data": np.zeros((200, 3072), dtype=np.uint8), "fine_labels": fine,
                     "coarse_labels": [f // 5 for f in fine]}, fh)
    with open(base / "test", "wb") as fh:  # every cifar-100-python/ has it; the groups are read from train
        pickle.dump({"data": np.zeros((100, 3072), dtype=np.uint8), "fine_labels": list(range(100))}, fh)
    with open(base / "meta", "wb") as fh:
        pickle.dump({"fine_label_names": [f"c{i}" for i in range(100)],
                     "coarse_label_names": [f"super{i}" for i in range(20)]}, fh)
    source = resolve_dataset(f"cifar100:{tmp_path / 'cifar'}")
    groups = source.metadata(source)[1]
    assert groups is not None and groups[:6] == ["super0"] * 5 + ["super1"] and len(set(groups)) == 20


@pytest.mark.parametrize("name", ["cifar100:/no/such/root", "imagefolder:/no/such/tree", "npz:/no/such.npz"])
def test_missing_roots_name_the_dataset_and_path(name):
    with pytest.raises(DatasetError, match="/no/such"):
        resolve_dataset(name).class_names


def config(datasets: dict, increments="5x2") -> ExperimentConfig:
    return ExperimentConfig.model_validate({"study": "s", "algorithm": "replay", "backbone": "resnet8",
                                            "scenario": {"increments": increments}, "datasets": datasets})


def test_omniglot_split_by_alphabet_keeps_alphabets_apart():
    resolved = resolve(config({"split": {"dataset": "omniglot-small", "by": "group", "seed": 0,
                                         "tuning_groups": ["Latin", "Greek"], "classes_per_phase": 10}}))
    groups = resolve_dataset("omniglot-small").class_groups
    assert {groups[c] for c in resolved.tuning.classes} <= {"Latin", "Greek"}
    assert not {groups[c] for c in resolved.evaluation.classes} & {"Latin", "Greek"}


def test_evaluation_groups_choose_the_evaluation_alphabets_and_keep_the_rest_out():
    split = {"dataset": "omniglot-small", "by": "group", "seed": 0, "tuning_groups": ["Greek"],
             "evaluation_groups": ["Balinese"]}
    resolved = resolve(config({"split": split}, increments="4x6"))
    groups = resolve_dataset("omniglot-small").class_groups
    assert {groups[c] for c in resolved.tuning.classes} == {"Greek"}
    assert {groups[c] for c in resolved.evaluation.classes} == {"Balinese"}
    with pytest.raises(ConfigError, match="datasets.split.evaluation_groups.*in both phases"):
        resolve(config({"split": {"dataset": "omniglot-small", "by": "group", "tuning_groups": ["Latin"],
                                  "evaluation_groups": ["Latin", "Greek"]}}))
    with pytest.raises(ConfigError, match="datasets.split.evaluation_groups.*unknown groups"):
        resolve(config({"split": {"dataset": "omniglot-small", "by": "group", "tuning_groups": ["Latin"],
                                  "evaluation_groups": ["Klingon"]}}))
    with pytest.raises(Exception, match="evaluation_groups needs tuning_groups"):
        config({"split": {"dataset": "omniglot-small", "by": "group", "evaluation_groups": ["Greek"]}})


def test_low_similarity_two_datasets():
    resolved = resolve(config({"tuning": {"dataset": "omniglot-small", "classes": list(range(10))},
                               "evaluation": {"dataset": "synthetic", "classes": list(range(10))}}))
    assert resolved.tuning.dataset == "omniglot-small" and resolved.evaluation.classes == tuple(range(10))
    with pytest.raises(ConfigError, match="outside"):
        resolve(config({"tuning": {"dataset": "synthetic", "classes": [0, 99]},
                        "evaluation": {"dataset": "omniglot-small", "classes": [0, 1]}}, increments=[2]))


def test_imagefolder_images_are_stored_as_torchvisions_resize_and_centre_crop(tmp_path):
    """Short side resized to the stored size (PIL's antialiased filter), then the centre square: what
    torchvision's Resize(256) + CenterCrop(256) make of a PIL image."""
    from torchvision import transforms

    from gtep.data.datasets import decode_square

    rng = np.random.default_rng(0)
    for w, h in ((60, 40), (40, 70)):
        path = tmp_path / f"{w}x{h}.png"
        Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)).save(path)
        for resample, mode in (("bilinear", transforms.InterpolationMode.BILINEAR),
                               ("bicubic", transforms.InterpolationMode.BICUBIC)):
            reference = transforms.Compose([transforms.Resize(24, interpolation=mode), transforms.CenterCrop(24)])
            with Image.open(path) as im:
                expected = np.asarray(reference(im.convert("RGB")))
            assert np.array_equal(decode_square(path, 24, resample), expected), (w, h, resample)


def test_imagefolder_is_decoded_once_and_memory_mapped(tmp_path, monkeypatch):
    import gtep.data.datasets as datasets

    monkeypatch.setenv("GTEP_CACHE", str(tmp_path / "cache"))
    make_imagefolder(tmp_path / "tree")
    first = resolve_dataset(f"imagefolder:{tmp_path / 'tree'}?size=20").load()
    assert isinstance(first.x_train, np.memmap) and first.x_train.shape == (9, 20, 20, 3)
    monkeypatch.setattr(datasets, "decode_square", lambda *a: pytest.fail("decoded twice"))
    again = resolve_dataset(f"imagefolder:{tmp_path / 'tree'}?size=20").load()
    assert np.array_equal(np.asarray(again.x_train), np.asarray(first.x_train))
    assert list(again.y_test) == [0, 0, 1, 1, 2, 2]
    with pytest.raises(pytest.fail.Exception, match="decoded twice"):  # a new size is a new decoding
        resolve_dataset(f"imagefolder:{tmp_path / 'tree'}?size=12").load()


def test_a_study_stores_imagefolder_images_at_its_pipelines_size(tmp_path):
    make_imagefolder(tmp_path / "tree", classes=("a", "b", "c", "d"))
    base = {"study": "s", "algorithm": "replay", "backbone": "resnet8", "scenario": {"increments": [2]},
            "datasets": {"split": {"dataset": f"imagefolder:{tmp_path / 'tree'}"}}}
    resolved = resolve(ExperimentConfig.model_validate(base))
    assert resolved.tuning.dataset.endswith("?size=256")
    assert resolved.pipeline("tune").describe() == "pycil-imagenet@224"
    small = resolve(ExperimentConfig.model_validate({**base, "training": {"image_size": 64}}))
    assert small.evaluation.dataset.endswith("?size=73") and small.pipeline("evaluate").size == 64
    vit = resolve(ExperimentConfig.model_validate({**base, "backbone": "vit_micro_patch4_32",
                                                   "training": {"augment": True}}))
    assert vit.pipeline("tune").describe() == "pilot@32" and vit.tuning.dataset.endswith("?size=32&resample=bicubic")
    legacy = resolve(ExperimentConfig.model_validate({**base, "training": {"augment": False}}))
    assert legacy.pipeline("tune").describe() == "none/pycil-imagenet@224"
    with pytest.raises(ValidationError, match="augment"):
        ExperimentConfig.model_validate({**base, "training": {"augment": "cutmix"}})
