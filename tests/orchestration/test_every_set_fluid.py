"""Every set evaluated in a family other than class-incremental (issue 49): a tiny FLUID study whose experiment file
says evaluation.sets: all, through `gtep run`. The evaluate_sets phase is family-generic: every set's stream over the
orderings of D^E, scored by FLUID's criterion, and a regret table whose first_task rows say they do not apply."""
import json

import pytest
import ray
import yaml
from typer.testing import CliRunner

from gtep.cli import app
from tests.orchestration.test_fluid_study import SPACE, R, S, study_config
from tests.studies import start_ray

# a Ray study of its own: in the `slow` group, which .ci/run runs after the default one
pytestmark = pytest.mark.slow


def test_a_fluid_study_with_evaluation_sets_all_evaluates_every_set_and_replays_its_protocols(tmp_path):
    if ray.is_initialized():
        ray.shutdown()
    start_ray()
    try:
        (tmp_path / "space.yaml").write_text(yaml.safe_dump(SPACE))
        config = tmp_path / "exp.yaml"
        config.write_text(yaml.safe_dump({**study_config(tmp_path), "evaluation": {"sets": "all"}}))
        result = CliRunner().invoke(app, ["run", "--config", str(config), "--output", str(tmp_path / "out")],
                                    env={"COLUMNS": "200"})
        assert result.exit_code == 0, result.output + str(result.exception)
    finally:
        ray.shutdown()
    folder = tmp_path / "out" / "fluid-tiny"
    manifest = json.loads((folder / "manifest.json").read_text())
    best = manifest["phases"]["tune"]["best_set_index"]
    others = [i for i in range(R) if i != best]
    assert manifest["phases"]["evaluate_sets"]["status"] == "finished"
    assert {k for k in manifest["units"] if k.startswith("evaluate_sets/")} == \
        {f"evaluate_sets/{i}/{s}" for i in others for s in range(S)}
    table = json.loads((folder / "protocol_regret.json").read_text())
    assert table["criterion"] == manifest["phases"]["evaluate"]["summary"]["criterion"]
    assert table["ranking"]["sets"] == R and table["ranking"]["best_index"] == best
    first_task = [row for row in table["protocols"] if row["protocol"] == "first_task"]
    assert len(first_task) == 3 and all("not applicable" in row["note"] for row in first_task)
    full = next(row for row in table["protocols"] if row["protocol"] == "gtep (full)")
    assert full["picked"] == best and full["regret"] == pytest.approx(table["ranking"]["regret"])
