"""The contract every registered dataset layout passes (gtep/data/layouts/), on a fake tree built here exactly as its
authors ship it, a few pixels an image: it is recognised as that layout, read whole (also from the folder above it),
and each of its files broken in turn (missing, truncated, garbled; each class folder emptied) is one line on stderr
through `gtep data prepare` naming the file, what is wrong and the fix, with exit 2 and nothing written.

Then the cases of issue 68 one by one: the ImageNet devkit and Kaggle trees, PILOT's split lists, the folder-above
rule, and data that used to be dropped without a word."""
from __future__ import annotations

import pickle
from pathlib import Path
from typing import Callable

import numpy as np
import pytest
import typer.main
import typer.testing
from PIL import Image
from typer.testing import CliRunner

from gtep.cli import app
from gtep.data import DatasetError, resolve_dataset
from gtep.data.layouts import LAYOUTS, Layout, LayoutError, locate, lookup, register

RNG = np.random.default_rng(0)
WNIDS = ("n01443537", "n01629819")
CUB_CLASSES = ("001.Black_footed_Albatross", "002.Laysan_Albatross")


def jpeg(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(RNG.integers(0, 255, (4, 6, 3), dtype=np.uint8)).save(path, format="JPEG")
    return path


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


# ---------------------------------------------------------------- one fake tree per layout, as shipped

def split_tree(root: Path) -> str:
    """PILOT's own download of ImageNet-R: train/<class>/ and test/<class>/."""
    for split in ("train", "test"):
        for wnid in WNIDS:
            jpeg(root / split / wnid / f"{split}_{wnid}.jpg")
    return ""


def imagenet_val(root: Path, val: Path) -> list[str]:
    """ILSVRC-2012's training folders and flat validation images; the stems of the validation images in order."""
    stems = []
    for k, wnid in enumerate(WNIDS):
        jpeg(root / "train" / wnid / f"{wnid}_{k}.JPEG")
        stems.append(f"ILSVRC2012_val_{k + 1:08d}")
        jpeg(val / f"{stems[-1]}.JPEG")
    return stems


def imagenet_solution(root: Path) -> str:
    stems = imagenet_val(root, root / "val")
    write(root / "LOC_val_solution.csv", "ImageId,PredictionString\n" +
          "".join(f"{s},{w} 1 1 3 3\n" for s, w in zip(stems, WNIDS)))
    return ""


def imagenet_pairs(root: Path) -> str:
    stems = imagenet_val(root, root / "val")
    write(root / "val_labels.txt", "".join(f"{s}.JPEG {w}\n" for s, w in zip(stems, WNIDS)))
    return ""


def imagenet_devkit(root: Path) -> str:
    """The devkit's ground truth: ILSVRC2012_IDs in validation-image order, named by the synsets file (ID order:
    here the second wnid is ID 1, as the devkit's order is not the sorted one)."""
    imagenet_val(root, root / "val")
    data = root / "ILSVRC2012_devkit_t12" / "data"
    write(data / "ILSVRC2012_synsets.txt", f"{WNIDS[1]} tailed frog\n{WNIDS[0]} goldfish\n")
    write(data / "ILSVRC2012_validation_ground_truth.txt", "2\n1\n")
    return ""


def imagenet_kaggle(root: Path) -> str:
    stems = imagenet_val(root / "ILSVRC" / "Data" / "CLS-LOC", root / "ILSVRC" / "Data" / "CLS-LOC" / "val")
    write(root / "LOC_synset_mapping.txt", "".join(f"{w} words\n" for w in WNIDS))
    write(root / "LOC_val_solution.csv", "ImageId,PredictionString\n" +
          "".join(f"{s},{w} 1 1 3 3 {w} 0 0 2 2\n" for s, w in zip(stems, WNIDS)))
    return ""


def tinyimagenet_tree(root: Path) -> str:
    write(root / "wnids.txt", "".join(f"{w}\n" for w in WNIDS))
    for k, wnid in enumerate(WNIDS):
        jpeg(root / "train" / wnid / "images" / f"{wnid}_0.JPEG")
        jpeg(root / "val" / "images" / f"val_{k}.JPEG")
    write(root / "val" / "val_annotations.txt", "".join(f"val_{k}.JPEG\t{w}\t0\t0\t3\t3\n"
                                                         for k, w in enumerate(WNIDS)))
    return ""


def cub_tree(root: Path) -> str:
    index, labels, split = [], [], []
    for c, name in enumerate(CUB_CLASSES, start=1):
        for i in range(2):
            n = len(index) + 1
            jpeg(root / "images" / name / f"{name[4:]}_{i}.jpg")
            index.append(f"{n} {name}/{name[4:]}_{i}.jpg\n")
            labels.append(f"{n} {c}\n")
            split.append(f"{n} {1 - i}\n")
    write(root / "classes.txt", "".join(f"{c} {n}\n" for c, n in enumerate(CUB_CLASSES, start=1)))
    for name, lines in (("images.txt", index), ("image_class_labels.txt", labels), ("train_test_split.txt", split)):
        write(root / name, "".join(lines))
    return ""


def classes_tree(root: Path) -> str:
    """ImageNet-R as released: one folder of class folders, read with a seeded split."""
    for wnid in WNIDS:
        for i in range(2):
            jpeg(root / wnid / f"art_{i}.jpg")
    return "?split=0"


def cifar_tree(root: Path) -> str:
    root.mkdir(parents=True)
    for split in ("train", "test"):
        with open(root / split, "wb") as fh:
            pickle.dump({"data": RNG.integers(0, 255, (3, 3072), dtype=np.uint8), "fine_labels": [0, 1, 2]}, fh)
    with open(root / "meta", "wb") as fh:
        pickle.dump({"fine_label_names": ["apple", "bee", "cloud"]}, fh)
    return ""


# layout -> (the folder its archive unpacks to, the builder) for each form it is shipped in
TREES: dict[str, list[tuple[str, Callable[[Path], str]]]] = {
    "split": [("imagenet-r-pilot", split_tree)],
    "imagenet": [("ILSVRC2012", imagenet_solution), ("ILSVRC2012", imagenet_pairs), ("ILSVRC2012", imagenet_devkit)],
    "imagenet-kaggle": [("imagenet-object-localization-challenge", imagenet_kaggle)],
    "tinyimagenet": [("tiny-imagenet-200", tinyimagenet_tree)],
    "cub": [("CUB_200_2011", cub_tree)],
    "classes": [("imagenet-r", classes_tree)],
    "cifar100": [("cifar-100-python", cifar_tree)],
}
CASES = [pytest.param(name, folder, build, id=f"{name}-{build.__name__}")
         for name in LAYOUTS for folder, build in TREES.get(name, [("", None)])]  # type: ignore[list-item]


def prepare(name: str, src: str, dest: Path, monkeypatch, cache: Path):
    """`gtep data prepare` through the CLI, its command tree built once a test (Typer builds it on every invoke)."""
    monkeypatch.setenv("GTEP_CACHE", str(cache))
    built = getattr(prepare, "command", None) or typer.main.get_command(app)
    prepare.command = built  # type: ignore[attr-defined]
    monkeypatch.setattr(typer.testing, "_get_command", lambda _: built)
    return CliRunner().invoke(app, ["data", "prepare", name, src, str(dest), "--size", "8"])


def breaks(tree: Path) -> list[tuple[str, Path]]:
    """Each file missing, truncated and garbled, and each folder of images emptied: one at a time."""
    files = sorted(p for p in tree.rglob("*") if p.is_file())
    folders = sorted({p.parent for p in files if p.suffix.lower() in (".jpg", ".jpeg")})
    return [(how, f) for f in files for how in ("missing", "truncated", "garbled")] + \
        [("emptied", folder) for folder in folders]


def broken(how: str, path: Path) -> Callable[[], None]:
    """Break `path` as `how` says; returns what puts it back."""
    if how == "emptied":
        kept = {f: f.read_bytes() for f in path.iterdir() if f.is_file()}
        for f in kept:
            f.unlink()
        return lambda: [f.write_bytes(b) for f, b in kept.items()] and None
    content = path.read_bytes()
    if how == "missing":
        path.unlink()
    else:
        path.write_bytes(content[:len(content) // 2] if how == "truncated" else b"\x00\xff\xfegarbage\x81\x00" * 8)
    return lambda: path.write_bytes(content)


def names_it(message: str, how: str, path: Path, tree: Path) -> bool:
    """The message names the broken file (or, for an image, its class folder; for a folder, the folder)."""
    if how == "emptied" or path.suffix.lower() in (".jpg", ".jpeg"):
        return path.name in message or str(path.parent) in message or str(path) in message
    return path.name in message


@pytest.mark.parametrize(("name", "folder", "build"), CASES)
def test_every_layout_is_read_as_shipped_and_each_broken_file_is_one_line(name, folder, build, tmp_path, monkeypatch):
    assert build is not None, f"layout {name!r} has no fake tree in TREES: add one as its authors ship it"
    tree = tmp_path / "data" / folder
    query = build(tree)
    assert locate(tree)[0].name == name and locate(tmp_path / "data")[1] == tree  # the folder above: one rule
    out = tmp_path / "out"
    out.mkdir()
    for src in (f"{tree}{query}", f"{tmp_path / 'data'}{query}"):
        done = prepare(name, src, out / "whole.npz", monkeypatch, tmp_path / "cache")
        assert done.exit_code == 0, done.output + done.stderr
        with np.load(out / "whole.npz") as whole:
            assert len(whole["class_names"]) in (2, 3) and len(whole["y_train"]) and len(whole["y_test"])
    (out / "whole.npz").unlink()
    for i, (how, path) in enumerate(breaks(tree)):
        restore = broken(how, path)
        try:
            result = prepare(name, f"{tree}{query}", out / f"{name}.npz", monkeypatch, tmp_path / f"cache{i}")
        finally:
            restore()
        what = f"{how} {path.relative_to(tree)}: exit {result.exit_code}\n{result.output}{result.stderr}"
        assert result.exit_code == 2, what
        message = result.stderr.strip()
        assert "\n" not in message and "Traceback" not in message, what
        assert names_it(message, how, path, tree) and "; " in message, what  # the file, what is wrong; the fix
        assert not any(out.iterdir()), what  # nothing written, not even a partial file


def test_registry_lookup_and_registering_twice():
    assert lookup("cub") is LAYOUTS["cub"] and [entry.fallback for entry in LAYOUTS.values()][-1]
    with pytest.raises(LayoutError, match="choose cifar100, cub"):
        lookup("coco")
    with pytest.raises(ValueError, match="registered twice"):
        register(Layout("cub", "again", lambda root: False, lambda root: []))


# ---------------------------------------------------------------- issue 68, one case at a time

def test_tinyimagenet_without_val_annotations_is_one_line_as_a_dataset_and_via_prepare(tmp_path, monkeypatch):
    tinyimagenet_tree(tmp_path / "tiny-imagenet-200")
    (tmp_path / "tiny-imagenet-200" / "val" / "val_annotations.txt").unlink()
    with pytest.raises(DatasetError, match=r"lacks val/val_annotations.txt; unzip tiny-imagenet-200.zip again"):
        resolve_dataset(f"imagefolder:{tmp_path / 'tiny-imagenet-200'}").facts
    result = prepare("tinyimagenet", str(tmp_path / "tiny-imagenet-200"), tmp_path / "t.npz", monkeypatch,
                     tmp_path / "cache")
    assert result.exit_code == 2 and "lacks val/val_annotations.txt" in result.stderr
    assert result.stderr.strip().count("\n") == 0 and not (tmp_path / "t.npz").exists()


def test_a_truncated_cifar_pickle_is_one_line_naming_it(tmp_path):
    cifar_tree(tmp_path / "cifar-100-python")
    train = tmp_path / "cifar-100-python" / "train"
    train.write_bytes(train.read_bytes()[:200])
    with pytest.raises(DatasetError, match=r"cifar-100-python/train: is truncated \(the pickle ends early\); unpack"):
        resolve_dataset(f"cifar100:{tmp_path}").load()


def test_a_cifar_folder_missing_only_meta_names_only_meta(tmp_path):
    cifar_tree(tmp_path / "cifar-100-python")
    (tmp_path / "cifar-100-python" / "meta").unlink()
    with pytest.raises(DatasetError, match=r"lacks meta; unpack") as err:
        resolve_dataset(f"cifar100:{tmp_path}").class_names
    assert str(err.value).split("lacks ")[1].split(";")[0] == "meta"


def test_prepare_refuses_a_folder_as_its_destination(tmp_path, monkeypatch):
    tinyimagenet_tree(tmp_path / "tiny-imagenet-200")
    (tmp_path / "out").mkdir()
    result = prepare("tinyimagenet", str(tmp_path / "tiny-imagenet-200"), tmp_path / "out", monkeypatch,
                     tmp_path / "cache")
    assert result.exit_code == 2 and "is a folder; give the .npz file to write, e.g." in result.stderr
    assert not any((tmp_path / "out").iterdir())


def test_an_empty_class_folder_is_named_by_its_wnid_and_refused_by_prepare(tmp_path, monkeypatch):
    tinyimagenet_tree(tmp_path / "tiny-imagenet-200")
    (tmp_path / "tiny-imagenet-200" / "train" / WNIDS[1] / "images" / f"{WNIDS[1]}_0.JPEG").unlink()
    result = prepare("tinyimagenet", str(tmp_path / "tiny-imagenet-200"), tmp_path / "t.npz", monkeypatch,
                     tmp_path / "cache")
    assert result.exit_code == 2 and f"class {WNIDS[1]} has no training images" in result.stderr, result.stderr
    assert "class 1" not in result.stderr and not (tmp_path / "t.npz").exists()


def test_validation_images_of_a_wnid_outside_wnids_txt_are_refused(tmp_path, monkeypatch):
    tinyimagenet_tree(tmp_path / "tiny-imagenet-200")
    annotations = tmp_path / "tiny-imagenet-200" / "val" / "val_annotations.txt"
    annotations.write_text(annotations.read_text().replace(WNIDS[1], "n09999999"))
    result = prepare("tinyimagenet", str(tmp_path / "tiny-imagenet-200"), tmp_path / "t.npz", monkeypatch,
                     tmp_path / "cache")
    assert result.exit_code == 2 and "as n09999999, which" in result.stderr and "wnids.txt does not list" in \
        result.stderr and not (tmp_path / "t.npz").exists()


def test_a_split_tree_with_a_test_class_train_lacks_is_refused(tmp_path):
    split_tree(tmp_path / "r")
    jpeg(tmp_path / "r" / "test" / "n09999999" / "x.jpg")
    with pytest.raises(DatasetError, match="n09999999: is a class folder train/ does not have"):
        resolve_dataset(f"imagefolder:{tmp_path / 'r'}").facts


def test_imagenet_devkit_ground_truth_labels_val_in_ilsvrc2012_id_order(tmp_path):
    imagenet_devkit(tmp_path / "ILSVRC2012")
    source = resolve_dataset(f"imagefolder:{tmp_path / 'ILSVRC2012'}?size=8")
    assert source.class_names == list(WNIDS)
    # val_00000001 has ID 2 = WNIDS[0] (the synsets file's second line); val_00000002 has ID 1 = WNIDS[1]
    assert source.facts.test_counts.tolist() == [1, 1]
    layout, folder = locate(tmp_path / "ILSVRC2012")
    listed = layout.files(folder, list(WNIDS), "test", {})  # type: ignore[misc]
    assert [(f.stem, label) for f, label in listed] == [("ILSVRC2012_val_00000001", 0), ("ILSVRC2012_val_00000002", 1)]
    (folder / "ILSVRC2012_devkit_t12" / "data" / "ILSVRC2012_validation_ground_truth.txt").write_text("2\n3\n")
    with pytest.raises(DatasetError, match="line 2 .* is not an ILSVRC2012_ID 1..2 of ILSVRC2012_synsets.txt"):
        resolve_dataset(f"imagefolder:{tmp_path / 'ILSVRC2012'}").facts


def test_imagenet_as_kaggle_ships_it_is_read_in_place(tmp_path):
    imagenet_kaggle(tmp_path / "kaggle")
    source = resolve_dataset(f"imagefolder:{tmp_path / 'kaggle'}?size=8")
    assert locate(tmp_path / "kaggle")[0].name == "imagenet-kaggle" and source.class_names == list(WNIDS)
    images = source.load()
    assert images.x_train.shape == (2, 8, 8, 3) and images.y_test.tolist() == [0, 1]


def pilot_list(tmp_path: Path, lines: list[str]) -> Path:
    write(tmp_path / "split.txt", "".join(f"{line}\n" for line in lines))
    return tmp_path / "split.txt"


def test_pilots_split_lists_give_imagenet_r_and_cub_pilots_images(tmp_path):
    """PILOT reads data/imagenet-r/train/ and test/ (its download); the list of that download splits the release."""
    classes_tree(tmp_path / "imagenet-r")
    listing = pilot_list(tmp_path, [f"train/{WNIDS[0]}/art_1.jpg", f"test/{WNIDS[0]}/art_0.jpg",
                                    f"./train/{WNIDS[1]}/art_0.jpg", f"imagenet-r/test/{WNIDS[1]}/art_1.jpg"])
    source = resolve_dataset(f"imagefolder:{tmp_path / 'imagenet-r'}?split={listing}")
    layout, folder = locate(tmp_path / "imagenet-r")
    test = layout.files(folder, list(WNIDS), "test", source.options)  # type: ignore[misc]
    assert [(f.parent.name, f.name) for f, _ in test] == [(WNIDS[0], "art_0.jpg"), (WNIDS[1], "art_1.jpg")]
    assert source.facts.train_counts.tolist() == [1, 1]
    pilot_list(tmp_path, [f"train/{WNIDS[0]}/art_1.jpg", f"test/{WNIDS[0]}/art_0.jpg", f"train/{WNIDS[1]}/art_0.jpg"])
    with pytest.raises(DatasetError, match=f"{WNIDS[1]}/art_1.jpg: is in neither split of .*split.txt"):
        resolve_dataset(f"imagefolder:{tmp_path / 'imagenet-r'}?split={listing}").facts
    pilot_list(tmp_path, [f"train/{WNIDS[0]}/art_9.jpg"])
    with pytest.raises(DatasetError, match=f"lists train/{WNIDS[0]}/art_9.jpg, which .* does not have"):
        resolve_dataset(f"imagefolder:{tmp_path / 'imagenet-r'}?split={listing}").facts
    cub_tree(tmp_path / "CUB_200_2011")  # PILOT's cub/train/<class>/ has the release's class folders and files
    pilot_list(tmp_path, [f"{s}/{c}/{c[4:]}_{i}.jpg" for c in CUB_CLASSES for i, s in ((0, "test"), (1, "train"))])
    facts = resolve_dataset(f"imagefolder:{tmp_path / 'CUB_200_2011'}?split={listing}").facts
    assert facts.train_counts.tolist() == [1, 1] and facts.test_counts.tolist() == [1, 1]
    with pytest.raises(DatasetError, match="neither a seed .* nor an existing file"):
        resolve_dataset(f"imagefolder:{tmp_path / 'CUB_200_2011'}?split=nosuchfile.txt")


def test_the_folder_above_cub_is_read_and_two_datasets_are_not_guessed(tmp_path):
    cub_tree(tmp_path / "cub" / "CUB_200_2011")
    (tmp_path / "cub" / "CUB_200_2011.tgz").write_bytes(b"archive")  # a file beside it does not count
    assert resolve_dataset(f"imagefolder:{tmp_path / 'cub'}").class_names == list(CUB_CLASSES)
    tinyimagenet_tree(tmp_path / "cub" / "tiny-imagenet-200")
    with pytest.raises(DatasetError, match="holds several datasets .*CUB_200_2011/ \\(cub\\), tiny-imagenet-200/"):
        resolve_dataset(f"imagefolder:{tmp_path / 'cub'}").class_names


def test_a_cifar_tree_named_as_an_imagefolder_says_which_scheme_reads_it(tmp_path):
    cifar_tree(tmp_path / "cifar-100-python")
    with pytest.raises(DatasetError, match="which the scheme cifar100: reads; name it cifar100:"):
        resolve_dataset(f"imagefolder:{tmp_path / 'cifar-100-python'}").class_names
