"""Datasets: a registry of sources that load to uint8 image arrays (ImageFolder trees memory-mapped), and the
data pipelines that feed them to a network."""
from gtep.data.datasets import (
    DATASETS,
    DataFacts,
    DatasetError,
    DatasetSource,
    ImageSet,
    resolve_dataset,
    with_storage,
)

__all__ = ["DATASETS", "DataFacts", "DatasetError", "DatasetSource", "ImageSet", "resolve_dataset", "with_storage"]
