"""IncrementalLearner.distilled_cross_entropy, the loss BiC and WA train with: kd_weight 0 weighs distillation by
known / total classes (both papers' adaptive rule), a positive kd_weight gives CE + kd_weight * KD."""
import pytest
import torch

from gtep.algorithms import ALGORITHMS


@pytest.mark.parametrize(("algorithm", "lambda_kd"), [("bic", 1.5), ("wa", 2.0)])
def test_adaptive_weight_is_known_over_total(algorithm, lambda_kd):
    params = ALGORITHMS.get(algorithm).Params(T=2.0, lambda_kd=0.0)
    learner = ALGORITHMS.get(algorithm)(params, "resnet8", 0, torch.device("cpu"))
    learner.known, learner.total = 3, 5
    learner.net.expand(3)
    learner.old_net = learner.frozen_copy(learner.net)
    learner.net.expand(5)
    x, y = torch.randn(6, 3, 16, 16), torch.tensor([0, 1, 2, 3, 4, 4])
    learner.net.eval()
    logits, old = learner.net(x)["logits"], learner.old_net(x)["logits"]
    ce = torch.nn.functional.cross_entropy(logits, y)
    kd = -(torch.softmax(old / 2, 1) * torch.log_softmax(logits[:, :3] / 2, 1)).sum(1).mean()
    assert torch.allclose(learner.loss(x, y), 0.6 * kd + 0.4 * ce)
    learner.params = ALGORITHMS.get(algorithm).Params(T=2.0, lambda_kd=lambda_kd)
    assert torch.allclose(learner.loss(x, y), ce + lambda_kd * kd)
