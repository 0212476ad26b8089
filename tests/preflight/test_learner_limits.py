"""Issue 57, item 7: a learner's limits that depend on the scenario (nc_fscil's ETF against the classes the sessions
reach, feature_rectification's FR layers against the ViT's depth, cec's episodes against the base session) are
refused by the pre-flight pass, before any compute, for every value the search space can draw."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

import gtep
from gtep.config import ConfigError, ExperimentConfig, resolve
from tests.helpers import FSCIL, fscil_experiment


@pytest.mark.parametrize("algorithm, backbone, space, fscil, named", [
    ("nc_fscil", "resnet8", {"etf_classes": [8, 64]}, FSCIL, "etf_classes 8 is fewer than the 10 classes"),
    ("nc_fscil", "resnet8", {}, {"base_classes": 6, "ways": 2, "shots": 3, "sessions": 2}, None),
    ("feature_rectification", "vit_micro_patch4_32", {"fr_layers": [1], "fr_offset": [3, 4]}, FSCIL,
     "fr_layers 1 and fr_offset 4 leave no layer of the 4-layer vit_micro_patch4_32"),
    ("cec", "resnet8", {}, {"base_classes": 1, "ways": 3, "shots": 3, "sessions": 3}, "base session has 1 class"),
], ids=["nc_fscil-etf", "nc_fscil-fits", "feature_rectification-depth", "cec-base-session"])
def test_a_learner_limit_of_the_scenario_is_refused_before_compute(tmp_path, algorithm, backbone, space, fscil,
                                                                    named):
    """Before: each failed inside the Ray trial with a traceback (ValueError in grow(), FRNet(), Episodes)."""
    from gtep.preflight import preflight

    shipped = yaml.safe_load((Path(gtep.__file__).parent / "search_spaces" / f"{algorithm}.yaml").read_text())
    path = tmp_path / "space.yaml"
    path.write_text(yaml.safe_dump({**shipped, "space": {**shipped["space"], **space}, "presets": {}}))
    doc = fscil_experiment(algorithm=algorithm, backbone=backbone, scenario={"family": "fscil", "fscil": dict(fscil)},
                     search={"space": str(path)}, tracking={"output": str(tmp_path)})
    config = ExperimentConfig(**doc)
    resolve(config)  # the names and the scenario are fine: the limit is the learner's, against this scenario
    if named is None:
        preflight(config)
        return
    with pytest.raises(ConfigError, match=named) as refused:
        preflight(config)  # what gtep check, gtep run and gtep.run do before any compute
    assert refused.value.field == "search.space" or refused.value.field == "algorithm"
