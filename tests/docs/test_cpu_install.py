"""A CPU-only machine's install (issue 68): pip's default torch is the CUDA build, several GB a CPU never uses.
README and docs/getting-started.md give PyTorch's CPU wheel index beside the default install, torch first, and
`gtep check` says when the installed torch is a CUDA build on a machine without CUDA."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.docs.test_docs import read_blocks

ROOT = Path(__file__).resolve().parents[2]
CPU_INDEX = "--index-url https://download.pytorch.org/whl/cpu"


@pytest.mark.parametrize("page", ["README.md", "docs/getting-started.md"])
def test_the_install_gives_the_cpu_only_way_beside_the_default(page: str) -> None:
    blocks, _ = read_blocks(ROOT / page)
    cpu = [b for b in blocks if CPU_INDEX in b.text]
    assert len(cpu) == 1, f"{page}: no install block with PyTorch's CPU wheel index ({CPU_INDEX})"
    block = cpu[0]
    assert block.runs and block.runs.startswith("not run: "), f"{block.where}: mark it <!-- not run: REASON -->"
    torch_first = block.text.index("pip install -q torch torchvision " + CPU_INDEX)
    assert torch_first < block.text.index("pip install -q -e ."), f"{block.where}: torch's CPU build comes first"
    default = [b for b in blocks if "pip install -q -e . && .venv/bin/gtep run" in b.text and b is not block]
    assert default, f"{page}: the default install is gone"
