"""The CFSL data flow (gtep/engine/flows/continual_few_shot.py) and its learners: support sets seen once each, the
target set scored after the last, ATM and MACs as the learner's state and operations, the same metrics for the
same seed."""
import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from gtep.algorithms import ALGORITHMS
from gtep.algorithms.base import CommonParams
from gtep.algorithms.cfsl.base import FewShotLearner
from gtep.algorithms.cfsl.finetune import CfslFinetune, FinetuneParams
from gtep.algorithms.cfsl.proto_tune import CfslProtoTune, ProtoTuneParams
from gtep.algorithms.cfsl.prototypes import CfslPrototypes, PrototypeParams
from gtep.engine import OrderingJob, run_ordering
from gtep.engine.flows.continual_few_shot import CfslRun, SupportStream
from gtep.models import create_backbone
from gtep.protocol.families.cfsl.generator import SupportSet
from tests.helpers import load

DATA = "synthetic:classes=12,train=16,test=6"
OPTIONS = {"support_sets": 4, "ways": 2, "shots": 1, "target_shots": 2, "class_change_interval": 2,
           "overwrite": False, "tasks_per_ordering": 2}


def job(algorithm: str, hparams: dict | None = None, ordering: int = 0, **options) -> OrderingJob:
    family_options = tuple(sorted({**OPTIONS, **options}.items()))
    return OrderingJob(algorithm, hparams or {}, "resnet8", (2, 2), tuple(range(8)), seed=3, ordering=ordering,
                       device="cpu", dataset=DATA, family="cfsl", family_options=family_options)


def sets(n: int) -> list[SupportSet]:
    return [SupportSet(i, i, (i,), (0,), (0,)) for i in range(n)]


def test_a_support_stream_yields_each_set_once_and_refuses_a_second_pass():
    loaded = []
    stream = SupportStream(sets(3), lambda s: (loaded.append(s.index) or torch.zeros(1), torch.zeros(1)))
    assert [x.shape for x, _ in stream] == [torch.Size([1])] * 3 and loaded == [0, 1, 2]
    with pytest.raises(RuntimeError, match="seen once"):
        iter(stream)
    fresh = SupportStream(sets(2), lambda s: (torch.zeros(1), torch.zeros(1)))
    next(iter(fresh))
    with pytest.raises(RuntimeError, match="seen once"):  # not even to go back after the first set
        list(fresh)


def test_the_learner_gets_one_support_set_per_call_then_the_target_set(monkeypatch):
    calls = []
    real_learn, real_scores = CfslPrototypes.learn_support, CfslPrototypes.scores

    def learn(self, x, y):
        calls.append(("support", len(x), sorted(y.tolist())))
        return real_learn(self, x, y)

    def scores(self, x):
        calls.append(("target", len(x)))
        return real_scores(self, x)

    monkeypatch.setattr(CfslPrototypes, "learn_support", learn)
    monkeypatch.setattr(CfslPrototypes, "scores", scores)
    out = run_ordering(job("cfsl_prototypes"), load(DATA))
    assert out.status == "finished"
    # per task: 4 support sets of 2 classes x 1 shot (labels 0,1 for block 0; 2,3 for block 1), then 4 classes x
    # 2 support sets x K_T=2 target images
    one_task = [("support", 2, [0, 1])] * 2 + [("support", 2, [2, 3])] * 2 + [("target", 16)]
    assert calls == one_task * 2


def test_same_seed_same_metrics_and_orderings_draw_other_tasks():
    first = run_ordering(job("cfsl_proto_tune", {"steps": 2, "lr": 0.01}), load(DATA))
    again = run_ordering(job("cfsl_proto_tune", {"steps": 2, "lr": 0.01}), load(DATA))
    assert first.metrics == again.metrics and first.class_order == again.class_order
    other = run_ordering(job("cfsl_proto_tune", {"steps": 2, "lr": 0.01}, ordering=1), load(DATA))
    assert other.class_order != first.class_order
    assert set(first.metrics) >= {"target_acc", "target_acc_task_std", "target_acc_ci95", "target_ce", "atm",
                                  "atm_count", "macs", "acc", "avg_acc", "acc_t"}
    assert len(first.acc_matrix) == 2 and first.test_counts == [16, 16]


def test_prototype_atm_and_macs_by_hand():
    data = load(DATA)
    run = CfslRun(job("cfsl_prototypes", {"metric": "euclidean"}), data)
    run.run_task(run.tasks[0])
    labels, dim = 4, 64
    stored = labels * dim * 4 + labels * 4  # float32 prototypes and counts
    side = data.x_train.shape[1]
    assert data.x_train.itemsize == 1  # stored as uint8, but the learner receives float32
    support_bytes = 4 * 2 * 3 * side * side * 4  # 4 support sets x 2 float32 images of 3 x side x side
    assert run.atms[0] == pytest.approx(stored / support_bytes)
    assert run.atm_counts[0] == pytest.approx(labels / 8)  # 4 prototypes over 8 support images
    backbone = create_backbone("resnet8").eval()
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        backbone(torch.zeros(1, 3, side, side))
    per_image = counter.get_total_flops() / 2
    # every support and target image through the backbone once, and the target-prototype products
    assert run.macs[0] == pytest.approx((8 + 16) * per_image + 16 * labels * dim)


class StoreEverything(FewShotLearner[CommonParams]):
    """Keeps every support image as it receives it, one tensor per label (the labels are the keys: the paper's
    ATM leaves the targets out), and scores a target by its nearest stored image: the paper's ATM anchor 1."""

    Params = CommonParams

    def start_task(self, num_labels: int) -> None:
        self.num_labels, self.kept = num_labels, {}

    def learn_support(self, x, y):
        for label in y.unique().tolist():
            mine = x[y == label].clone()
            self.kept[label] = torch.cat([self.kept[label], mine]) if label in self.kept else mine

    def scores(self, x):
        out = torch.full((len(x), self.num_labels), float("-inf"))
        for label, images in self.kept.items():
            out[:, label] = -torch.cdist(x.flatten(1), images.flatten(1)).min(1).values
        return out

    def task_state(self):
        return list(self.kept.values())


def test_a_learner_that_stores_every_support_image_scores_atm_one_in_bytes_and_in_count():
    """The paper's rule 5: storing the whole observed data gives ATM = 1. Both sides are measured in the unit
    the learner receives the images in, so the float32 copies it keeps weigh what the support inputs did."""
    run = CfslRun(job("cfsl_prototypes"), load(DATA))
    run.learner = StoreEverything(CommonParams(), "resnet8", 0, torch.device("cpu"))
    for task in run.tasks:
        run.run_task(task)
    assert run.atms == [1.0, 1.0] and run.atm_counts == [1.0, 1.0]
    metrics = run.finish().metrics
    assert metrics["atm"] == 1.0 and metrics["atm_count"] == 1.0
    assert metrics["target_acc"] > 0.25  # a real learner: nearest stored image beats chance over 4 labels


def embedder(monkeypatch, cls):
    """Make a learner's features its inputs (2-d rows), so updates can be computed by hand."""
    monkeypatch.setattr(cls, "embed", lambda self, x: x.float())


def prototypes(monkeypatch, **params) -> CfslPrototypes:
    embedder(monkeypatch, CfslPrototypes)
    learner = CfslPrototypes(PrototypeParams(**params), "resnet8", 0, torch.device("cpu"))
    learner.start_task(2)
    learner.prototypes = torch.zeros(2, 2)  # 2-d features for the hand computation
    return learner


# label 0 sees (0,0), (2,2) in the first set and (3,3) in the second; label 1 sees (10,0) once
@pytest.mark.parametrize("rule, expected", [("mean", [[5 / 3, 5 / 3], [10.0, 0.0]]),  # all three samples
                                            ("replace", [[3.0, 3.0], [10.0, 0.0]]),  # the latest set's mean
                                            ("ema", [[2.0, 2.0], [10.0, 0.0]])])  # 0.5 (1,1) + 0.5 (3,3)
def test_prototype_update_rules_by_hand(monkeypatch, rule, expected):
    learner = prototypes(monkeypatch, prototype_update=rule, ema_rate=0.5)
    learner.learn_support(torch.tensor([[0.0, 0.0], [2.0, 2.0], [10.0, 0.0]]), torch.tensor([0, 0, 1]))
    learner.learn_support(torch.tensor([[3.0, 3.0]]), torch.tensor([0]))
    assert learner.prototypes.flatten().tolist() == pytest.approx([v for row in expected for v in row])
    assert learner.counts.tolist() == [3.0, 1.0]
    scores = learner.scores(torch.tensor([[2.0, 2.0]]))
    assert scores.argmax(1).item() == 0


def test_a_label_no_support_set_showed_cannot_be_predicted(monkeypatch):
    learner = prototypes(monkeypatch)
    learner.learn_support(torch.tensor([[1.0, 0.0]]), torch.tensor([1]))
    assert learner.scores(torch.tensor([[0.0, 0.0]]))[0, 0] == float("-inf")


def test_head_learners_keep_only_their_head_and_restore_the_backbone_per_task():
    data = load(DATA)
    x = torch.randn(4, 3, 32, 32)
    y = torch.tensor([0, 1, 2, 3])
    learner = CfslFinetune(FinetuneParams(steps=3, lr=0.1, tune_last_block=True), "resnet8", 0, torch.device("cpu"))
    before = {k: v.clone() for k, v in learner.net.state_dict().items()}
    learner.start_task(4)
    learner.learn_support(x, y)
    assert learner.scores(x).shape == (4, 4)
    changed = [k for k, v in learner.net.state_dict().items() if not torch.equal(v, before[k])]
    assert changed and all(k.startswith("stages.2.") for k in changed)  # only the last stage was tuned
    stage = sum(p.numel() for p in learner.net.stages[-1].parameters())
    assert learner.state_bytes() == (64 * 4 + 4 + stage) * 4
    learner.start_task(4)
    assert all(torch.equal(v, before[k]) for k, v in learner.net.state_dict().items())
    plain = CfslFinetune(FinetuneParams(steps=3, lr=0.1), "resnet8", 0, torch.device("cpu"))
    plain.start_task(4)
    plain.learn_support(x, y)
    assert plain.state_bytes() == (64 * 4 + 4) * 4
    # no gradient step: the last stage stays the pretrained one, so it stores nothing of the support sets
    untouched = CfslProtoTune(ProtoTuneParams(steps=0, tune_last_block=True), "resnet8", 0, torch.device("cpu"))
    untouched.start_task(4)
    untouched.learn_support(x, y)
    assert untouched.state_bytes() == (64 * 4 + 4) * 4
    del data


def test_proto_tune_with_no_step_is_the_nearest_mean_classifier(monkeypatch):
    embedder(monkeypatch, CfslProtoTune)
    embedder(monkeypatch, CfslPrototypes)
    rows = torch.tensor([[0.0, 1.0], [4.0, 0.0], [1.0, 5.0]])
    labels = torch.tensor([0, 1, 2])
    tuned = CfslProtoTune(ProtoTuneParams(steps=0), "resnet8", 0, torch.device("cpu"))
    tuned.start_task(3)
    tuned.head = torch.nn.Linear(2, 3)
    tuned.learn_support(rows, labels)
    proto = prototypes(monkeypatch)
    proto.start_task(3)
    proto.prototypes = torch.zeros(3, 2)
    proto.learn_support(rows, labels)
    queries = torch.tensor([[0.5, 0.5], [3.0, 1.0], [1.0, 4.0]])
    # w.f + b = 2 mu.f - |mu|^2 = -|f - mu|^2 + |f|^2: the same ranking as the prototypes' scores
    assert torch.equal(tuned.scores(queries).argmax(1), proto.scores(queries).argmax(1))
    assert torch.allclose(tuned.scores(queries) - queries.pow(2).sum(1, keepdim=True), proto.scores(queries))


def test_a_class_incremental_algorithm_is_refused_for_the_cfsl_family():
    from gtep.config import ConfigError, load_preset, resolve, validate_config

    doc = load_preset("omniglot-cfsl").model_dump(mode="python")
    doc["algorithm"] = "replay"
    learners = "cfsl_finetune, cfsl_fomaml, cfsl_proto_tune, cfsl_protonet, cfsl_prototypes"
    with pytest.raises(ConfigError, match=learners):
        resolve(validate_config(doc, "test"))
    assert "continual_few_shot" not in ALGORITHMS.get("replay").data_flows


@pytest.mark.parametrize("algorithm", ["cfsl_protonet", "cfsl_fomaml"])
def test_a_meta_learner_without_weights_that_name_their_classes_is_refused_before_compute(algorithm, tmp_path):
    from gtep.config import ConfigError, load_preset, resolve, validate_config

    doc = load_preset("omniglot-cfsl").model_dump(mode="python")
    doc["algorithm"] = algorithm
    resolve(validate_config(doc, "test"))  # the preset's pretrain: section names them
    doc.pop("pretrain")
    with pytest.raises(ConfigError) as refused:
        resolve(validate_config(doc, "test"))
    assert refused.value.field == "weights" and "pretrain: section" in str(refused.value)
