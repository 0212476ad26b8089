"""StoredImages: uint8 task images that learners use as their float test view."""
from __future__ import annotations

import io

import pytest
import torch
import torch.nn.functional as F

from gtep.algorithms.memory import ExemplarMemory
from gtep.data.pipelines import Pipeline, named_pipeline
from gtep.engine.checkpoint import _safe_classes
from gtep.engine.images import StoredImages


def stored(n: int = 6, side: int = 40, view: int = 32) -> StoredImages:
    pipeline = Pipeline(named_pipeline("pycil-imagenet", view), (0.5, 0.4, 0.3), (0.2, 0.2, 0.2))
    pixels = torch.randint(0, 256, (n, 3, side, side), generator=torch.Generator().manual_seed(0), dtype=torch.uint8)
    return StoredImages(pixels, pipeline)


def test_indexing_and_concatenation_stay_stored():
    x = stored()
    parts = [x[1:3], x[torch.tensor([True, False, True, False, False, False])], x[torch.tensor([5, 0])]]
    joined = torch.cat(parts)
    assert isinstance(joined, StoredImages) and joined.pixels.dtype == torch.uint8
    assert torch.equal(joined.pixels, x.pixels[[1, 2, 0, 2, 5, 0]])
    assert len(joined) == 6 and joined.shape == (6, 3, 32, 32) and joined.dtype == torch.float32


def test_everything_else_sees_the_test_view():
    x = stored()
    view = x.pipeline.view(x.pixels)
    weight = torch.randn(4, 3, 3, 3)
    torch.testing.assert_close(F.conv2d(x, weight), F.conv2d(view, weight))  # a torch function
    torch.testing.assert_close(x.flip(3), view.flip(3))  # a tensor method
    torch.testing.assert_close(x[4], view[4])
    torch.testing.assert_close(x[-1], view[-1])
    mixed = torch.cat([x[:2], torch.zeros(1, 3, 32, 32)])  # with a plain tensor: the views, concatenated
    assert not isinstance(mixed, StoredImages) and torch.equal(mixed[:2], view[:2])
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 2, 3), torch.nn.Flatten())
    torch.testing.assert_close(net(x), net(view))


def test_exemplars_are_kept_as_stored_bytes_and_survive_a_checkpoint():
    x, y = stored(8), torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    memory = ExemplarMemory(4)
    memory.update(x, y, [0, 1], 2, lambda images: images.float().flatten(1)[:, :16])
    exemplars, labels = memory.tensors()
    assert isinstance(exemplars, StoredImages) and len(exemplars) == 4 and labels.tolist() == [0, 0, 1, 1]
    buffer = io.BytesIO()
    torch.save(memory.state_dict(), buffer)
    buffer.seek(0)
    with torch.serialization.safe_globals(_safe_classes()):  # as load_checkpoint reads them
        state = torch.load(buffer, weights_only=True)
    restored = ExemplarMemory(4)
    restored.load_state_dict(state)
    again, _ = restored.tensors()
    assert isinstance(again, StoredImages) and torch.equal(again.pixels, exemplars.pixels)
    assert isinstance(torch.cat([x, again]), StoredImages), "a restored pipeline equals the one it was saved from"


def test_only_uint8_images_are_stored():
    with pytest.raises(ValueError, match="uint8"):
        StoredImages(torch.zeros(2, 3, 8, 8), stored().pipeline)
