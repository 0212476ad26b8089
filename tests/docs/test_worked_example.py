"""README's and getting-started's worked example runs as written from a fresh clone: its exp.yaml, saved in a
folder outside the repository, passes `gtep check` against Tiny ImageNet as released under ~/data (a fake
tiny-imagenet-200/ made here in that layout, with HOME pointing at it), so no path in it needs the repository."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.data.test_dataset_layouts import make_tinyimagenet

ROOT = Path(__file__).resolve().parents[2]


def worked_example(page: Path) -> str:
    text = page.read_text()
    section = text[text.index("## A worked example"):]
    return re.search(r"```yaml\n(.*?)```", section, re.S).group(1)


@pytest.fixture(scope="module")
def home(tmp_path_factory) -> Path:
    home = tmp_path_factory.mktemp("home")
    make_tinyimagenet(home / "data" / "tiny-imagenet-200", wnids=[f"n{i:08d}" for i in range(200)], train=2, val=1)
    return home


@pytest.mark.parametrize("page", ["README.md", "docs/getting-started.md"])
def test_the_worked_example_checks_from_outside_the_repository(page, home, tmp_path):
    config = worked_example(ROOT / page)
    assert "~/data/tiny-imagenet-200" in config and "../" not in config
    (tmp_path / "exp.yaml").write_text(config)
    env = {**os.environ, "HOME": str(home), "GTEP_CACHE": str(home / "cache")}
    result = subprocess.run([sys.executable, "-m", "gtep.cli", "check", "--config", "exp.yaml"], cwd=tmp_path,
                            env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "tiny-imagenet-200" in result.stdout
