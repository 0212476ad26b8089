"""PyCIL's side of benchmarks/reference_compare.py: one method, one seed, on the work a JSON job file describes.

Run by reference_compare.py in a subprocess whose working directory is a scratch folder and whose sys.path starts
with a checkout of upstream PyCIL (G-U-N/PyCIL); nothing of PyCIL is copied into gtep and none of its files is
edited. What the run needs from outside PyCIL's own code, and why:

- data: a small `iData` adapter (defined here, at run time) holding the job's classes of the npz dataset, with
  PyCIL's own CIFAR transforms (iCIFAR100's train/test/common transforms) and the job's class order; PyCIL's
  `utils.data_manager._get_idata` is pointed at it (PyCIL knows only its four built-in datasets).
- the recipe: PyCIL's methods keep theirs in module globals (`init_epoch`, `epochs`, `lrate`, `milestones`, ...);
  the job's values are set on the method's module before it trains, and `num_workers` is 0 (one process, as gtep).
- device: `trainer._set_device` maps every entry to CUDA (it compares the list, not the entry, with -1), so the
  run gives PyCIL `torch.device("cpu")` itself.
- seed: `trainer._set_random` seeds torch with 1 whatever the seed; the run seeds torch, numpy and random with the
  job's seed instead (the class order is the job's, from gtep's ordering for that seed).

The loop is trainer._train's: incremental_train, eval_task, after_task per task; the CNN top-1 accuracy on all
classes seen so far is Acc_t (and the NME classifier's, for methods that have one). Writes {"acc_t": [...],
"nme_t": [...], "seconds": ...} to the result file.
"""
from __future__ import annotations

import json
import random
import sys
import time
from pathlib import Path

import numpy as np
import torch

RECIPE_GLOBALS = {  # job key -> PyCIL module global it sets (where the method's module has it)
    "init_epochs": "init_epoch", "init_lr": "init_lr", "init_milestones": "init_milestones",
    "init_lr_decay": "init_lr_decay", "init_weight_decay": "init_weight_decay", "epochs": "epochs", "lr": "lrate",
    "milestones": "milestones", "lr_decay": "lrate_decay", "batch_size": "batch_size", "weight_decay": "weight_decay",
}


def adapter(job: dict):
    """An iData subclass over the job's classes of the npz file, with PyCIL's CIFAR transforms."""
    from utils.data import iCIFAR100, iData

    with np.load(job["npz"]) as arrays:
        x_train, y_train = arrays["x_train"], arrays["y_train"]
        x_test, y_test = arrays["x_test"], arrays["y_test"]
    classes = list(job["class_order"])
    keep_train, keep_test = np.isin(y_train, classes), np.isin(y_test, classes)

    class JobData(iData):
        use_path = False
        train_trsf, test_trsf, common_trsf = iCIFAR100.train_trsf, iCIFAR100.test_trsf, iCIFAR100.common_trsf
        class_order = classes

        def download_data(self) -> None:
            self.train_data, self.train_targets = x_train[keep_train], y_train[keep_train].astype(np.int64)
            self.test_data, self.test_targets = x_test[keep_test], y_test[keep_test].astype(np.int64)

    return JobData


def seed_everything(seed: int) -> None:
    torch.manual_seed(seed)
    np.random.seed(seed)
    random.seed(seed)


def run(job: dict) -> dict:
    import importlib

    from utils import data_manager, factory

    data_class = adapter(job)
    data_manager._get_idata = lambda name: data_class()
    seed_everything(job["seed"])
    torch.set_num_threads(job.get("threads", 1))
    manager = data_manager.DataManager("gtep", False, job["seed"], job["increments"][0], job["increments"][1])
    args = {"model_name": job["method"], "convnet_type": job["backbone"], "dataset": "gtep",
            "memory_size": job["memory"], "memory_per_class": 20, "fixed_memory": False, "shuffle": False,
            "init_cls": job["increments"][0], "increment": job["increments"][1], "seed": job["seed"],
            "device": [torch.device("cpu")], "prefix": "gtep"}
    model = factory.get_model(job["method"], args)
    module = importlib.import_module(type(model).__module__)
    for key, name in RECIPE_GLOBALS.items():
        if key in job and hasattr(module, name):
            setattr(module, name, job[key])
    if hasattr(module, "num_workers"):
        module.num_workers = 0
    acc_t, nme_t, tic = [], [], time.perf_counter()
    for _ in range(manager.nb_tasks):
        model.incremental_train(manager)
        cnn, nme = model.eval_task()
        model.after_task()
        acc_t.append(float(cnn["top1"]))
        nme_t.append(float(nme["top1"]) if nme is not None else float("nan"))
    return {"acc_t": acc_t, "nme_t": nme_t, "seconds": time.perf_counter() - tic}


if __name__ == "__main__":
    job = json.loads(Path(sys.argv[1]).read_text())
    Path(sys.argv[2]).write_text(json.dumps(run(job)))
