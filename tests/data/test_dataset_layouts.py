"""Every dataset layout gtep reads in place, on a small fake tree made here in that layout exactly as the dataset
is distributed (docs/datasets.md), and the error that names what a nearly-right folder lacks."""
import pickle
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from gtep.data import DatasetError, resolve_dataset
from gtep.data.layouts import packaged_class_list

RNG = np.random.default_rng(0)


def image(path: Path, side: int = 12) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(RNG.integers(0, 255, (side, side + 2, 3), dtype=np.uint8)).save(path, format="JPEG")
    return path


def test_cifar100_python_folder_itself_or_its_parent(tmp_path):
    folder = tmp_path / "cifar-100-python"
    folder.mkdir()
    for split, n in (("train", 200), ("test", 100)):
        data = RNG.integers(0, 255, (n, 3072), dtype=np.uint8)
        with open(folder / split, "wb") as fh:
            pickle.dump({"data": data, "fine_labels": [i % 100 for i in range(n)],
                         "coarse_labels": [(i % 100) // 5 for i in range(n)]}, fh)
    with open(folder / "meta", "wb") as fh:
        pickle.dump({"fine_label_names": [f"c{i}" for i in range(100)],
                     "coarse_label_names": [f"s{i}" for i in range(20)]}, fh)
    for root in (tmp_path, folder):
        images = resolve_dataset(f"cifar100:{root}").load()
        assert images.num_classes == 100 and images.x_train.shape == (200, 32, 32, 3) and len(images.y_test) == 100
    # the rows are 1024 red, 1024 green, 1024 blue values, row-major
    raw = pickle.load(open(folder / "train", "rb"))["data"]
    assert images.x_train[3, 2, 5, 1] == raw[3, 1024 + 2 * 32 + 5]
    (folder / "test").unlink()
    with pytest.raises(DatasetError, match="lacks test"):
        resolve_dataset(f"cifar100:{tmp_path}").load()


def make_imagenet(root: Path, wnids=("n01440764", "n01443537", "n01484850"), labels="LOC_val_solution.csv"):
    """ILSVRC-2012: train/<wnid>/<wnid>_N.JPEG, a flat val/ILSVRC2012_val_0000000N.JPEG and Kaggle's labels file."""
    lines = ["ImageId,PredictionString"]
    for k, wnid in enumerate(wnids):
        for i in range(3):
            image(root / "train" / wnid / f"{wnid}_{i}.JPEG")
        for i in range(2):
            stem = f"ILSVRC2012_val_{2 * k + i + 1:08d}"
            image(root / "val" / f"{stem}.JPEG")
            lines.append(f"{stem},{wnid} 10 10 40 40")
    if labels == "val_labels.txt":  # "<image> <wnid>" lines
        lines = [f"{line.split(',')[0]}.JPEG {line.split(',')[1].split()[0]}" for line in lines[1:]]
    if labels:
        (root / labels).write_text("\n".join(lines) + "\n")


@pytest.mark.parametrize("labels", ["LOC_val_solution.csv", "val_labels.txt"])
def test_imagenet_train_folders_and_flat_val_with_its_labels_file(tmp_path, labels):
    make_imagenet(tmp_path / "imagenet", labels=labels)
    (tmp_path / "two.txt").write_text("n01484850\nn01440764\n")
    images = resolve_dataset(f"imagefolder:{tmp_path / 'imagenet'}?size=8&classes={tmp_path / 'two.txt'}").load()
    assert images.class_names == ["n01484850", "n01440764"]
    assert images.x_train.shape == (6, 8, 8, 3) and sorted(images.y_test.tolist()) == [0, 0, 1, 1]


def test_imagenet_flat_val_without_labels_names_the_file(tmp_path):
    make_imagenet(tmp_path / "imagenet", labels="")
    with pytest.raises(DatasetError, match="LOC_val_solution.csv"):
        resolve_dataset(f"imagefolder:{tmp_path / 'imagenet'}").facts


def test_imagenet100_class_lists_are_in_the_package():
    one, two = ([w for w in packaged_class_list(n).read_text().split()] for n in ("imagenet100-1", "imagenet100-2"))
    assert len(set(one)) == len(set(two)) == 100 and not set(one) & set(two)
    assert all(w.startswith("n") and len(w) == 9 for w in one + two)


def test_a_packaged_class_list_selects_imagenet100(tmp_path):
    wnids = packaged_class_list("imagenet100-1").read_text().split()
    make_imagenet(tmp_path / "imagenet", wnids=(*wnids[:2], "n09999999"))
    with pytest.raises(DatasetError, match="are not classes of"):  # the other 98 are missing from this tree
        resolve_dataset(f"imagefolder:{tmp_path / 'imagenet'}?classes=imagenet100-1").class_names
    with pytest.raises(DatasetError, match="imagenet100-2"):
        resolve_dataset(f"imagefolder:{tmp_path / 'imagenet'}?classes=imagenet100-9")


def make_classes(root: Path, classes=("n01443537", "n01484850", "n01494475"), per_class=10) -> None:
    """ImageNet-R / ImageNet-A as released: imagenet-r/<wnid>/*.jpg, no split."""
    for wnid in classes:
        for i in range(per_class):
            image(root / wnid / f"{i}.jpg")


def test_imagenet_r_as_released_is_split_seeded_80_20(tmp_path):
    make_classes(tmp_path / "imagenet-r")
    with pytest.raises(DatasetError, match=r"\?split=0"):
        resolve_dataset(f"imagefolder:{tmp_path / 'imagenet-r'}").facts
    facts = resolve_dataset(f"imagefolder:{tmp_path / 'imagenet-r'}?split=0").facts
    assert facts.train_counts.tolist() == [8, 8, 8] and facts.test_counts.tolist() == [2, 2, 2]
    one, again = (resolve_dataset(f"imagefolder:{tmp_path / 'imagenet-r'}?split=0&size=8").load() for _ in range(2))
    other = resolve_dataset(f"imagefolder:{tmp_path / 'imagenet-r'}?split=1&size=8").load()
    assert np.array_equal(one.x_test, again.x_test) and not np.array_equal(one.x_test, other.x_test)
    # the split is part of the dataset's name, so a study's manifest (its config) records it
    from gtep.config import ExperimentConfig

    cfg = ExperimentConfig.model_validate({"study": "r", "algorithm": "replay", "scenario": {"increments": "1x2"},
                                           "datasets": {"split": {"dataset": f"imagefolder:{tmp_path}/r?split=0"}}})
    assert "?split=0" in cfg.model_dump_json()


def test_split_is_refused_where_the_tree_has_its_own(tmp_path):
    make_imagenet(tmp_path / "imagenet")
    with pytest.raises(DatasetError, match="drop \\?split="):
        resolve_dataset(f"imagefolder:{tmp_path / 'imagenet'}?split=0").class_names


def make_cub(root: Path, classes=("001.Black_footed_Albatross", "002.Laysan_Albatross")) -> None:
    """CUB_200_2011/: images/<class>/*.jpg, images.txt, image_class_labels.txt, train_test_split.txt, classes.txt."""
    index, labels, split = [], [], []
    for c, name in enumerate(classes, start=1):
        for i in range(5):
            n = len(index) + 1
            image(root / "images" / name / f"{name[4:]}_{i}.jpg")
            index.append(f"{n} {name}/{name[4:]}_{i}.jpg")
            labels.append(f"{n} {c}")
            split.append(f"{n} {int(i < 3)}")
    (root / "classes.txt").write_text("".join(f"{c} {n}\n" for c, n in enumerate(classes, start=1)))
    for name, lines in (("images.txt", index), ("image_class_labels.txt", labels), ("train_test_split.txt", split)):
        (root / name).write_text("\n".join(lines) + "\n")


def test_cub_with_its_own_split_files(tmp_path):
    make_cub(tmp_path / "CUB_200_2011")
    source = resolve_dataset(f"imagefolder:{tmp_path / 'CUB_200_2011'}?size=8")
    assert source.class_names == ["001.Black_footed_Albatross", "002.Laysan_Albatross"]
    assert source.facts.train_counts.tolist() == [3, 3] and source.facts.test_counts.tolist() == [2, 2]
    assert source.load().x_test.shape == (4, 8, 8, 3)
    pilot = resolve_dataset(f"imagefolder:{tmp_path / 'CUB_200_2011'}?split=0").facts  # PILOT's 80/20, seeded
    assert pilot.train_counts.tolist() == [4, 4] and pilot.test_counts.tolist() == [1, 1]
    (tmp_path / "CUB_200_2011" / "train_test_split.txt").unlink()
    with pytest.raises(DatasetError, match="lacks train_test_split.txt"):
        resolve_dataset(f"imagefolder:{tmp_path / 'CUB_200_2011'}").class_names


def make_tinyimagenet(root: Path, wnids=("n01443537", "n01629819", "n01641577"), train=4, val=2) -> None:
    """tiny-imagenet-200/: wnids.txt, train/<wnid>/images/<wnid>_N.JPEG (+ boxes), val/images + val_annotations.txt."""
    (root / "wnids.txt").parent.mkdir(parents=True, exist_ok=True)
    (root / "wnids.txt").write_text("\n".join(wnids) + "\n")
    annotations = []
    for wnid in wnids:
        for i in range(train):
            image(root / "train" / wnid / "images" / f"{wnid}_{i}.JPEG", side=64)
        (root / "train" / wnid / f"{wnid}_boxes.txt").write_text("")
        for i in range(val):
            name = f"val_{len(annotations)}.JPEG"
            image(root / "val" / "images" / name, side=64)
            annotations.append(f"{name}\t{wnid}\t0\t0\t63\t63")
    (root / "val" / "val_annotations.txt").write_text("\n".join(annotations) + "\n")
    image(root / "test" / "images" / "test_0.JPEG", side=64)  # unlabelled, as released


def test_tinyimagenet_as_released(tmp_path):
    make_tinyimagenet(tmp_path / "tiny-imagenet-200")
    images = resolve_dataset(f"imagefolder:{tmp_path / 'tiny-imagenet-200'}?size=32").load()
    assert images.class_names == ["n01443537", "n01629819", "n01641577"]
    assert images.x_train.shape == (12, 32, 32, 3) and images.y_test.tolist() == [0, 0, 1, 1, 2, 2]
    (tmp_path / "tiny-imagenet-200" / "wnids.txt").unlink()
    with pytest.raises(DatasetError, match="lacks wnids.txt"):
        resolve_dataset(f"imagefolder:{tmp_path / 'tiny-imagenet-200'}").class_names


def test_a_folder_of_no_layout_says_what_it_looked_for(tmp_path):
    (tmp_path / "notes.txt").write_text("")
    with pytest.raises(DatasetError, match="none of the layouts.*notes.txt"):
        resolve_dataset(f"imagefolder:{tmp_path}").class_names


# ---------------------------------------------------------------- the presets on those trees (gtep check, no compute)

def check_preset(preset: str, tmp_path, monkeypatch) -> str:
    from typer.testing import CliRunner

    from gtep.cli import app

    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["check", "--preset", preset, "--output", str(tmp_path / "runs")])
    assert result.exit_code == 0, result.output + result.stderr
    return result.output


def make_cifar(folder: Path, per_class: int = 2) -> None:
    folder.mkdir(parents=True)
    for split in ("train", "test"):
        n = 100 * per_class
        with open(folder / split, "wb") as fh:
            pickle.dump({"data": RNG.integers(0, 255, (n, 3072), dtype=np.uint8),
                         "fine_labels": [i % 100 for i in range(n)]}, fh)
    with open(folder / "meta", "wb") as fh:
        pickle.dump({"fine_label_names": [f"c{i}" for i in range(100)]}, fh)


def test_the_cifar_and_imagenet_presets_read_the_trees_as_distributed(tmp_path, monkeypatch):
    """CIFAR100_ROOT is cifar-100-python/; IMAGENET100_1_ROOT and _2_ROOT are one ILSVRC-2012 tree with the
    shipped class lists (docs/datasets.md)."""
    make_cifar(tmp_path / "cifar-100-python")
    wnids = [w for n in ("imagenet100-1", "imagenet100-2") for w in packaged_class_list(n).read_text().split()]
    lines = ["ImageId,PredictionString"]
    for k, wnid in enumerate(wnids):
        for i in range(2):
            image(tmp_path / "ILSVRC2012" / "train" / wnid / f"{wnid}_{i}.JPEG", side=8)
        image(tmp_path / "ILSVRC2012" / "val" / f"ILSVRC2012_val_{k + 1:08d}.JPEG", side=8)
        lines.append(f"ILSVRC2012_val_{k + 1:08d},{wnid} 0 0 7 7")
    (tmp_path / "ILSVRC2012" / "LOC_val_solution.csv").write_text("\n".join(lines) + "\n")
    monkeypatch.setenv("CIFAR100_ROOT", str(tmp_path / "cifar-100-python"))
    monkeypatch.setenv("IMAGENET100_1_ROOT", f"{tmp_path / 'ILSVRC2012'}?classes=imagenet100-1")
    monkeypatch.setenv("IMAGENET100_2_ROOT", f"{tmp_path / 'ILSVRC2012'}?classes=imagenet100-2")
    assert "every pre-flight check passed" in check_preset("cifar50-10tasks", tmp_path, monkeypatch)
    out = check_preset("imagenet100-10tasks", tmp_path, monkeypatch)
    assert "every pre-flight check passed" in out and "pycil-imagenet" in out
    assert "every pre-flight check passed" in check_preset("imagenet50-cifar50-10tasks", tmp_path, monkeypatch)



def test_gtep_data_prepare_writes_tinyimagenet_as_the_npz_the_presets_read(tmp_path):
    from typer.testing import CliRunner

    from gtep.cli import app

    make_tinyimagenet(tmp_path / "tiny-imagenet-200", train=4, val=2)
    (tmp_path / "tiny-imagenet-200" / "words.txt").write_text("n01443537\tgoldfish, Carassius auratus\n")
    result = CliRunner().invoke(app, ["data", "prepare", "tinyimagenet", str(tmp_path / "tiny-imagenet-200"),
                                      str(tmp_path / "tiny.npz"), "--train-per-class", "3"])
    assert result.exit_code == 0, result.output + result.stderr
    images = resolve_dataset(f"npz:{tmp_path / 'tiny.npz'}").load()
    assert images.x_train.shape == (9, 32, 32, 3) and images.x_test.shape == (6, 32, 32, 3)
    assert images.class_names == ["goldfish", "n01629819", "n01641577"]
    (tmp_path / "empty").mkdir()  # the folder above the tree is read as the tree (tests/data/test_layouts.py)
    result = CliRunner().invoke(app, ["data", "prepare", "tinyimagenet", str(tmp_path / "empty"),
                                      str(tmp_path / "x.npz")])
    assert result.exit_code == 2 and "none of the layouts" in result.stderr, result.output + result.stderr
