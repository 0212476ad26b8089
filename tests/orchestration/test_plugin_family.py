"""A scenario family defined outside gtep, in a module of its own named in GTEP_PLUGINS (as a lab's package would
be), runs a whole study through the real CLI on Ray (the workers import the plugin too) and appears in
`gtep report` with its own metric: adding a family touches nothing in gtep's config, orchestration or report."""
import os
import subprocess
import sys
import textwrap

import pytest
import yaml

from tests.plugin_code import pairs_family

PLUGIN = pairs_family("Pairs: two tasks of two classes each, and one metric of the family's own: the accuracy on "
                      "the last task.", '''
@register_family
class Pairs(TaskFamily):
    name = "test_pairs"
    description = "two tasks of two classes"
    metrics = (ACC, AVG_ACC, Metric("last_task_acc", "last task"), ACC_T)
    headline = ("last_task_acc",)
''', summary='{**metrics.summarize(matrix, test_counts), "last_task_acc": float(np.asarray(matrix)[-1, -1])}')


@pytest.mark.slow
def test_a_plugin_family_runs_a_study_and_its_metric_reaches_the_report(tmp_path):
    (tmp_path / "pairs_family.py").write_text(textwrap.dedent(PLUGIN))
    doc = {"study": "pairs", "algorithm": "replay", "backbone": "resnet8", "scenario": {"family": "test_pairs"},
           "datasets": {"split": {"dataset": "synthetic:classes=8,train=16,test=6", "classes_per_phase": 4}},
           "search": {"trials": 2, "orderings": 1},
           "first_task": {"epochs": 2, "milestones": [1], "batch_size": 16},
           "training": {"memory_size": 8, "epoch_scale": 0.01}, "seed": 0}
    config = tmp_path / "pairs.yaml"
    config.write_text(yaml.safe_dump(doc))
    env = {**os.environ, "GTEP_PLUGINS": "pairs_family", "RAY_AUTH_MODE": "disabled",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH", "")]))}
    out = tmp_path / "out"

    def gtep(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "gtep.cli", *args], env=env, capture_output=True, text=True,
                              cwd=tmp_path, timeout=900)

    done = gtep("run", "--config", str(config), "--output", str(out))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "last task" in done.stdout  # the terminal's phase table shows the family's headline metric
    report = gtep("report", "pairs", "--tracking-uri", f"sqlite:///{out / 'mlflow.db'}", "--out",
                  str(tmp_path / "report"), "--format", "csv")
    assert report.returncode == 0, report.stdout[-3000:] + report.stderr[-3000:]
    summary = (tmp_path / "report" / "summary.csv").read_text()
    header, *rows = summary.splitlines()
    assert "last_task_acc" in header.split(",") and "test_pairs" in summary
    column = header.split(",").index("last_task_acc")
    values = [float(r.split(",")[column]) for r in rows if r.split(",")[column]]
    assert values and all(0 <= v <= 1 for v in values)  # a fraction, read back from MLflow's percent
