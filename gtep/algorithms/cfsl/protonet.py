"""A meta-trained Prototypical Network for continual few-shot learning (Snell et al., "Prototypical Networks for
Few-shot Learning", NeurIPS 2017; the ProtoNets the CFSL spec's companion code trains, notes 002.3).

Before any task, the pretrained backbone is meta-trained by episodes (gtep/algorithms/_episodic.py): `meta_ways`
classes of those it was pretrained on (kept out of both phases), `meta_shots` support and `meta_queries` query
images each, the queries classified by squared Euclidean distance to the support means, Adam at `meta_lr`,
`episodes` of them. The defaults are the spec's reference task shape (NC = 5, K_S = 1, K_T = 5), so the embedding
is trained for the episodes it meets. Then each task runs the prototype learner (prototypes.py) on the
meta-trained, frozen embedding: one pass over the support stream, one running class mean per label, scores
-|f - mu|^2. Across-task memory: the prototypes and counts, as for cfsl_prototypes; MACs: the meta-training is
done once per run, before the tasks, so the per-task MACs are the prototype learner's.

Simplified: no learning-rate halving (Snell halve it every 2000 episodes; a CPU run takes a few hundred), no
augmentation of the episodes (Snell's Omniglot rotations add classes, not views), and the batch statistics of
BatchNorm are used while meta-training (train mode), the running ones after (eval mode, as every CFSL learner).
"""
from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from gtep.algorithms._episodic import generator_from_global_rng, train_prototypical
from gtep.algorithms.base import ALGORITHMS, AT_LEAST_ONE, NON_NEGATIVE, POSITIVE
from gtep.algorithms.cfsl.base import load_pretrain_images
from gtep.algorithms.cfsl.prototypes import CfslPrototypes, PrototypeParams
from gtep.models import Backbone


@dataclass(frozen=True)
class ProtoNetParams(PrototypeParams):
    episodes: int = 200  # meta-training episodes before the tasks
    meta_lr: float = 1e-3  # Adam's (Snell et al. 2017, section 3)
    meta_ways: int = 5
    meta_shots: int = 1
    meta_queries: int = 5
    ranges = {"episodes": NON_NEGATIVE, "meta_lr": POSITIVE, "meta_ways": AT_LEAST_ONE, "meta_shots": AT_LEAST_ONE,
              "meta_queries": AT_LEAST_ONE}


@ALGORITHMS.register("cfsl_protonet")
class CfslProtoNet(CfslPrototypes):
    """Episodic meta-training on the pretrain classes, then the prototype learner (module docstring)."""

    Params = ProtoNetParams
    params: ProtoNetParams
    meta_trains = True

    def meta_train(self, backbone: Backbone) -> None:
        p = self.params
        if p.episodes == 0:
            return
        images = load_pretrain_images(self.weights, self.device)
        backbone.to(self.device)

        def embed(x: Tensor) -> Tensor:
            return backbone(x)["features"].float()

        train_prototypical(backbone, embed, images.pixels, images.labels, ways=p.meta_ways, shots=p.meta_shots,
                           queries=p.meta_queries, episodes=p.episodes, lr=p.meta_lr,
                           generator=generator_from_global_rng(), augment=images.view)
