"""Datasets: a registry of sources that load to in-memory uint8 image arrays."""
from gtep.data.datasets import DATASETS, DatasetError, DatasetSource, ImageSet, resolve_dataset

__all__ = ["DATASETS", "ImageSet", "DatasetSource", "DatasetError", "resolve_dataset"]
