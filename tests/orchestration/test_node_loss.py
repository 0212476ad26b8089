"""A lost Ray node said in one line (issue 57, item 6), without a cluster: Ray's lines about it go to the study's
log, the GCS's "marked dead" notice names the node, and the units the node was training are counted from the
events. A whole study losing a worker node is tests/cluster/test_node_loss.py."""
from __future__ import annotations

import json
import logging

from ray._private import worker

from gtep.orchestration.node_loss import NodeLossCallback, ray_lines_to_study_log, units_on

NODE = "5dcdfec2a1b2c3d4e5f6" * 2
NOTICE = (f"The node with node id: {NODE} and address: 10.0.0.7 and node name: 10.0.0.7 has been marked dead "
          "because the detector has missed too many heartbeats from it.")


def test_the_gcs_notice_goes_to_the_study_log_and_names_the_node(tmp_path, capsys):
    seen = []
    with ray_lines_to_study_log(tmp_path, lambda node, address: seen.append((node, address))):
        worker.print_to_stdstream({"lines": [NOTICE], "pid": "raylet", "is_err": False}, ignore_prefix=False)
        worker.print_to_stdstream({"lines": ["an ordinary worker line"], "pid": 42, "is_err": False},
                                  ignore_prefix=False)
    out = capsys.readouterr()
    assert "marked dead" not in out.out + out.err and "an ordinary worker line" in out.out
    assert "marked dead" in (tmp_path / "ray-errors.log").read_text()
    assert seen == [(NODE, "10.0.0.7")]


def test_a_dead_actors_traceback_goes_to_the_log_and_a_trials_own_error_stays(tmp_path):
    logger = logging.getLogger("ray.tune.execution.tune_controller")
    shown: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: shown.append(record.getMessage())  # type: ignore[method-assign]
    logging.getLogger("ray").addHandler(handler)
    try:
        with ray_lines_to_study_log(tmp_path):
            try:
                raise RuntimeError("The actor died because its node has died. Node Id: abc")
            except RuntimeError:
                logger.error("Trial task failed for trial train_1", exc_info=True)
            try:
                raise ValueError("nc_fscil's own error")
            except ValueError:
                logger.error("Trial task failed for trial train_2", exc_info=True)
    finally:
        logging.getLogger("ray").removeHandler(handler)
    assert shown == ["Trial task failed for trial train_2"]
    assert "train_1" in (tmp_path / "ray-errors.log").read_text()


def test_the_units_a_node_was_training_are_counted(tmp_path):
    events = [("unit_started", "n1", 0), ("unit_started", "n1", 1), ("unit_trained", "n1", 0),
              ("unit_started", "n2", 2), ("unit_started", "n2", 1), ("unit_trained", "n2", 1)]
    (tmp_path / "events.jsonl").write_text("".join(
        json.dumps({"event": e, "node": n, "set_index": i, "ordering": 0, "phase": "tune"}) + "\n"
        for e, n, i in events))
    # n1 finished set 0 and was training set 1 (finished since on n2, by the retry): it lost one unit
    assert units_on(tmp_path / "events.jsonl", "n1", "tune") == 1
    said: list[str] = []
    callback = NodeLossCallback(said.append, tmp_path, "tune")
    callback.lost("n1", "10.0.0.7")
    callback.lost("n1", "10.0.0.7")  # said once
    assert said == [f"Ray node n1 (10.0.0.7) was lost: 1 unit(s) it was training are trained again on the other "
                    f"nodes, from their last task checkpoint (Ray's account: {tmp_path / 'ray-errors.log'})"]
