"""Source text of the plugin modules that tests write into a folder on PYTHONPATH (or install as a package) and that
fresh processes import (the CLI's, Ray's workers), as a lab's plugin would be: a learner's network of its own, and
a scenario family of two tasks of two classes. Written once here, so each test states only what its plugin adds."""
from __future__ import annotations

LEARNER_IMPORTS = '''
import torch
from torch import nn

from gtep.algorithms import ALGORITHMS, CommonParams, IncrementalLearner
'''

# a network class of the plugin's own (a learner's checkpoints must be able to rebuild it), and a learner base that
# uses it and no memory; the plugin registers its subclasses
COUNTING_NET = '''
class CountingNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(1))
        self.classes = 0

    def expand(self, total):
        self.classes = max(self.classes, total)

    def forward(self, x):
        logits = self.scale * torch.zeros(len(x), max(self.classes, 1), device=x.device)
        return {"logits": logits, "features": logits}


class CountingLearner(IncrementalLearner[CommonParams]):
    uses_memory = False

    def build_network(self):
        return CountingNet()
'''


def pairs_family(docstring: str, header: str, summary: str = "metrics.summarize(matrix, test_counts)") -> str:
    """A family module: `header` is the class's first lines (decorator, class line, name, description, metrics),
    `summary` what summarize() returns; every such family runs two tasks of two classes."""
    return f'''
"""{docstring}"""
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from gtep.protocol import metrics
from gtep.protocol.families import ACC, ACC_T, AVG_ACC, Metric, TaskFamily, register_family
from gtep.protocol.scenarios import build_scenario


@dataclass(frozen=True)
class PairsOptions:
    @classmethod
    def of(cls, options: Mapping[str, Any]) -> "PairsOptions":
        return cls()


{header.strip()}
    Options = PairsOptions
    default_criterion = "hmean_acc_avgacc"

    def increments(self, options):
        return [2, 2]

    def tasks(self, classes, options, seed, ordering):
        return build_scenario(classes, [2, 2], seed, ordering)

    def summarize(self, matrix, test_counts, tasks):
        return {summary}

    def example_options(self):
        return {{}}
'''
