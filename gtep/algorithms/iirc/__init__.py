"""IIRC's multi-label learners (papers/iirc.txt): one module each on the multi-label base (base.py)."""
from gtep.algorithms.iirc import (  # noqa: F401  (register)
    agem,
    er_infinite,
    finetune,
    icarl_cnn,
    icarl_norm,
    joint,
    lucir,
    replay,
)
