"""The reference toolbox's side of benchmarks/reference_compare.py: one method, one seed, on the work a JSON job
file describes, run from a checkout of upstream PyCIL (G-U-N/PyCIL) or LAMDA-PILOT (sun-hailong/LAMDA-PILOT).

Run by reference_compare.py in a subprocess whose working directory is a scratch folder and whose sys.path starts
with the checkout; nothing of either toolbox is copied into gtep and none of its files is edited. What the run
sets from outside the toolbox's own code, and why:

- data: a small `iData` adapter (defined here, at run time) holding the job's classes of the npz dataset in the
  job's class order (gtep's, for that seed); `utils.data_manager._get_idata` is pointed at it (both toolboxes know
  only their built-in datasets). Its transforms: PyCIL's own CIFAR transforms (iCIFAR100's crop, flip, jitter)
  for PyCIL; for PILOT the job's (`pilot@32`: RandomResizedCrop(32, scale=(0.05, 1)), flip; the test view is the
  image). Both normalise with the job's mean and std, the ones gtep's run divides by: the phase's own pixel
  statistics (iCIFAR100 would use CIFAR-100's constants on a dataset that is not CIFAR-100) or those the ViT's
  weights were pretrained with.
- the recipe: PyCIL's replay, iCaRL, BiC, WA, PODNet and DER keep theirs in module globals (`init_epoch`, `epochs`,
  `lrate`, `milestones`, ...), set from the job's "globals" on the method's module before it trains; FOSTER, BEEF,
  MEMO and PILOT's methods read theirs from the args dict (their json config), which the job's "args" extend.
  `num_workers` is 0 (one process, as gtep).
- device: PyCIL's and PILOT's `trainer._set_device` map every entry to CUDA (they compare the list, not the entry,
  with -1), so the run gives them the job's device itself (`torch.device("cpu")` unless the job says "device"; and
  `num_workers` 0 unless the job says, as benchmarks/gpu_speed.py does on a GPU).
- `.cuda()`: PyCIL's BEEF (models/beef_iso.py and BEEFISONet in utils/inc_net.py) and a few heads call `.cuda()`
  on new tensors and layers directly; without a GPU the run makes `Tensor.cuda` and `Module.cuda` return their
  object unchanged, so those lines run on the CPU like the rest.
- seed: PyCIL's `trainer._set_random` seeds torch with 1 whatever the seed; the run seeds torch, numpy and random
  with the job's seed instead (PILOT's seeds with the seed; the run does the same).
- timm: PILOT imports `timm.models.layers.weight_init` and `timm.models.layers.helpers`, modules of timm < 0.9
  that timm 1.x keeps under `timm.layers`; the run registers the new modules under the old names (nothing else).
- zero adaptation epochs: PILOT's RanPAC `_init_train` logs a variable set only inside its epoch loop, so
  `tuned_epoch: 0` (no first-session adaptation) raises UnboundLocalError; with 0 epochs the run makes that
  method a no-op, which is what its loop would do.
- PILOT's backbone: `utils.inc_net.get_backbone` builds ViT-B/16 by name with timm's `pretrained=True` (a download)
  and hard-codes its width (768); the run points it at the job's timm ViT (gtep's CPU-sized ViTs are timm
  VisionTransformers) with the job's local weights, its width read from the model.

The loop is the toolboxes' trainer._train: incremental_train, eval_task, after_task per task; the CNN top-1
accuracy on all classes seen so far is Acc_t (and the NME classifier's, for methods that have one). Writes
{"acc_t": [...], "nme_t": [...], "seconds": ...} to the result file, and for a method that trains a student (PyCIL's
FOSTER) the student's accuracies as "student_acc_t".
"""
from __future__ import annotations

import json
import random
import sys
import time
from pathlib import Path

import numpy as np
import torch


def transforms_for(job: dict) -> tuple[list, list, list]:
    """(train, test, common) transforms: PyCIL's CIFAR ones, or PILOT's crops at 32 px with the weights' statistics."""
    from torchvision import transforms

    normalise = transforms.Normalize(job["mean"], job["std"])
    if job["toolbox"] == "pycil":
        from utils.data import iCIFAR100

        return iCIFAR100.train_trsf, iCIFAR100.test_trsf, [normalise]  # iCIFAR100's common_trsf: Normalize only

    side = job["image_size"]
    train = [transforms.RandomResizedCrop(side, scale=(0.05, 1.0), ratio=(3 / 4, 4 / 3),
                                          interpolation=transforms.InterpolationMode.BICUBIC),
             transforms.RandomHorizontalFlip(p=0.5)]
    return train, [], [transforms.ToTensor(), normalise]


def adapter(job: dict):
    """An iData subclass over the job's classes of the npz file, in the job's class order."""
    from utils.data import iData

    with np.load(job["npz"]) as arrays:
        x_train, y_train = arrays["x_train"], arrays["y_train"]
        x_test, y_test = arrays["x_test"], arrays["y_test"]
    classes = list(job["class_order"])
    keep_train, keep_test = np.isin(y_train, classes), np.isin(y_test, classes)
    train_trsf, test_trsf, common_trsf = transforms_for(job)

    class JobData(iData):
        use_path = False
        class_order = classes

        def download_data(self) -> None:
            self.train_trsf, self.test_trsf, self.common_trsf = train_trsf, test_trsf, common_trsf
            self.train_data, self.train_targets = x_train[keep_train], y_train[keep_train].astype(np.int64)
            self.test_data, self.test_targets = x_test[keep_test], y_test[keep_test].astype(np.int64)

    return JobData


class FeatureViT(torch.nn.Module):
    """The job's timm ViT as PILOT's backbones behave: forward gives the pooled features, out_dim their width."""

    def __init__(self, name: str, weights: str | None) -> None:
        super().__init__()
        from gtep.models.vit import create_timm_vit

        self.model = create_timm_vit(name, weights)
        self.out_dim = int(self.model.num_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)


def cuda_stays_on_the_cpu() -> None:
    """Tensor.cuda and Module.cuda as no-ops, for the toolbox lines that hard-code CUDA (docstring)."""
    torch.Tensor.cuda = lambda self, *args, **kwargs: self  # type: ignore[method-assign]
    torch.nn.Module.cuda = lambda self, *args, **kwargs: self  # type: ignore[method-assign]


def old_timm_module_names() -> None:
    """timm 1.x's timm.layers submodules under the names PILOT imports them by (timm < 0.9's)."""
    import importlib

    for name in ("weight_init", "helpers"):
        sys.modules.setdefault(f"timm.models.layers.{name}", importlib.import_module(f"timm.layers.{name}"))


def seed_everything(seed: int) -> None:
    torch.manual_seed(seed)
    np.random.seed(seed)
    random.seed(seed)


def model_args(job: dict) -> dict:
    backbone_key = "convnet_type" if job["toolbox"] == "pycil" else "backbone_type"
    return {"model_name": job["method"], backbone_key: job["backbone"], "dataset": "gtep",
            "memory_size": job["memory"], "memory_per_class": 20, "fixed_memory": False, "shuffle": False,
            "init_cls": job["increments"][0], "increment": job["increments"][1], "seed": job["seed"],
            "device": [torch.device(job.get("device", "cpu"))], "prefix": "gtep",
            "num_workers": job.get("num_workers", 0), **job["args"]}


def run(job: dict) -> dict:
    import importlib

    from utils import data_manager, factory

    if not torch.cuda.is_available():
        cuda_stays_on_the_cpu()
    data_class = adapter(job)
    data_manager._get_idata = lambda name, args=None: data_class()
    seed_everything(job["seed"])
    torch.set_num_threads(job.get("threads", 1))
    args = model_args(job)
    if job["toolbox"] == "pilot":
        old_timm_module_names()
        from utils import inc_net

        inc_net.get_backbone = lambda args, pretrained=False: FeatureViT(job["backbone"], job.get("weights")).eval()
        manager = data_manager.DataManager("gtep", False, job["seed"], *job["increments"], args)
        args.update(nb_classes=manager.nb_classes, nb_tasks=manager.nb_tasks)
    else:
        manager = data_manager.DataManager("gtep", False, job["seed"], *job["increments"])
    model = factory.get_model(job["method"], args)
    module = importlib.import_module(type(model).__module__)
    for name, value in job["globals"].items():
        if not hasattr(module, name):  # a misspelt global would otherwise be set and never read
            raise SystemExit(f"{module.__name__} has no recipe global {name!r}")
        setattr(module, name, value)
    if hasattr(module, "num_workers"):  # 0 unless the job says (gpu_speed.py: the toolbox's own loader workers)
        module.num_workers = job.get("num_workers", 0)
    if job["args"].get("tuned_epoch", None) == 0 and hasattr(type(model), "_init_train"):
        type(model)._init_train = lambda self, *args, **kwargs: None  # zero epochs: the loop would do nothing
    acc_t, nme_t, student_acc_t, tic = [], [], [], time.perf_counter()
    for _ in range(manager.nb_tasks):
        model.incremental_train(manager)
        cnn, nme = model.eval_task()
        student_acc_t.append(student_accuracy(model, float(cnn["top1"])))
        model.after_task()
        acc_t.append(float(cnn["top1"]))
        nme_t.append(float(nme["top1"]) if nme is not None else float("nan"))
    result = {"acc_t": acc_t, "nme_t": nme_t, "seconds": time.perf_counter() - tic}
    if hasattr(model, "_snet"):
        result["student_acc_t"] = student_acc_t
    return result


def student_accuracy(model, reported: float) -> float:
    """PyCIL's FOSTER reports the boosted model (the teacher: two backbones and their heads) after each task and
    goes on with the compressed student it trained only at the next task's start; the student's top-1 on the same
    test set is what gtep reports. Before the first compression there is one model: the one reported."""
    student = getattr(model, "_snet", None)
    if student is None:
        return reported
    # a DataLoader draws its base seed from torch's generator: without the states put back, looking at the
    # student would change every later draw of the run, and the same seed would no longer give the same run
    states = torch.get_rng_state(), np.random.get_state(), random.getstate()
    try:
        return float(model._compute_accuracy(student, model.test_loader))
    finally:
        torch.set_rng_state(states[0])
        np.random.set_state(states[1])
        random.setstate(states[2])


if __name__ == "__main__":
    job = json.loads(Path(sys.argv[1]).read_text())
    Path(sys.argv[2]).write_text(json.dumps(run(job)))
