"""FSCIL's own learners (papers/fscil-gacc.txt; the nine ResNet CIL methods run FSCIL too): one module each."""
from gtep.algorithms.fscil import frozen_prototypes  # noqa: F401  (register)
