"""The content-addressed feature store: keys, layout, atomic writes, reads."""

from labswarm.store.keys import AudioIdentity, IdentityCache, audio_identity, feature_key
from labswarm.store.store import LAYOUT_VERSION, FeatureStore, StoreStats

__all__ = [
    "LAYOUT_VERSION",
    "AudioIdentity",
    "FeatureStore",
    "IdentityCache",
    "StoreStats",
    "audio_identity",
    "feature_key",
]
