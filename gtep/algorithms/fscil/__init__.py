"""FSCIL's own learners (papers/fscil-gacc.txt; the nine ResNet CIL methods run FSCIL too): one module each.
The training-frozen prototype baseline, the compared methods CEC, FACT and NC-FSCIL, and the paper's own
feature rectification on a ViT."""
from gtep.algorithms.fscil import cec, fact, feature_rectification, frozen_prototypes, nc_fscil  # noqa: F401  (register)
