"""FLUID's stream learners (papers/fluid.txt Sec. 4): one module each on the stream base (base.py)."""
from gtep.algorithms.fluid import et, finetune, ncm, standard  # noqa: F401  (register)
