"""DualPrompt: prefixes only at the configured layers, E-prompts chosen by key matching at test time,
the task's own E-prompt while training, the pretrained ViT untouched."""
import pytest
import torch
import torch.nn.functional as F

from gtep.algorithms import TaskData
from gtep.algorithms.dualprompt import DualPromptNet, DualPromptParams
from gtep.models.vit import PromptableViT, create_timm_vit
from gtep.protocol.sampling import sample_sets
from gtep.spaces import load_space
from tests.algorithms.test_l2p import (
    QUICK,
    make_learner,
    task_tensors,
    train_task,
    train_two_tasks_leaving_the_vit_frozen,
)
from tests.helpers import VIT, pretrained_vit, run_small_vit


def block_outputs(net: DualPromptNet, x: torch.Tensor, prefixes) -> tuple[list[torch.Tensor], list[int]]:
    """Every block's output and the blocks that received a prefix, for one forward of the backbone."""
    outputs, prefixed, run_block = [], [], net.backbone.run_block

    def spy(index, tokens, prefix=None, adapter=None):
        if prefix is not None:
            prefixed.append(index)
        outputs.append(run_block(index, tokens, prefix, adapter))
        return outputs[-1]

    net.backbone.run_block = spy
    try:
        net.backbone(x, prefixes=prefixes)
    finally:
        del net.backbone.run_block
    return outputs, prefixed


def test_prefixes_enter_only_the_configured_layers():
    torch.manual_seed(0)
    vit = PromptableViT(create_timm_vit(VIT, pretrained_vit())).eval()
    x, _ = task_tensors([0, 1, 2], "test", per_class=2)
    # Layer 5 is past the 4-block ViT and is dropped; layer 0 and 3 get nothing.
    net = DualPromptNet(vit, DualPromptParams(g_prompt_layers=(1,), e_prompt_layers=(2, 5)))
    assert (net.g_layers, net.e_layers) == ([1], [2])
    with torch.no_grad():
        plain, none = block_outputs(net, x, None)
        empty, _ = block_outputs(net, x, {})
        prompted, prefixed = block_outputs(net, x, net.prefixes(net.select(net.query(x), None)[1]))
    assert none == [] and prefixed == [1, 2]
    assert all(torch.equal(a, b) for a, b in zip(plain, empty))  # no prefixes: the plain ViT
    assert torch.equal(prompted[0], plain[0])  # before the first prefixed layer nothing changes
    assert not torch.allclose(prompted[1], plain[1], atol=1e-4)
    # Layer 3 has no prefix: given the same input it computes what the plain block does.
    assert torch.equal(vit.run_block(3, prompted[2]), prompted[3])
    defaults = DualPromptNet(vit, DualPromptParams())  # PILOT's G 0-1, E 2-4 on a 4-block ViT
    assert (defaults.g_layers, defaults.e_layers) == ([0, 1], [2, 3])


def test_training_uses_the_task_e_prompt_and_testing_the_best_key():
    torch.manual_seed(0)
    net = DualPromptNet(PromptableViT(create_timm_vit(VIT)), DualPromptParams(pool_size=3))
    query = torch.randn(16, net.backbone.out_dim)
    cos = F.normalize(query, dim=1) @ F.normalize(net.keys, dim=1).t()
    assert torch.equal(net.select(query, 1)[1], torch.ones(16, 1, dtype=torch.long))
    assert torch.equal(net.select(query, None)[1], cos.argmax(1, keepdim=True))
    # Past the pool's end (task 3 of a 3-prompt pool) training matches keys too, as PILOT does.
    assert torch.equal(net.select(query, 3)[1], cos.argmax(1, keepdim=True))


def separable_tasks(tasks: int = 3, classes: int = 2, per_class: int = 24, seed: int = 0):
    """Images whose task is its colour (channel t high, the others low: the frozen ViT's queries of two
    tasks are far apart) and whose class is a weaker random pattern on top, plus noise."""
    g = torch.Generator().manual_seed(seed)
    colour = torch.eye(3)[:tasks, :, None, None] * 2 - 1
    class_pattern = F.interpolate(torch.randn(tasks * classes, 3, 4, 4, generator=g), size=32) * 0.5
    y = torch.arange(tasks * classes).repeat_interleave(per_class)
    x = colour[y // classes] + class_pattern[y] + 0.3 * torch.randn(len(y), 3, 32, 32, generator=g)
    return x, y


def test_e_prompt_of_the_image_task_is_chosen_by_key_matching():
    # A task here is 24 images (3 steps per epoch, not PILOT's hundreds): a larger lr lets the keys travel.
    learner = make_learner("dualprompt", epochs=5, lamb=1.0, optimizer="adam", lr=0.05, batch_size=8)
    x, y = separable_tasks()
    train_x, train_y, test_x, test_y = x[0::2], y[0::2], x[1::2], y[1::2]
    for t in range(3):
        keep = train_y // 2 == t
        train_task(learner, t, 2 * t, train_x[keep], train_y[keep])
    learner.net.eval()
    with torch.no_grad():
        chosen = learner.net(test_x)["chosen"][:, 0]
    assert (chosen == test_y // 2).float().mean() > 0.9


def test_new_task_e_prompt_starts_from_the_last_one():
    learner = make_learner("dualprompt")
    learner.begin_task(TaskData(0, 0, 2, torch.empty(0), torch.empty(0), None))
    learner.net.e_prompt.data[:, :, 0] += 1.0  # as if task 1 had trained its prompt
    learner.begin_task(TaskData(1, 2, 4, torch.empty(0), torch.empty(0), None))
    e = learner.net.e_prompt
    assert torch.equal(e[:, :, 1], e[:, :, 0]) and not torch.equal(e[:, :, 2], e[:, :, 0])


def test_pretrained_weights_stay_frozen_and_only_prompts_keys_head_count():
    learner, vit_parameters = train_two_tasks_leaving_the_vit_frozen("dualprompt")
    p, dim = learner.params, learner.net.backbone.out_dim
    # key and value halves; G-prompts at layers 0-1, E-prompts at 2-3 (4 of PILOT's 2-4 exist)
    prompts = 2 * 2 * p.g_prompt_length * dim + 2 * 2 * p.pool_size * p.e_prompt_length * dim
    total, trainable = learner.parameter_counts()
    assert trainable == prompts + p.pool_size * dim + 7 * (dim + 1)
    assert total == trainable + vit_parameters


def test_learns_above_chance_and_records_the_simplecil_comparison(record_property):
    """As for L2P (test_l2p.py): the train-masked head on this tiny ViT's weak features stays below
    SimpleCIL, as DualPrompt does on most benchmarks in Zhou et al. 2023 (APER, Table 1)."""
    out, ncm = run_small_vit("dualprompt", QUICK, epochs=2), run_small_vit("simplecil")
    record_property("dualprompt_acc", out.metrics["acc"])
    record_property("simplecil_acc", ncm.metrics["acc"])
    assert out.status == "finished"
    assert out.acc_matrix[0][0] > 0.8
    assert out.metrics["acc"] > 0.25


def test_search_space_loads_and_original_is_pilot():
    space = load_space("dualprompt")
    assert DualPromptParams.from_mapping(space.presets["original"]) == DualPromptParams()
    vit = PromptableViT(create_timm_vit(VIT))
    for values in sample_sets(space.space, 20, seed=0):
        p = DualPromptParams.from_mapping(values)
        net = DualPromptNet(vit, p)
        assert net.e_prompt.shape == (2, 2, p.pool_size, p.e_prompt_length, 96)
        assert net.g_prompt.shape == (2, 2, p.g_prompt_length, 96)
    with pytest.raises(ValueError, match="top_k"):
        DualPromptNet(vit, DualPromptParams(pool_size=2, top_k=3))
