"""benchmarks/fusion.py at toy size on the CPU, as the GPU image runs it: without Ray, MLflow, Optuna or pydantic."""
from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BLOCKED = ("ray", "mlflow", "optuna", "pydantic")


def test_the_fusion_benchmark_runs_quick_on_the_cpu_without_the_orchestration_packages(tmp_path):
    code = (f"import sys, runpy\nfor name in {BLOCKED!r}:\n    sys.modules[name] = None  # import fails\n"
            f"sys.argv = ['fusion.py', '--device', 'cpu', '--quick', '--sizes', '1', '2', '--threads', '1', "
            f"'--out', {str(tmp_path)!r}]\nrunpy.run_path({str(ROOT / 'benchmarks' / 'fusion.py')!r}, "
            "run_name='__main__')\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = json.loads((tmp_path / "fusion.json").read_text())["rows"]
    assert [(r["orderings"], r["precision"], r["mode"]) for r in rows] == [(1, "fp32", "eager"), (2, "fp32", "eager")]
    for row in rows:
        assert not row["note"], row["note"]
        assert math.isfinite(row["fused_images_per_s"]) and row["fused_images_per_s"] > 0
        assert math.isfinite(row["time_ratio"]) and row["time_ratio"] > 0
    assert "fused / alone" not in done.stdout and "time ratio" in done.stdout
