"""The shared episodic ProtoNet core (gtep/algorithms/_episodic.py; Snell et al. 2017): the logits are the negative
squared distances to class means, and episodic training learns an embedding that makes few-shot nearest-mean
classification of classes it never trained on better than the untrained embedding's."""
import pytest
import torch
from torch import Tensor, nn

from gtep.algorithms._episodic import prototype_logits, train_prototypical

torch.set_num_threads(1)
SIGNAL, NOISE = 4, 28  # class means differ in SIGNAL dimensions; NOISE dimensions are large-variance distraction


def clusters(classes: int, per_class: int, seed: int) -> tuple[Tensor, Tensor]:
    """Gaussian classes whose means differ only in the first SIGNAL dimensions, buried under wide noise in the
    rest: nearest-mean on the raw input (or a random projection of it) is poor, a projection onto the signal
    dimensions is good. Different seeds give different classes (held-out ones)."""
    g = torch.Generator().manual_seed(seed)
    means = torch.cat([3 * torch.randn(classes, SIGNAL, generator=g), torch.zeros(classes, NOISE)], 1)
    spread = torch.cat([0.5 * torch.ones(SIGNAL), 6 * torch.ones(NOISE)])
    x = means.repeat_interleave(per_class, 0) + spread * torch.randn(classes * per_class, SIGNAL + NOISE, generator=g)
    return x, torch.arange(classes).repeat_interleave(per_class)


def few_shot_accuracy(embed: nn.Module, x: Tensor, y: Tensor, shots: int) -> float:
    """Nearest-mean accuracy of all but the first `shots` images of each class, prototypes from those."""
    first = torch.cat([torch.nonzero(y == c).flatten()[:shots] for c in torch.unique(y)])
    rest = torch.ones(len(y), dtype=torch.bool)
    rest[first] = False
    with torch.no_grad():
        logits = prototype_logits(embed(x[rest]), embed(x[first]), y[first])
    return float((logits.argmax(1) == y[rest]).float().mean())


def test_prototype_logits_are_negative_squared_distances_to_class_means_in_sorted_class_order():
    g = torch.Generator().manual_seed(0)
    support, queries = torch.randn(6, 5, generator=g), torch.randn(4, 5, generator=g)
    support_y = torch.tensor([7, 2, 7, 2, 2, 7])
    means = torch.stack([support[support_y == 2].mean(0), support[support_y == 7].mean(0)])
    expected = -torch.cdist(queries, means).pow(2)
    assert torch.allclose(prototype_logits(queries, support, support_y), expected, atol=1e-5)


def test_episodic_training_improves_few_shot_accuracy_on_held_out_classes():
    torch.manual_seed(0)
    net = nn.Linear(SIGNAL + NOISE, 8)
    x, y = clusters(classes=20, per_class=30, seed=1)
    held_x, held_y = clusters(classes=5, per_class=30, seed=2)  # classes training never sees
    before = few_shot_accuracy(net, held_x, held_y, shots=1)
    losses = train_prototypical(net, net, x, y, ways=5, shots=1, queries=5, episodes=300, lr=0.01,
                                generator=torch.Generator().manual_seed(0))
    after = few_shot_accuracy(net, held_x, held_y, shots=1)
    assert len(losses) == 300
    assert sum(losses[-30:]) < 0.5 * sum(losses[:30])
    assert after > before + 0.2, (before, after)


def test_the_same_generator_seed_draws_the_same_episodes_and_the_mode_is_restored():
    x, y = clusters(classes=6, per_class=10, seed=1)
    runs = []
    for _ in range(2):
        torch.manual_seed(0)
        net = nn.Sequential(nn.Linear(SIGNAL + NOISE, 8))
        net.eval()
        seen: list[Tensor] = []
        losses = train_prototypical(net, net, x, y, ways=3, shots=2, queries=2, episodes=5, lr=0.01,
                                    generator=torch.Generator().manual_seed(3),
                                    augment=lambda images: seen.append(images) or images)
        assert not net.training and len(seen) == 5 and seen[0].shape == (3 * (2 + 2), SIGNAL + NOISE)
        runs.append(losses)
    assert runs[0] == runs[1]


def test_too_few_usable_classes_and_a_frozen_net_are_refused():
    x, y = clusters(classes=4, per_class=10, seed=1)
    y[y == 3] = 2  # class 2 has 20 images, the others 10
    net = nn.Linear(SIGNAL + NOISE, 8)
    with pytest.raises(ValueError, match="1 such classes"):
        train_prototypical(net, net, x, y, ways=2, shots=5, queries=10, episodes=1, lr=0.01,
                           generator=torch.Generator())
    with pytest.raises(ValueError, match="requires_grad"):
        train_prototypical(net.requires_grad_(False), net, x, y, ways=2, shots=2, queries=2, episodes=1, lr=0.01,
                           generator=torch.Generator())
