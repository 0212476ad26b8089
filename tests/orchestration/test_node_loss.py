"""A lost Ray node said in one line (issue 57, item 6), without a cluster: Ray's lines about it go to the study's
log, the GCS's "marked dead" notice names the node, the units the node was training are counted from the
events, and the study's one watch says a loss whichever phase or gap between phases the GCS's verdict falls in.
A whole study losing a worker node is tests/cluster/test_node_loss.py."""
from __future__ import annotations

import json
import logging

from ray._private import worker

from gtep.orchestration import node_loss
from gtep.orchestration.node_loss import (
    NodeLossWatch,
    died_with_its_actor,
    ray_lines_to_study_log,
    units_on,
    watching_node_loss,
)

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
    events = [("unit_started", "n1", 0, "tune"), ("unit_started", "n1", 1, "tune"), ("unit_trained", "n1", 0, "tune"),
              ("unit_started", "n2", 2, "tune"), ("unit_started", "n2", 1, "tune"), ("unit_trained", "n2", 1, "tune"),
              ("unit_started", "n1", 0, "evaluate")]
    (tmp_path / "events.jsonl").write_text("".join(
        json.dumps({"event": e, "node": n, "set_index": i, "ordering": 0, "phase": p}) + "\n"
        for e, n, i, p in events))
    # n1 finished tune's set 0 and was training its set 1 (finished since on n2, by the retry) and evaluate's unit:
    # it lost two units, in two phases (the GCS's verdict may come in the phase after the loss)
    assert units_on(tmp_path / "events.jsonl", "n1") == 2
    said: list[str] = []
    watch = NodeLossWatch(said.append, tmp_path, known=set())
    watch.lost("n1", "10.0.0.7")
    watch.lost("n1", "10.0.0.7")  # said once
    assert said == [f"Ray node n1 (10.0.0.7) was lost: 2 unit(s) it was training are trained again on the other "
                    f"nodes, from their last task checkpoint (Ray's account: {tmp_path / 'ray-errors.log'})"]


def test_a_verdict_between_phases_is_said_once_by_the_studys_watch(tmp_path, capsys):
    """The CI failure of stop 62: the retry finished the phase before the GCS declared the node dead, and the
    notice reached the terminal raw. A phase's watch inside the study's is the same watch, and it stays after."""
    said: list[str] = []
    study = tmp_path / "study"  # not made yet: the log makes it
    with watching_node_loss(study, said.append) as outer:
        with watching_node_loss(study, lambda line: said.append("the phase's own: " + line)) as phase:
            assert phase is outer
        worker.print_to_stdstream({"lines": [NOTICE], "pid": "raylet", "is_err": False}, ignore_prefix=False)
        worker.print_to_stdstream({"lines": [NOTICE], "pid": "raylet", "is_err": False}, ignore_prefix=False)
    assert len(said) == 1 and said[0].startswith(f"Ray node {NODE[:8]} (10.0.0.7) was lost: 0 unit(s)")
    out = capsys.readouterr()
    assert "marked dead" not in out.out + out.err
    assert (study / "ray-errors.log").read_text().count("marked dead") == 2
    worker.print_to_stdstream({"lines": [NOTICE], "pid": "raylet", "is_err": False}, ignore_prefix=False)
    assert "marked dead" in capsys.readouterr().out  # the study over, Ray's printing is Ray's again


def test_a_watch_that_saw_an_actor_die_waits_for_the_gcs_verdict(tmp_path, monkeypatch):
    declared = iter([{}, {}, {"n1": "10.0.0.7"}])  # the GCS declares the node dead on the third look
    monkeypatch.setattr(node_loss, "dead_nodes", lambda: next(declared, {"n1": "10.0.0.7"}))
    slept: list[float] = []
    monkeypatch.setattr(node_loss.time, "sleep", slept.append)
    said: list[str] = []
    watch = NodeLossWatch(said.append, tmp_path, known=set())
    watch.await_verdict()
    assert slept == [] and said == []  # nothing died: no wait
    watch.trial_failed(actor_died=True)  # the first look: not declared yet
    watch.await_verdict(poll=0.5)
    assert slept == [0.5] and len(said) == 1 and said[0].startswith("Ray node n1 (10.0.0.7) was lost")
    watch.trial_failed(actor_died=False)  # a trial's own error: asked once, no wait
    watch.await_verdict()
    assert slept == [0.5] and len(said) == 1


class FailedTrial:
    def __init__(self, error: str | None) -> None:
        self.error = error

    def get_error(self) -> str | None:
        return self.error


def test_a_trials_actor_death_is_told_from_its_own_error():
    assert died_with_its_actor(FailedTrial("ray.exceptions.ActorDiedError: The actor died unexpectedly"))
    assert not died_with_its_actor(FailedTrial("ValueError: nc_fscil's own error"))
    assert not died_with_its_actor(FailedTrial(None))


# What each agent of a lost node publishes to the driver as its raylet goes (ray/_private/process_watcher.py): Ray's
# driver printed it, 20 lines of the raylet's log with it, on the user's terminal (issue 68, item 3).
RAYLET_LOG = "".join(f"[2026-12-06 19:35:{s:02d},{s:03d} I 5120 5120] (raylet) node_manager.cc:{s}: state line {s}\n"
                     for s in range(20))
RAYLET_TERMINATED = ("Raylet is terminated. Termination is unexpected. Possible reasons include: (1) SIGKILL by the "
                     "user or system OOM killer, (2) Invalid memory access from Raylet causing SIGSEGV or SIGBUS, (3) "
                     "Other termination signals. Last 20 lines of the Raylet logs:\n    "
                     + "    ".join(RAYLET_LOG.splitlines(keepends=True)))


def test_a_lost_nodes_raylet_terminated_notice_and_its_log_tail_go_to_the_study_log(tmp_path, capsys):
    with ray_lines_to_study_log(tmp_path):
        for _ in range(2):  # the dashboard agent's and the runtime-env agent's
            worker.print_to_stdstream({"lines": [RAYLET_TERMINATED], "pid": "raylet", "is_err": False},
                                      ignore_prefix=False)
    out = capsys.readouterr()
    assert "Raylet is terminated" not in out.out + out.err and "state line" not in out.out + out.err
    log = (tmp_path / "ray-errors.log").read_text()
    assert log.count("Raylet is terminated") == 2 and "node_manager.cc:19: state line 19" in log
