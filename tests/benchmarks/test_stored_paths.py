"""Stored results name no folder of the machine that made them (issue: numbers that do not depend on the machine):
data by a path relative to the repository (`npz:../shared/data/...`) or by its name, output folders relative too.
benchmarks/protocol_atlas.py writes its files through `portable`, which makes this machine's paths relative."""
from __future__ import annotations

import re
from pathlib import Path

from tests.helpers import load_benchmark

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
# an absolute path of a machine: a Unix root folder a path starts from, or a Windows drive
ABSOLUTE = re.compile(r"""(?:^|[\s"'=:(\[,])(/(?:work|tmp|home|root|Users|usr|opt|mnt|data|scratch|var)/[^\s"',)\]]*"""
                      r"""|[A-Za-z]:\\\\[^\s"',]*)""")


def test_no_stored_result_names_an_absolute_path():
    found = []
    for path in sorted(RESULTS.rglob("*")):
        if path.is_file() and path.suffix in (".json", ".md", ".csv", ".txt", ".yaml"):
            for number, line in enumerate(path.read_text().splitlines(), 1):
                found += [f"{path.relative_to(ROOT)}:{number}: {m.group(1)}" for m in ABSOLUTE.finditer(line)]
    assert not found, "\n".join(found[:20])


def test_the_atlas_writes_this_machines_paths_relative_to_the_repository():
    atlas = load_benchmark("protocol_atlas")
    text = atlas.dump({"dataset": f"npz:{atlas.ROOT.parent}/shared/data/x.npz", "space": f"{atlas.ROOT}/runs/s.yaml"})
    assert '"npz:../shared/data/x.npz"' in text and '"runs/s.yaml"' in text
    assert not ABSOLUTE.search(text)
