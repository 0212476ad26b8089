"""FLUID's stream learners (papers/fluid.txt Sec. 4): one module each on the stream base (base.py)."""
from gtep.algorithms.fluid import (  # noqa: F401  (register)
    et,
    ewc,
    finetune,
    imprinting,
    lwf,
    ncm,
    oltr,
    protonet,
    standard,
)
