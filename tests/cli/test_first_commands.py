"""The first commands a new user types (issue 68): `gtep --version`, and the listings (`gtep algorithms`,
`gtep presets`, `gtep spaces`) read whole on an 80-column terminal, without the machine's install folders, and
saying which presets need weights and where those come from."""
from __future__ import annotations

import re
from importlib.metadata import version
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

import gtep
from gtep.cli import app, common, info

runner = CliRunner()
BOX = re.compile("[\u2500-\u257f]")  # rich's table borders


def rendered(monkeypatch: pytest.MonkeyPatch, *args: str, width: int = 80) -> str:
    """What `gtep ARGS` prints on a terminal `width` columns wide."""
    monkeypatch.setattr(common.console, "width", width)
    result = runner.invoke(app, list(args))
    assert result.exit_code == 0, result.output
    return result.output


def words(text: str) -> set[str]:
    """The words of `text`, without trailing punctuation (a summary ends where its sentence does)."""
    return {word.rstrip(",;:.") for word in BOX.sub(" ", text).split()}


def cut_words(output: str, source: set[str]) -> list[str]:
    return sorted(w for w in words(output) if w not in source and w != "…")


def test_version_prints_the_installed_version() -> None:
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0, result.output
    assert result.output.strip() == f"gtep {version('gtep')}"


def test_algorithms_keeps_every_word_whole_at_80_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from gtep.algorithms import ALGORITHMS
    from gtep.spaces import load_space

    source = words("algorithms name method tuned hyperparameters presets plugin - (no search space) "
                   "(invalid search space: gtep spaces")
    for name in ALGORITHMS.names():
        cls = ALGORITHMS.get(name)
        source |= words(f"{name} {cls.__doc__ or ''} {sys.modules[cls.__module__].__doc__ or ''} {name})")
        try:
            space = load_space(name)
            source |= words(f"{len(space.space.names)} {' '.join(space.presets)}")
        except Exception:
            pass
    output = rendered(monkeypatch, "algorithms")
    assert "replay" in output
    assert not cut_words(output, source), f"gtep algorithms cuts words at 80 columns: {cut_words(output, source)}"


def test_presets_keeps_every_word_whole_at_80_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    from gtep.config import ScenarioSpec, preset_names, preset_text
    from gtep.matrix import matrix_preset_names

    source = words("presets (gtep run --preset NAME) name algorithm scenario datasets R x S = description "
                   "data: (split) -> matrix presets (gtep matrix --preset NAME; gtep matrices): "
                   + " ".join(matrix_preset_names()))
    for name in preset_names():
        text = preset_text(name)
        doc = yaml.safe_load(text)
        datasets = " ".join(str(part.get("dataset")) for part in doc["datasets"].values())
        source |= words(f"{name} {text.replace('#', ' ')} {ScenarioSpec(**doc['scenario']).describe()} {datasets} "
                        f"{info.weights_note(doc)} {doc.get('search', {}).get('trials', 30)} "
                        f"{doc.get('search', {}).get('orderings', 5)}")
    output = rendered(monkeypatch, "presets")
    assert "cifar50-6tasks" in output
    assert not cut_words(output, source), f"gtep presets cuts words at 80 columns: {cut_words(output, source)}"


def test_presets_say_which_need_weights_and_where_they_come_from(monkeypatch: pytest.MonkeyPatch) -> None:
    """The ViT-B/16 presets stop without VIT_B16_WEIGHTS: the listing says so, and where the file comes from."""
    output = rendered(monkeypatch, "presets", width=200)
    blocks = {block.split()[0]: " ".join(block.split()) for block in output.split("\n\n") if block.strip()}
    for name in ("cub100-10tasks", "imagenetr-imageneta-10tasks"):
        assert "needs pretrained weights: set VIT_B16_WEIGHTS to" in blocks[name], blocks[name]
        assert "vit_base_patch16_224" in blocks[name] and "docs/pretraining.md" in blocks[name], blocks[name]
    assert "VIT_MICRO_WEIGHTS to the file that gtep pretrain" in blocks["tinyimagenet-vit-smoke"]
    assert "pretrains its backbone" in blocks["omniglot-cfsl"]
    assert "weights" not in blocks["tinyimagenet-smoke"], blocks["tinyimagenet-smoke"]


def test_shipped_presets_point_at_no_folder_users_do_not_have() -> None:
    """The Tiny ImageNet presets named the development machine's ../shared/data as where the file is."""
    presets = Path(gtep.__file__).parent / "presets"
    found = [str(p.relative_to(presets)) for p in sorted(presets.rglob("*.yaml")) if "../shared" in p.read_text()]
    assert not found, f"presets naming ../shared, which users do not have: {found}"
    smoke = (presets / "tinyimagenet-smoke.yaml").read_text()
    assert "gtep data prepare tinyimagenet" in smoke


def test_spaces_title_names_the_file_in_its_package_not_the_install_folder(monkeypatch: pytest.MonkeyPatch) -> None:
    output = rendered(monkeypatch, "spaces", "replay", width=200)
    assert "gtep/search_spaces/replay.yaml" in output, output
    install = str(Path(gtep.__file__).resolve().parents[1])
    assert install not in output and "site-packages" not in output, output
