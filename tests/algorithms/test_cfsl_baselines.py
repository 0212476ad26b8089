"""The CFSL meta-learners (gtep/algorithms/cfsl/protonet.py, fomaml.py) on a backbone pretrained by gtep pretrain on
classes kept out of the tasks: ProtoNet's episodic training makes few-shot nearest-mean classification of held-out
classes better than the plain pretrained backbone does (Snell et al. 2017); first-order MAML's adaptation lowers
the support loss, its meta-training makes adaptation to held-out classes better (Finn et al. 2017), and its task
knowledge lives in task_state() only; in a CFSL ordering the two separate by ATM and MACs as the spec intends."""
import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from gtep.algorithms import ALGORITHMS
from gtep.algorithms.cfsl.base import load_pretrain_images
from gtep.algorithms.cfsl.fomaml import CfslFomaml, FomamlParams
from gtep.data import resolve_dataset
from gtep.engine import OrderingJob, run_ordering
from gtep.engine.pretrain import default_spec, pretrain

# random 8x8 colour patterns under heavy noise: a couple of pretraining epochs leave the backbone poor at them,
# so what meta-training adds shows
DATA = "synthetic:classes=30,train=20,test=5,size=16,noise=110"
PRETRAIN, HELD_OUT = tuple(range(20)), tuple(range(20, 30))
CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def weights(tmp_path_factory) -> str:
    source = resolve_dataset(DATA)
    out = Path(tmp_path_factory.mktemp("cfsl-weights")) / "resnet8.safetensors"
    pretrain(default_spec("resnet8", PRETRAIN, epochs=2, batch_size=32, device="cpu"), source.load(), source.name, out)
    return str(out)


def learner(name: str, weights: str | None, **hparams):
    torch.manual_seed(0)
    algorithm = ALGORITHMS.get(name)
    return algorithm(algorithm.Params.from_mapping(hparams), "resnet8", 0, CPU, weights)


def held_out_tasks(weights: str, count: int = 20, ways: int = 5, queries: int = 4):
    """`count` 5-way 1-shot tasks of the held-out classes' training images, fed as the phases feed them."""
    view = load_pretrain_images(weights, CPU).view
    data = resolve_dataset(DATA).load().subset(list(HELD_OUT))
    x, y = view(torch.from_numpy(data.x_train).permute(0, 3, 1, 2)), torch.from_numpy(data.y_train)
    g = torch.Generator().manual_seed(0)
    tasks = []
    for _ in range(count):
        classes = torch.tensor(HELD_OUT)[torch.randperm(len(HELD_OUT), generator=g)[:ways]]
        picks = [torch.nonzero(y == c).flatten()[torch.randperm(20, generator=g)[:1 + queries]] for c in classes]
        support = torch.stack([p[0] for p in picks])
        query = torch.cat([p[1:] for p in picks])
        tasks.append((x[support], torch.arange(ways), x[query], torch.arange(ways).repeat_interleave(queries)))
    return tasks


def accuracy(model, tasks) -> float:
    correct = []
    for xs, ys, xq, yq in tasks:
        model.start_task(len(ys.unique()))
        model.learn_support(xs, ys)
        correct.append(float((model.scores(xq).argmax(1) == yq).float().mean()))
    return sum(correct) / len(correct)


def test_the_pretrain_images_are_the_classes_the_weights_name_and_weights_are_required(weights):
    images = load_pretrain_images(weights, CPU)
    assert images.pixels.dtype == torch.uint8 and sorted(images.labels.unique().tolist()) == list(PRETRAIN)
    assert len(images.labels) == 20 * len(PRETRAIN)
    with pytest.raises(ValueError, match="classes kept out of both phases"):
        learner("cfsl_protonet", None)
    # no episode: nothing is loaded and the embedding is the pretrained one, so it is the prototype learner
    plain, none = learner("cfsl_prototypes", weights), learner("cfsl_protonet", weights, episodes=0)
    x = torch.randn(6, 3, 16, 16)
    assert torch.equal(plain.embed(x), none.embed(x))


def test_protonet_episodic_training_improves_few_shot_accuracy_on_held_out_classes(weights):
    tasks = held_out_tasks(weights)
    before = accuracy(learner("cfsl_prototypes", weights), tasks)
    protonet = learner("cfsl_protonet", weights, episodes=100)
    after = accuracy(protonet, tasks)
    assert after > before + 0.1, (before, after)  # measured: 0.34 -> 0.60
    assert not any(p.requires_grad for p in protonet.net.parameters())  # frozen for the tasks, as every learner
    assert [tuple(t.shape) for t in protonet.task_state()] == [(5, 64), (5,)]  # prototypes and counts only


def test_fomaml_adaptation_lowers_the_support_loss_step_after_step(weights):
    xs, ys, _, _ = held_out_tasks(weights, count=1)[0]
    losses = []
    for steps in (0, 1, 3, 10):
        model = learner("cfsl_fomaml", weights, episodes=0, steps=steps, lr=0.1)
        model.start_task(5)
        model.learn_support(xs, ys)
        losses.append(F.cross_entropy(model.scores(xs), ys).item())
    assert losses[0] == pytest.approx(math.log(5))  # no step: the zero head, uniform over the labels
    assert losses == sorted(losses, reverse=True) and losses[-1] < 0.9 * losses[0], losses


def test_fomaml_state_lives_only_in_task_state_and_start_task_restores_the_meta_learned_weights():
    model = CfslFomaml(FomamlParams(episodes=0, steps=2, lr=0.1), "resnet8", 0, CPU)
    g = torch.Generator().manual_seed(2)
    sets = [(torch.randn(4, 3, 16, 16, generator=g), torch.tensor([0, 1, 2, 3])) for _ in range(2)]
    target = torch.randn(6, 3, 16, 16, generator=g)
    model.start_task(4)
    initial = {k: v.clone() for k, v in model.net.state_dict().items()}
    for x, y in sets:
        model.learn_support(x, y)
    changed = [v for k, v in model.net.state_dict().items() if not torch.equal(v, initial[k])]
    state = model.task_state()
    held = {t.data_ptr() for t in state}
    assert changed and all(v.data_ptr() in held for v in changed)  # every change is a tensor task_state lists
    stage = sum(p.numel() for p in model.net.stages[-1].parameters())
    assert model.state_bytes() == (4 * 64 + 4 + stage) * 4  # the head and the last stage, float32
    first = model.scores(target)
    model.start_task(4)  # another task in between leaves nothing behind
    model.learn_support(torch.randn(4, 3, 16, 16, generator=g), torch.tensor([3, 2, 1, 0]))
    model.start_task(4)
    assert all(torch.equal(v, initial[k]) for k, v in model.net.state_dict().items())
    for x, y in sets:
        model.learn_support(x, y)
    assert torch.equal(model.scores(target), first)


def test_fomaml_meta_training_improves_adaptation_to_held_out_classes(weights):
    tasks = held_out_tasks(weights)
    hparams = {"lr": 0.4, "steps": 3, "tune_last_block": False}
    before = accuracy(learner("cfsl_fomaml", weights, episodes=0, **hparams), tasks)
    meta = learner("cfsl_fomaml", weights, episodes=0, **hparams)
    meta.params = replace(meta.params, episodes=100)  # meta-trained here, to see its losses
    losses = meta.meta_train_on(meta.net.requires_grad_(True), load_pretrain_images(weights, CPU))
    meta.net.eval().requires_grad_(False)
    after = accuracy(meta, tasks)
    assert sum(losses[-30:]) < sum(losses[:30])  # the post-adaptation query loss falls with the meta-updates
    assert after > before + 0.1, (before, after)  # measured: 0.25 -> 0.5


def test_in_a_cfsl_ordering_fomaml_holds_fast_weights_and_spends_more_macs_than_protonet(weights):
    options = {"support_sets": 4, "ways": 2, "shots": 1, "target_shots": 2, "class_change_interval": 2,
               "overwrite": False, "tasks_per_ordering": 2}
    outcomes = {}
    for name, hparams in (("cfsl_prototypes", {}), ("cfsl_protonet", {"episodes": 5}),
                          ("cfsl_fomaml", {"episodes": 5, "lr": 0.1})):
        job = OrderingJob(name, hparams, "resnet8", (2, 2), HELD_OUT, seed=0, ordering=0, device="cpu",
                          weights=weights, dataset=DATA, family="cfsl", family_options=tuple(sorted(options.items())))
        outcomes[name] = run_ordering(job, resolve_dataset(DATA).load())
        assert outcomes[name].status == "finished", outcomes[name].message
    proto, protonet, maml = (outcomes[n].metrics for n in ("cfsl_prototypes", "cfsl_protonet", "cfsl_fomaml"))
    # ProtoNet keeps what the prototype learner keeps (a mean and a count per label) and computes as it does;
    # meta-training is done before the tasks. MAML keeps its fast weights, far more than the support images
    assert protonet["atm"] == proto["atm"] and protonet["atm_count"] == proto["atm_count"]
    assert protonet["macs"] == proto["macs"]
    assert maml["atm"] > 1 > 10 * protonet["atm"]
    # the forward and backward passes of every inner step on the support sets (measured: 1.8 times)
    assert maml["macs"] > 1.5 * protonet["macs"]
