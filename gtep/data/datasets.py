"""Dataset sources. Every source loads to an ImageSet of uint8 NHWC RGB arrays with integer labels.

A dataset is named by a string: a registered name ("omniglot-small", "synthetic") or a scheme with a
path ("npz:/data/tinyimagenet200_32.npz", "cifar100:/data/cifar", "imagefolder:/data/imagenet100").
Nothing here downloads: a missing file or root is a DatasetError naming the dataset and the path.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Callable

import numpy as np

from gtep.data.layouts import Layout, LayoutError, locate, packaged_class_list, packaged_class_lists
from gtep.data.layouts import cifar100 as cifar_layout
from gtep.registry import Registry

BUNDLED = Path(__file__).parent / "bundled"


class DatasetError(ValueError):
    """A dataset that cannot be found or read, with the path and the fix."""


@dataclass
class ImageSet:
    """Decoded images of one dataset: x_* uint8 (N, H, W, 3), y_* int64 class ids in [0, num_classes)."""

    name: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    class_names: list[str]
    class_groups: list[str] | None = None
    # what the loader converted to reach uint8 pixels ("" when the file held them): logged and recorded per run
    conversion: str = ""
    # each training image's position in the dataset's own training arrays (None: these are those arrays); a
    # benchmark's index files (FSCIL's shot_index) are in that index space, whatever subset a phase keeps
    train_index: np.ndarray | None = None

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    def dataset_train_index(self) -> np.ndarray:
        """Positions of these training images in the dataset's training arrays."""
        return np.arange(len(self.y_train)) if self.train_index is None else self.train_index

    def subset(self, classes: list[int]) -> "ImageSet":
        """Only the images of the given classes; labels stay the dataset's own class ids."""
        keep = np.asarray(sorted(classes))
        train, test = np.isin(self.y_train, keep), np.isin(self.y_test, keep)
        return ImageSet(self.name, self.x_train[train], self.y_train[train], self.x_test[test],
                        self.y_test[test], self.class_names, self.class_groups, self.conversion,
                        self.dataset_train_index()[train])


def to_uint8_pixels(x: np.ndarray, where: str) -> tuple[np.ndarray, str]:
    """Images as uint8 pixels, and what was done to get there ("" when nothing).

    uint8 is taken as it is. Floats in [0, 1] are scaled by 255 and floats in [0, 255] (or integers in 0..255) are
    rounded, each said in the returned note: a silent cast would turn [0, 1] pixels into a black dataset. NaN or
    infinity, negative values (normalised images) and values above 255 are refused with the fix."""
    fix = "store uint8 pixels (0..255) or floats in [0, 1]"
    if x.dtype == np.uint8:
        return x, ""
    if x.dtype == np.bool_ or not (np.issubdtype(x.dtype, np.integer) or np.issubdtype(x.dtype, np.floating)):
        raise DatasetError(f"{where} holds {x.dtype} values, not image pixels; {fix}")
    if x.size == 0:
        return x.astype(np.uint8), ""
    if np.issubdtype(x.dtype, np.floating):
        finite = np.isfinite(x)
        if not finite.all():
            bad = int(x.size - finite.sum())
            raise DatasetError(f"{where} holds {bad} NaN or infinite values; {fix} (without NaN)")
    low, high = float(x.min()), float(x.max())
    if low < 0 or high > 255:
        hint = " (it looks normalised by a mean and std)" if low < 0 else ""
        raise DatasetError(f"{where} ranges over [{low:g}, {high:g}]{hint}; {fix}")
    if np.issubdtype(x.dtype, np.floating) and high <= 1.0:
        return np.rint(x * 255.0).astype(np.uint8), f"{where}: {x.dtype} in [0, 1] scaled by 255 to uint8"
    return np.rint(x).astype(np.uint8), f"{where}: {x.dtype} in [0, 255] rounded to uint8"


def check_image_set(images: ImageSet, where: str) -> None:
    """What every loader hands on: uint8 images N x H x W x 3, one integer label per image, labels in
    0..classes-1, train and test images of one size. A DatasetError names the array and the fix."""
    for split in ("train", "test"):
        x, y = getattr(images, f"x_{split}"), getattr(images, f"y_{split}")
        if x.dtype != np.uint8 or x.ndim != 4 or x.shape[-1] != 3 or 0 in x.shape[1:]:
            raise DatasetError(f"{where}: x_{split} is {x.dtype} {tuple(x.shape)}; it must be uint8 images "
                               "N x H x W x 3 (RGB)")
        if y.ndim != 1 or len(y) != len(x):
            raise DatasetError(f"{where}: y_{split} has {len(y)} labels for {len(x)} images in x_{split}; "
                               "give one integer class id per image")
        if not np.issubdtype(y.dtype, np.integer):
            raise DatasetError(f"{where}: y_{split} is {y.dtype}; give integer class ids")
        if len(y) and (y.min() < 0 or y.max() >= images.num_classes):
            raise DatasetError(f"{where}: y_{split} has class ids in [{y.min()}, {y.max()}] but the dataset "
                               f"names {images.num_classes} classes; give ids 0..{images.num_classes - 1}")
    if images.x_train.shape[1:] != images.x_test.shape[1:]:
        raise DatasetError(f"{where}: training images are {images.x_train.shape[1:3]} but test images "
                           f"{images.x_test.shape[1:3]}; store both splits at one size")


@dataclass(frozen=True)
class DataFacts:
    """What the pre-flight checks need of a dataset without its pixels: images per class id in each split, the
    stored image shape (H, W, 3) and what the loader converts (see to_uint8_pixels)."""

    train_counts: np.ndarray
    test_counts: np.ndarray
    image_shape: tuple[int, ...]
    conversion: str = ""
    train_labels: np.ndarray | None = None  # the training labels, for index files into the training arrays

    @classmethod
    def of(cls, images: ImageSet) -> "DataFacts":
        n = images.num_classes
        return cls(np.bincount(images.y_train, minlength=n), np.bincount(images.y_test, minlength=n),
                   tuple(images.x_train.shape[1:]), images.conversion, images.y_train)


@dataclass
class DatasetSource:
    """What a dataset name resolves to: cheap metadata for validation, and a loader for the arrays."""

    name: str
    path: Path | None
    loader: Callable[["DatasetSource"], ImageSet]
    metadata: Callable[["DatasetSource"], tuple[list[str], list[str] | None]]
    options: dict = field(default_factory=dict)
    inspect: Callable[["DatasetSource"], "DataFacts"] | None = None  # cheaper than load() where it can be

    @property
    def root(self) -> Path:
        """The file or folder the loader reads: every source has one but the generated `synthetic`."""
        if self.path is None:
            raise DatasetError(f"dataset {self.name!r} is generated; it has no file or folder")
        return self.path

    def check(self) -> None:
        if self.path is not None and not self.path.exists():
            raise DatasetError(f"dataset {self.name!r}: {self.path} does not exist; "
                               "check the path (nothing is downloaded)")

    @cached_property
    def class_names(self) -> list[str]:
        self.check()
        return self.metadata(self)[0]

    @cached_property
    def class_groups(self) -> list[str] | None:
        self.check()
        return self.metadata(self)[1]

    @property
    def identity(self) -> str:
        """Two phases using the same identity draw from the same class pool (their classes must not overlap)."""
        return f"{self.name.split(':')[0]}:{self.path.resolve()}" if self.path else self.name

    def load(self) -> ImageSet:
        self.check()
        images = self.loader(self)
        check_image_set(images, f"dataset {self.name!r}")
        return images

    @cached_property
    def facts(self) -> "DataFacts":
        """Images per class and split, the image shape and any conversion, as cheaply as the source allows (an
        npz file: its labels and array headers; a float array is read to check its range)."""
        self.check()
        if self.inspect is not None:
            return self.inspect(self)
        return DataFacts.of(self.load())


# plugins: the gtep.datasets entry points (gtep.plugins), loaded at the first lookup
DATASETS: Registry[Callable[[str], DatasetSource]] = Registry("dataset", group="gtep.datasets")


def resolve_dataset(name: str) -> DatasetSource:
    """'omniglot-small' | 'synthetic[:classes]' | 'npz:PATH' | 'cifar100:ROOT' | 'imagefolder:ROOT[?classes=FILE]'."""
    scheme, _, rest = name.partition(":")
    try:
        factory = DATASETS.get(scheme)
    except KeyError as err:
        raise DatasetError(f"{err.args[0]} (or a scheme with a path, e.g. 'npz:/path/file.npz')") from None
    return factory(rest)


# ---------------------------------------------------------------- npz files (and the bundled Omniglot)

def _to_rgb(x: np.ndarray, invert: bool, where: str) -> tuple[np.ndarray, str]:
    """uint8 RGB pixels (greyscale repeated), and the conversion note of to_uint8_pixels."""
    x, note = to_uint8_pixels(x, where)
    if invert:  # Omniglot is dark strokes on white; bright strokes on black suits zero padding and crops
        x = 255 - x
    if x.ndim == 3:
        x = np.repeat(x[..., None], 3, axis=-1)
    return np.ascontiguousarray(x), note


NPZ_ARRAYS = ("x_train", "y_train", "x_test", "y_test")


def _npz_header(archive, key: str) -> tuple[tuple[int, ...], np.dtype]:
    """An array's shape and dtype from its .npy header inside the archive, without reading the array."""
    with archive.zip.open(f"{key}.npy") as fh:
        version = np.lib.format.read_magic(fh)
        read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, _, dtype = read(fh)
        return tuple(shape), dtype


def check_npz(source: DatasetSource) -> None:
    """The file is an .npz archive (numpy.savez) holding x_train, y_train, x_test, y_test, with images N x H x W x 3
    (or greyscale N x H x W) and one label per image. Reads only the arrays' headers."""
    import zipfile

    path, where = source.root, f"dataset {source.name!r}"
    fix = "write it with numpy.savez(x_train=..., y_train=..., x_test=..., y_test=...)"
    if path.is_dir():
        raise DatasetError(f"{where}: {path} is a folder; give an .npz file (a folder of images is 'imagefolder:')")
    try:
        archive = np.load(path, allow_pickle=False)
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as err:
        raise DatasetError(f"{where}: {path} is not an .npz file ({err.__class__.__name__}); {fix}") from None
    if not isinstance(archive, np.lib.npyio.NpzFile):
        raise DatasetError(f"{where}: {path} holds a single array, not an .npz archive of arrays; {fix}")
    with archive:
        missing = [k for k in NPZ_ARRAYS if k not in archive.files]
        if missing:
            raise DatasetError(f"{where}: {path} lacks the arrays {missing} (it has {sorted(archive.files)}); {fix}")
        try:
            headers = {k: _npz_header(archive, k) for k in NPZ_ARRAYS}
        except (ValueError, KeyError, OSError, zipfile.BadZipFile) as err:
            raise DatasetError(f"{where}: {path} has an unreadable array ({err}); {fix}") from None
    for split in ("train", "test"):
        (x, x_dtype), (y, _) = headers[f"x_{split}"], headers[f"y_{split}"]
        if x_dtype.kind not in "uif":
            raise DatasetError(f"{where}: x_{split} holds {x_dtype} values, not image pixels; store uint8 pixels "
                               "(0..255) or floats in [0, 1]")
        if not (len(x) == 3 or (len(x) == 4 and x[3] == 3)) or 0 in x:
            raise DatasetError(f"{where}: x_{split} has shape {x}; it must be images N x H x W x 3 (RGB) or "
                               "N x H x W (greyscale), uint8")
        if len(y) != 1 or y[0] != x[0]:
            raise DatasetError(f"{where}: y_{split} has shape {y} for {x[0]} images in x_{split}; "
                               "give one integer class id per image")
    if headers["x_train"][0][1:3] != headers["x_test"][0][1:3]:
        raise DatasetError(f"{where}: x_train images are {headers['x_train'][0][1:3]} but x_test images "
                           f"{headers['x_test'][0][1:3]}; store both splits at one size")
    with np.load(path, allow_pickle=False) as archive:
        try:
            labels = {k: archive[k] for k in ("y_train", "y_test")}
            named = len(archive["class_names"]) if "class_names" in archive.files else None
            groups = [len(archive[k]) for k in ("class_alphabet", "class_groups") if k in archive.files]
        except ValueError as err:  # object arrays: numpy refuses to unpickle them
            raise DatasetError(f"{where}: {path} stores Python objects ({err.__class__.__name__}); save labels as "
                               "integer arrays and names as str arrays (np.array(names, dtype=str))") from None
    wrong = [n for n in groups if named is not None and n != named]
    if wrong:
        raise DatasetError(f"{where}: class_groups (or class_alphabet) lists {wrong[0]} entries for {named} "
                           "class_names; give one group per class")
    for key, y in labels.items():
        if not np.issubdtype(y.dtype, np.integer) or y.min() < 0:
            raise DatasetError(f"{where}: {key} must hold integer class ids from 0 (it is {y.dtype}, "
                               f"min {y.min()}); give one integer class id per image")
        if named is not None and y.max() >= named:
            raise DatasetError(f"{where}: {key} has class id {y.max()} but class_names lists {named} classes; "
                               "give ids 0..len(class_names)-1")
    if named is None and labels["y_test"].max() > labels["y_train"].max():
        raise DatasetError(f"{where}: y_test has class id {labels['y_test'].max()}, which y_train never has; "
                           "give every class training images (or store class_names)")


def _npz_metadata(source: DatasetSource) -> tuple[list[str], list[str] | None]:
    check_npz(source)
    with np.load(source.root) as data:
        if "class_names" in data.files:
            names = [str(n) for n in data["class_names"]]
        else:
            names = [str(i) for i in range(int(data["y_train"].max()) + 1)]
        groups = None
        for key in ("class_alphabet", "class_groups"):
            if key in data.files:
                groups = [str(g) for g in data[key]]
    return names, groups


def _load_npz(source: DatasetSource) -> ImageSet:
    names, groups = _npz_metadata(source)
    with np.load(source.root) as data:
        missing = {"x_train", "y_train", "x_test", "y_test"} - set(data.files)
        if missing:
            raise DatasetError(f"dataset {source.name!r}: {source.path} lacks arrays {sorted(missing)}")
        invert = bool(source.options.get("invert", False))
        x_train, train_note = _to_rgb(data["x_train"], invert, f"{source.path}: x_train")
        x_test, test_note = _to_rgb(data["x_test"], invert, f"{source.path}: x_test")
        conversion = "; ".join(filter(None, (train_note, test_note)))
        return ImageSet(source.name, x_train, data["y_train"].astype(np.int64), x_test,
                        data["y_test"].astype(np.int64), names, groups, conversion)


def _npz_facts(source: DatasetSource) -> "DataFacts":
    """Labels and array headers; a non-uint8 image array is read once to check (and describe) its conversion."""
    names, _ = _npz_metadata(source)
    notes: list[str] = []
    shape: tuple[int, ...] = ()
    with np.load(source.root) as data:
        labels = {k: data[k].astype(np.int64) for k in ("y_train", "y_test")}
        for key in ("x_train", "x_test"):
            key_shape, dtype = _npz_header(data, key)
            if dtype != np.uint8:
                notes.append(to_uint8_pixels(data[key], f"{source.path}: {key}")[1])
            shape = shape or (*key_shape[1:3], 3)
    n = len(names)
    return DataFacts(np.bincount(labels["y_train"], minlength=n), np.bincount(labels["y_test"], minlength=n),
                     tuple(shape), "; ".join(filter(None, notes)), labels["y_train"])


@DATASETS.register("npz")
def npz_dataset(path: str) -> DatasetSource:
    if not path:
        raise DatasetError("dataset 'npz:' needs a path, e.g. 'npz:../shared/data/tinyimagenet200_32.npz'")
    p = Path(os.path.expanduser(path))
    # Greyscale files shaped like omniglot_small_32.npz have white backgrounds; invert them like the bundled set.
    return DatasetSource(f"npz:{path}", p, _load_npz, _npz_metadata, {"invert": "omniglot" in p.name}, _npz_facts)


@DATASETS.register("omniglot-small")
def omniglot_small(_: str = "") -> DatasetSource:
    """Bundled: 242 Omniglot characters of 8 alphabets, 15 train / 5 test each, 32x32 (MIT, Lake et al.)."""
    return DatasetSource("omniglot-small", BUNDLED / "omniglot_small_32.npz", _load_npz, _npz_metadata,
                         {"invert": True}, _npz_facts)


# ---------------------------------------------------------------- synthetic (unit tests)

def _synthetic_metadata(source: DatasetSource) -> tuple[list[str], list[str] | None]:
    n = source.options["classes"]
    return [f"class{i}" for i in range(n)], [f"group{i % 4}" for i in range(n)]


def _load_synthetic(source: DatasetSource) -> ImageSet:
    """Each class is a fixed random 8x8 colour pattern, upsampled to 16x16, plus per-image noise: learnable
    by a small CNN in a few epochs, so tests can check learning and forgetting quickly."""
    o = source.options
    rng = np.random.default_rng(o["seed"])
    n, size = o["classes"], o["size"]
    protos = rng.uniform(0, 255, size=(n, 8, 8, 3))
    protos = np.repeat(np.repeat(protos, size // 8, axis=1), size // 8, axis=2)

    def draw(per_class: int) -> tuple[np.ndarray, np.ndarray]:
        y = np.repeat(np.arange(n), per_class)
        x = protos[y] + rng.normal(0, o["noise"], size=(len(y), size, size, 3))
        return np.clip(x, 0, 255).astype(np.uint8), y.astype(np.int64)

    x_train, y_train = draw(o["train"])
    x_test, y_test = draw(o["test"])
    names, groups = _synthetic_metadata(source)
    return ImageSet(source.name, x_train, y_train, x_test, y_test, names, groups)


@DATASETS.register("synthetic")
def synthetic(spec: str = "") -> DatasetSource:
    """'synthetic' or 'synthetic:classes=20,train=30,test=10,size=16,noise=40,seed=0'."""
    options = {"classes": 20, "train": 30, "test": 10, "size": 16, "noise": 40.0, "seed": 0}
    for item in filter(None, spec.split(",")):
        key, _, value = item.partition("=")
        if key not in options:
            raise DatasetError(f"synthetic dataset option {key!r} is unknown; choose from {sorted(options)}")
        try:
            options[key] = type(options[key])(value)
        except ValueError:
            raise DatasetError(f"synthetic dataset option {key}={value!r} is not a number; "
                               f"write e.g. 'synthetic:classes=20,train=30'") from None
    for key in ("classes", "train", "test"):
        if options[key] < 1:
            raise DatasetError(f"synthetic dataset option {key}={options[key]} must be at least 1")
    if options["size"] < 8 or options["size"] % 8:
        raise DatasetError(f"synthetic dataset option size={options['size']} must be a multiple of 8 (8, 16, 32...)")
    if options["noise"] < 0:
        raise DatasetError(f"synthetic dataset option noise={options['noise']} must be >= 0")
    name = f"synthetic:{spec}" if spec else "synthetic"
    return DatasetSource(name, None, _load_synthetic, _synthetic_metadata, options)


# ---------------------------------------------------------------- CIFAR-100 from a local torchvision root

def _located(source: DatasetSource, scheme: str) -> tuple[Layout, Path]:
    """The layout of the source's root and the folder to read (the root, or the one dataset folder it holds); a
    LayoutError becomes the DatasetError naming the dataset."""
    try:
        return locate(source.root, scheme)
    except LayoutError as err:
        raise DatasetError(f"dataset {source.name!r}: {err}") from None


def _cifar_folder(source: DatasetSource) -> Path:
    """The cifar-100-python/ folder (extracted from cifar-100-python.tar.gz): the root itself or its child."""
    return _located(source, "cifar100")[1]


def _cifar_metadata(source: DatasetSource) -> tuple[list[str], list[str] | None]:
    folder = _cifar_folder(source)
    try:
        return cifar_layout.classes(folder), cifar_layout.coarse_groups(folder)
    except LayoutError as err:
        raise DatasetError(f"dataset {source.name!r}: {err}") from None


def _load_cifar(source: DatasetSource) -> ImageSet:
    """The python version's pickles (gtep/data/layouts/cifar100.py)."""
    names, _ = _cifar_metadata(source)
    folder = _cifar_folder(source)
    try:
        train, test = cifar_layout.arrays(folder, "train"), cifar_layout.arrays(folder, "test")
    except LayoutError as err:
        raise DatasetError(f"dataset {source.name!r}: {err}") from None
    return ImageSet(source.name, *train, *test, names)


@DATASETS.register("cifar100")
def cifar100(root: str) -> DatasetSource:
    """'cifar100:ROOT': ROOT is cifar-100-python/ (meta, train, test) or the folder that holds it."""
    if not root:
        raise DatasetError("dataset 'cifar100:' needs the folder cifar-100-python/ (or the one holding it), "
                           "e.g. 'cifar100:~/data'")
    return DatasetSource(f"cifar100:{root}", Path(os.path.expanduser(root)), _load_cifar, _cifar_metadata)


# ---------------------------------------------------------------- ImageFolder trees

def _layout(source: DatasetSource) -> tuple[Layout, Path]:
    """The layout of an `imagefolder:` root and the folder to read (the root, or the one dataset folder it holds)."""
    layout, folder = _located(source, "imagefolder")
    if "split" in source.options and not layout.takes_split:
        raise DatasetError(f"dataset {source.name!r}: {folder} has its own train/test split ({layout.name} "
                           "layout); drop ?split=, which splits one folder of class folders (ImageNet-R/A as released) "
                           "or CUB-200-2011 in PILOT's proportions or by PILOT's lists")
    return layout, folder


def _split_files(source: DatasetSource, names: list[str], split: str) -> list[tuple[Path, int]]:
    """The image files of one split ("train" or "test") with their labels, as the root's layout gives them."""
    layout, folder = _layout(source)
    assert layout.files is not None  # imagefolder: reads only the layouts of image files
    try:
        return layout.files(folder, names, split, source.options)
    except LayoutError as err:
        raise DatasetError(f"dataset {source.name!r}: {err}") from None


def _imagefolder_metadata(source: DatasetSource) -> tuple[list[str], list[str] | None]:
    layout, folder = _layout(source)
    try:
        present = layout.classes(folder)
    except LayoutError as err:
        raise DatasetError(f"dataset {source.name!r}: {err}") from None
    class_file = source.options.get("classes")
    if class_file:
        listed = [line.split()[0] for line in Path(class_file).read_text().splitlines() if line.strip()]
        missing = sorted(set(listed) - set(present))
        if missing:
            raise DatasetError(f"dataset {source.name!r}: classes {missing[:5]} of {class_file} "
                               f"are not classes of {folder}")
        return listed, None
    return present, None


def cache_root() -> Path:
    """Where decoded ImageFolder arrays (and the empty MLflow store template) are kept: $GTEP_CACHE, else
    ~/.cache/gtep."""
    return Path(os.environ.get("GTEP_CACHE") or Path.home() / ".cache" / "gtep")


def decode_square(path: Path, side: int, resample: str) -> np.ndarray:
    """torchvision's Resize(side) (the short side, PIL's antialiased filter) then CenterCrop(side): the square
    the test view is cut from and the training crops are drawn from."""
    from PIL import Image

    with Image.open(path) as file:
        rgb = file.convert("RGB")
    w, h = rgb.size
    scale = side / min(w, h)
    size = (side, max(side, int(h * scale))) if w <= h else (max(side, int(w * scale)), side)  # as torchvision
    resized = rgb.resize(size, Image.Resampling.BICUBIC if resample == "bicubic" else Image.Resampling.BILINEAR)
    left, top = round((size[0] - side) / 2.0), round((size[1] - side) / 2.0)
    return np.asarray(resized.crop((left, top, left + side, top + side)))


def _listing_key(source: DatasetSource, names: list[str], side: int, resample: str) -> str:
    """What the decoded arrays depend on: the root, the classes, the size, the filter, and each class folder's
    file count and modification time (adding or replacing images changes it); for the layouts that list their
    images in index files (ImageNet's flat val/, Tiny ImageNet, CUB, a seeded split), the file lists themselves."""
    import hashlib
    import json

    layout, root = _layout(source)
    folders: list = []
    if layout.name == "split":
        for split in ("train", "val", "test"):
            for name in names:
                folder = root / split / name
                if folder.is_dir():
                    folders.append([split, name, len(os.listdir(folder)), folder.stat().st_mtime_ns])
    else:
        listing = hashlib.sha256()
        for split in ("train", "test"):
            for f, label in _split_files(source, names, split):
                listing.update(f"{split}\t{f}\t{label}\n".encode())
        index = [[n, (root / n).stat().st_size, (root / n).stat().st_mtime_ns]
                 for n in layout.index_files if (root / n).exists()]
        folders = [layout.name, source.options.get("split"), index, listing.hexdigest()]
    payload = json.dumps([str(source.root.resolve()), names, side, resample, folders])
    return hashlib.sha256(payload.encode()).hexdigest()[:20]


def _decode_split(source: DatasetSource, split: str, names: list[str], side: int, resample: str,
                  out: Path) -> np.ndarray:
    """Every image of one split into the .npy file `out`, one at a time; returns the labels."""
    files = _split_files(source, names, split)
    if not files:
        raise DatasetError(f"dataset {source.name!r}: no {split} images under {source.root}")
    x = np.lib.format.open_memmap(out, mode="w+", dtype=np.uint8, shape=(len(files), side, side, 3))
    for i, (f, _) in enumerate(files):
        try:
            x[i] = decode_square(f, side, resample)
        except Exception as err:  # noqa: BLE001 - PIL raises many kinds for a damaged file (SyntaxError: PNG)
            raise DatasetError(f"dataset {source.name!r}: {f}: is not a readable image ({err.__class__.__name__}: "
                               "truncated or garbled); remove or replace it") from None
    x.flush()
    return np.asarray([label for _, label in files], dtype=np.int64)


def _load_imagefolder(source: DatasetSource) -> ImageSet:
    """Decoded once per (tree, size, filter) into uint8 .npy files under cache_root(), then memory-mapped: a
    phase's images are paged in as tasks use them instead of being held in memory."""
    import shutil
    import tempfile

    names, _ = _imagefolder_metadata(source)
    side = int(source.options.get("size", 256))  # Resize(256): what a 224 px pipeline crops from
    resample = source.options.get("resample", "bilinear")
    folder = cache_root() / "imagefolder" / _listing_key(source, names, side, resample)
    if not (folder / "done").exists():
        folder.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=".decoding-"))
        try:
            for split_name in ("train", "test"):
                (tmp / split_name).mkdir()
                labels = _decode_split(source, split_name, names, side, resample, tmp / split_name / "x.npy")
                np.save(tmp / split_name / "y.npy", labels)
            (tmp / "done").write_text(source.name)
            if not (folder / "done").exists():  # another process may have finished the same tree first
                shutil.rmtree(folder, ignore_errors=True)
                os.replace(tmp, folder)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def split(name: str) -> tuple[np.ndarray, np.ndarray]:
        return np.load(folder / name / "x.npy", mmap_mode="r"), np.load(folder / name / "y.npy")

    (x_train, y_train), (x_test, y_test) = split("train"), split("test")
    return ImageSet(source.name, x_train, y_train, x_test, y_test, names)


def _check_image_headers(source: DatasetSource, files: list[Path]) -> None:
    """Every file opens as an image (PIL reads its header only), so a damaged file is refused before compute,
    not half-way through decoding inside a study."""
    from PIL import Image

    for f in files:
        try:
            with Image.open(f) as image:
                image.size  # noqa: B018 - the header is parsed on open; size proves it was
        except Exception as err:  # noqa: BLE001 - PIL raises many kinds for a damaged file (SyntaxError: PNG)
            raise DatasetError(f"dataset {source.name!r}: {f}: is not a readable image ({err.__class__.__name__}: "
                               "truncated or garbled); remove or replace it") from None


def _imagefolder_facts(source: DatasetSource) -> DataFacts:
    """Images per class from the listing of each split's folders (decoding waits for the study)."""
    names, _ = _imagefolder_metadata(source)
    files = [_split_files(source, names, split) for split in ("train", "test")]
    side = int(source.options.get("size", 256))
    resample = source.options.get("resample", "bilinear")
    if not (cache_root() / "imagefolder" / _listing_key(source, names, side, resample) / "done").exists():
        _check_image_headers(source, [f for split in files for f, _ in split])  # decoding comes later, in the study
    labels = [np.asarray([label for _, label in split], dtype=np.int64) for split in files]
    return DataFacts(np.bincount(labels[0], minlength=len(names)), np.bincount(labels[1], minlength=len(names)),
                     (side, side, 3), train_labels=labels[0])


IMAGEFOLDER_OPTIONS = ("classes", "size", "resample", "split")


@DATASETS.register("imagefolder")
def imagefolder(spec: str) -> DatasetSource:
    """'imagefolder:ROOT' in any layout of gtep.data.layouts (train/ and val/ class folders, ImageNet with its flat
    val/, Tiny ImageNet, CUB-200-2011, one folder of class folders); options after '?': classes=FILE (one class
    per line, e.g. the -1/-2 halves) or the name of a list shipped with gtep (classes=imagenet100-1),
    size=PIXELS (the stored square: the short side resized to it, then centre-cropped; default 256, and a study
    sets it from its pipeline), resample=bilinear|bicubic, split=SEED (a folder of class folders without a split,
    or CUB: a seeded 20% of each class is held out for testing) or split=FILE (PILOT's split: the list of its
    download's train/<class>/<file> and test/<class>/<file>; gtep/data/layouts/splits.py)."""
    root, _, query = spec.partition("?")
    if not root:
        raise DatasetError("dataset 'imagefolder:' needs a root folder, e.g. 'imagefolder:~/data/imagenet100'")
    options: dict = {}
    for item in filter(None, query.split("&")):
        key, _, value = item.partition("=")
        if key not in IMAGEFOLDER_OPTIONS:
            raise DatasetError(f"imagefolder option {key!r} is unknown; "
                               "use classes=FILE, size=PIXELS, resample=bicubic or split=SEED|FILE")
        if key == "resample" and value not in ("bilinear", "bicubic"):
            raise DatasetError(f"imagefolder option resample={value!r}: use bilinear or bicubic")
        if key == "split" and not value.isdigit():  # not a seed: the file of PILOT's split
            if not Path(os.path.expanduser(value)).is_file():
                raise DatasetError(f"imagefolder option split={value!r} is neither a seed (a whole number, e.g. "
                                   "split=0) nor an existing file of PILOT's split (train/<class>/<file> lines)")
            options[key] = os.path.expanduser(value)
            continue
        if key == "size" and not (value.isdigit() and int(value) > 0):
            raise DatasetError(f"imagefolder option {key}={value!r} must be a whole number, e.g. {key}=32")
        options[key] = os.path.expanduser(value) if key == "classes" else int(value) if key in ("size", "split") \
            else value
    if "classes" in options and not Path(options["classes"]).exists():
        packaged = packaged_class_list(options["classes"])
        if packaged is None:
            raise DatasetError(f"dataset 'imagefolder:{spec}': class-list file {options['classes']} does not exist "
                               f"(lists shipped with gtep: {', '.join(packaged_class_lists())})")
        options["classes"] = str(packaged)
    return DatasetSource(f"imagefolder:{spec}", Path(os.path.expanduser(root)), _load_imagefolder,
                         _imagefolder_metadata, options, _imagefolder_facts)


def with_storage(name: str, side: int, resample: str = "bilinear") -> str:
    """An ImageFolder dataset name with the size (and filter) its images are stored at, unless it gives them;
    other datasets are stored as their files hold them."""
    if not name.startswith("imagefolder:"):
        return name
    _, _, query = name.partition("?")
    given = {item.partition("=")[0] for item in query.split("&") if item}
    extra = [f"size={side}"] * ("size" not in given) + [f"resample={resample}"] * (
        resample != "bilinear" and "resample" not in given)
    if not extra:
        return name
    return name + ("&" if query else "?" if "?" not in name else "") + "&".join(extra)
