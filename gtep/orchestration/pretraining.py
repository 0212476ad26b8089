"""The study-level pretraining step: the config's `pretrain:` section made into the run's weights, once.

A CFSL or FSCIL preset needs a backbone pretrained on classes kept out of both phases, and must run on a fresh
machine with no weights file. `with_pretrained_weights` pretrains before the phases and caches the file under
$GTEP_CACHE (else OUTPUT/pretrained), named by a hash of everything that determines it (backbone, dataset
identity, classes, recipe, pipeline, seed): `gtep tune`, a resumed study and a later `gtep evaluate` find the same
file and do not pretrain again. The weights' metadata records the classes, so the usual weights check applies.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, replace
from pathlib import Path
from typing import Callable

from gtep.config import ConfigError, ResolvedExperiment

CACHE_VERSION = 1  # bump when the pretraining code changes what a spec produces


def pretrain_spec(resolved: ResolvedExperiment):
    """The engine's PretrainSpec for the config's section, with the backbone kind's defaults."""
    from gtep.engine.pretrain import default_spec

    cfg, plan = resolved.config, resolved.pretraining
    assert cfg.pretrain is not None and plan is not None
    section = cfg.pretrain
    # the scenario may show training images pretraining leaves out (FLUID's stream)
    share, classes = resolved.family.pretrain_holdout(cfg.scenario.family_options)
    return default_spec(cfg.backbone, plan.classes, epochs=section.epochs, lr=section.lr,
                        batch_size=section.batch_size, weight_decay=section.weight_decay, seed=section.seed,
                        device=cfg.training.device, holdout=share or None, holdout_classes=classes or None,
                        method=section.method, ways=section.ways, shots=section.shots, queries=section.queries)


def cache_root(resolved: ResolvedExperiment) -> Path:
    given = os.environ.get("GTEP_CACHE")
    return (Path(given).expanduser() if given else resolved.config.tracking.output) / "pretrained"


def pretrained_path(resolved: ResolvedExperiment) -> Path:
    """Where the section's weights are cached: the key changes with anything that changes the weights (not the
    device: the same spec on another device is the same pretraining)."""
    from gtep.data import resolve_dataset
    from gtep.engine.pretrain import pretraining_pipeline

    plan = resolved.pretraining
    assert plan is not None
    spec = pretrain_spec(resolved)
    source = resolve_dataset(plan.dataset)
    # no holdout: the key of the files made before holdouts existed, so those stay found
    # nor the episodes' fields for supervised pretraining: the keys of the files made before `method` existed
    episodic = ("method", "ways", "shots", "queries")
    recipe = {k: v for k, v in asdict(spec).items()
              if k != "device" and not (k.startswith("holdout") and not spec.holdout)
              and not (k in episodic and spec.method == "supervised")}
    record = {"version": CACHE_VERSION, "dataset": source.identity, **recipe,
              "pipeline": pretraining_pipeline(spec.backbone, source.name).describe()}
    key = hashlib.sha256(json.dumps(record, sort_keys=True, default=str).encode()).hexdigest()[:16]
    return cache_root(resolved) / f"{spec.backbone}-{key}.safetensors"


def with_pretrained_weights(resolved: ResolvedExperiment, say: Callable[[str], None] = print
                            ) -> ResolvedExperiment:
    """`resolved` with its pretrained weights: found in the cache, else pretrained now (before any phase)."""
    if resolved.pretraining is None:
        return resolved
    from gtep.data import resolve_dataset

    path = pretrained_path(resolved)
    if path.exists():
        say(f"pretrained weights: {path} (cached)")
    else:
        spec = pretrain_spec(resolved)
        source = resolve_dataset(resolved.pretraining.dataset)
        say(f"pretraining {spec.backbone} on {len(spec.classes)} classes of {source.name} kept out of both phases "
            f"({spec.epochs} epochs)")
        result = pretrain_with_threads(spec, source, path, max(1, int(resolved.config.compute.cpus_per_trial)))
        say(f"wrote {path}: test accuracy {100 * result.test_accuracy:.1f}% on the pretraining classes, "
            f"{result.seconds:.0f} s")
    done = replace(resolved, pretrained=path)
    _check_written(done)
    return done


def pretrain_with_threads(spec, source, path: Path, threads: int):
    """Pretrain with a trial's share of threads: torch's default (every core) spins its OpenMP threads against
    whatever else runs on the machine, several times slower on a shared CPU than one thread is. The file (in the
    output folder, or $GTEP_CACHE) is its owner's, as a study's files are (gtep.config.private.owner_only)."""
    import torch

    from gtep.config.private import owner_only
    from gtep.engine.pretrain import pretrain

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with owner_only():
            return pretrain(spec, source.load(), source.name, path)
    finally:
        torch.set_num_threads(before)


def _check_written(resolved: ResolvedExperiment) -> None:
    """The weights check a `weights:` file gets (backbone, no phase class), on the file the step made or found."""
    from gtep.config import check_weights_file

    assert resolved.weights is not None
    try:
        check_weights_file(resolved.weights, resolved.config.backbone, (resolved.tuning, resolved.evaluation))
    except ConfigError as err:
        raise ConfigError("pretrain", f"the cached file does not fit this study ({err}); delete it to pretrain "
                          "again") from None
