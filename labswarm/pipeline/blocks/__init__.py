"""The built-in pipeline blocks, registered by name: source, shuffle, features, batch, prefetch."""

from labswarm.pipeline.blocks.batch import Batch, BatchConfig, Batcher
from labswarm.pipeline.blocks.features import Features, FeaturesConfig, Item
from labswarm.pipeline.blocks.shuffle import Shuffle, ShuffleConfig
from labswarm.pipeline.blocks.source import Source, SourceConfig
from labswarm.pipeline.prefetch import Prefetch, PrefetchConfig

__all__ = [
    "Batch", "BatchConfig", "Batcher",
    "Features", "FeaturesConfig", "Item",
    "Prefetch", "PrefetchConfig",
    "Shuffle", "ShuffleConfig",
    "Source", "SourceConfig",
]
