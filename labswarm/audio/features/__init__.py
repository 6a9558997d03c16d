"""Feature extractors, registered by name. Importing this package registers the built-ins."""

from labswarm.audio.features.base import EXTRACTORS, FeatureConfig, FeatureExtractor, register_extractor

__all__ = ["EXTRACTORS", "FeatureConfig", "FeatureExtractor", "register_extractor"]
