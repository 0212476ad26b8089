"""Continual few-shot learners (papers/cfsl-task-definitions.txt): one module each on the CFSL base (base.py)."""
from gtep.algorithms.cfsl import finetune, fomaml, proto_tune, protonet, prototypes  # noqa: F401  (register)
