"""Class-incremental algorithms, one file each, found through the ALGORITHMS registry."""
from gtep.algorithms.base import ALGORITHMS, CommonParams, FitRecipe, IncrementalLearner, TaskData
from gtep.algorithms import replay, icarl  # noqa: F401  (registration)

__all__ = ["ALGORITHMS", "CommonParams", "FitRecipe", "IncrementalLearner", "TaskData"]
