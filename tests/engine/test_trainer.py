"""The training loop's switches: mixed precision and channels-last on CUDA, torch.compile, device-resident data."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from gtep.algorithms import FitRecipe
from gtep.engine.loop import EpochAugmentation, Plateau, Precision, Trainer
from gtep.engine.runner import PhaseTensors, to_tensor
from gtep.models import IncrementalNet, create_backbone
from tests.helpers import load

RECIPE = FitRecipe(epochs=2, lr=0.05, batch_size=16, weight_decay=0.0, scheduler="constant", milestones=(),
                    lr_decay=0.1)


def small_task(n: int = 48):
    g = torch.Generator().manual_seed(0)
    return torch.randn(n, 3, 32, 32, generator=g), torch.randint(0, 4, (n,), generator=g)


def new_net() -> IncrementalNet:
    torch.manual_seed(0)
    net = IncrementalNet(create_backbone("resnet8"))
    net.expand(4)
    return net


def test_mixed_precision_is_bf16_and_channels_last_on_cuda_only():
    cuda = Precision.for_device(torch.device("cuda"), mixed_precision=True)
    assert (cuda.autocast_dtype, cuda.channels_last) == (torch.bfloat16, True)
    assert Precision.for_device(torch.device("cuda"), mixed_precision=False) == Precision("cuda")
    cpu = Precision.for_device(torch.device("cpu"), mixed_precision=True)
    assert (cpu.autocast_dtype, cpu.channels_last) == (None, False)


def test_the_cuda_policy_trains_when_run_on_the_cpu():
    """The CUDA path's logic (autocast, channels-last modules and batches, fp32 loss) exercised on the CPU."""
    x, y = small_task()
    net = new_net()
    before = [p.detach().clone() for p in net.parameters()]
    seen: list[tuple[torch.dtype, bool]] = []
    conv = next(m for m in net.modules() if isinstance(m, torch.nn.Conv2d))
    conv.register_forward_hook(lambda m, inputs, out: seen.append((out.dtype, inputs[0].is_contiguous(
        memory_format=torch.channels_last))))

    def loss(xb, yb):
        return F.cross_entropy(net(xb)["logits"], yb)

    policy = Precision("cpu", torch.bfloat16, channels_last=True)
    Trainer(torch.device("cpu"), 0, precision=policy).fit(net.parameters(), loss, x, y, RECIPE, modules=[net])
    assert seen and all(dtype == torch.bfloat16 and cl for dtype, cl in seen)
    assert conv.weight.is_contiguous(memory_format=torch.channels_last)
    assert all(p.dtype == torch.float32 for p in net.parameters()), "master weights stay fp32"
    assert any(not torch.equal(a, b) for a, b in zip(before, net.parameters()))


def test_channels_last_leaves_tensors_that_are_not_4d_alone():
    """Module.to(memory_format=channels_last) fails on any 5-D tensor (DualPrompt's prompt pool, seen on the
    GPU check); the policy converts the conv weights only."""
    net = new_net()
    net.prompts = torch.nn.Parameter(torch.randn(2, 3, 4, 5, 6))
    Precision("cpu", torch.bfloat16, channels_last=True).prepare_modules([net])
    conv = next(m for m in net.modules() if isinstance(m, torch.nn.Conv2d))
    assert conv.weight.is_contiguous(memory_format=torch.channels_last)
    assert net.prompts.is_contiguous() and net.prompts.dim() == 5


def test_compiled_loss_trains_like_the_eager_one():
    x, y = small_task()
    results = []
    for backend in (None, "eager"):
        net = new_net()
        loss = lambda xb, yb, net=net: F.cross_entropy(net(xb)["logits"], yb)  # noqa: E731
        Trainer(torch.device("cpu"), 0, augment=False, compile=backend).fit(net.parameters(), loss, x, y, RECIPE,
                                                                            modules=[net])
        results.append(torch.cat([p.detach().flatten() for p in net.parameters()]))
    torch.testing.assert_close(results[0], results[1])


def test_phase_images_are_stored_and_viewed_normalised_by_the_phases_statistics():
    data = load("synthetic:classes=6,train=24,test=8")
    order = list(range(6))
    images = PhaseTensors(data, order, torch.device("cpu"))
    mask = np.isin(data.y_train, [1, 4])
    pixels = data.x_train.reshape(-1, 3).astype(np.float64) / 255  # float64: float32 sums drift
    mean, std = torch.tensor(pixels.mean(0)).float(), torch.tensor(pixels.std(0) + 1e-6).float()
    task = images.images("train", mask)
    assert task.pixels.dtype == torch.uint8 and len(task) == int(mask.sum())
    torch.testing.assert_close(task.as_tensor(), to_tensor(data.x_train[mask], mean, std, torch.device("cpu")))
    assert images.x_train.data_ptr() == torch.from_numpy(data.x_train).data_ptr(), "no copy on the CPU"


def test_fit_crops_stored_images_per_batch_through_their_pipeline():
    """What reaches the loss: the pipeline's training transform of the stored pixels (black padding, per-image
    crops), not the test view; without augmentation, the test view."""
    data = load("synthetic:classes=6,train=24,test=8")
    task = PhaseTensors(data, list(range(6)), torch.device("cpu")).images("train", np.isin(data.y_train, [0, 1]))
    y = torch.zeros(len(task), dtype=torch.long)
    black = ((0 - task.pipeline.mean) / task.pipeline.std).view(3)
    for augment, check in ((True, "crops"), (False, "view")):
        seen: list[torch.Tensor] = []
        net = new_net()

        def loss(xb, yb, net=net, seen=seen):
            seen.append(xb.detach().clone())
            return F.cross_entropy(net(xb)["logits"], yb)

        recipe = RECIPE.replace(epochs=1, batch_size=len(task))
        Trainer(torch.device("cpu"), 0, augment=augment).fit(net.parameters(), loss, task, y, recipe, modules=[net])
        (batch,) = seen
        assert batch.shape == task.shape
        views = {tuple(v.flatten().tolist()) for v in task.as_tensor()}
        if check == "view":
            assert all(tuple(b.flatten().tolist()) in views for b in batch)
        else:
            shifted = sum(tuple(b.flatten().tolist()) not in views for b in batch)
            assert shifted > len(batch) // 2, "most images are cropped away from their stored position"
            borders = torch.cat([batch[:, :, 0, :], batch[:, :, -1, :]], dim=2)  # top and bottom rows
            padded = (borders - black[None, :, None]).abs().amax(1) < 1e-5  # a black pixel in every channel
            assert padded.any(), "padding is black in the normalised image (not the mean colour, 0)"


def test_epoch_augmentation_crops_and_flips_each_image_by_its_own_draw():
    x = torch.arange(2 * 3 * 4 * 4, dtype=torch.float32).view(2, 3, 4, 4)
    aug = EpochAugmentation(dy=torch.tensor([9, 4, 0]), dx=torch.tensor([9, 4, 2]),
                            flip=torch.tensor([False, False, True]),
                            pad=4)
    out = aug.apply(x, start=1)  # the batch at epoch position 1 takes draws 1 and 2
    torch.testing.assert_close(out[0], x[0], msg="offset (pad, pad) and no flip is the image itself")
    expected = torch.nn.functional.pad(x[1], (4, 4, 4, 4))[:, 0:4, 2:6].flip(2)
    torch.testing.assert_close(out[1], expected)


def test_a_plateau_of_the_validation_score_decays_the_lr_in_place_of_the_schedule():
    """IIRC's in-task validation (issue 31): the lr is multiplied by lr_decay once the score has not beaten its
    best by more than the threshold for `patience` epochs (the reference code's ReduceLROnPlateau, mode max)."""
    x, y = small_task(16)
    net = new_net()
    recipe = RECIPE.replace(epochs=7, lr=0.1, lr_decay=0.5, scheduler="steplr", milestones=(1,))
    flat = Plateau(lambda: 0.5, patience=2)
    Trainer(torch.device("cpu"), 0).fit(net.parameters(), lambda a, b: F.cross_entropy(net(a)["logits"], b), x, y,
                                        recipe, modules=[net], plateau=flat)
    # epoch 1 sets the best; epochs 2-4 do not beat it, so after epoch 4 the lr halves; again after epoch 7.
    # StepLR's milestone at epoch 1 would have cut it to 0.05 at once: the plateau replaces the schedule.
    assert flat.scores == [0.5] * 7
    assert flat.lrs == pytest.approx([0.1, 0.1, 0.1, 0.05, 0.05, 0.05, 0.025])
    scores = iter([0.1, 0.2, 0.3, 0.3005, 0.3009, 0.4, 0.5])  # gains below the 1e-3 threshold count as none
    rising = Plateau(lambda: next(scores), patience=1)
    Trainer(torch.device("cpu"), 0).fit(net.parameters(), lambda a, b: F.cross_entropy(net(a)["logits"], b), x, y,
                                        recipe, modules=[net], plateau=rising)
    assert rising.lrs == pytest.approx([0.1, 0.1, 0.1, 0.1, 0.05, 0.05, 0.05])
