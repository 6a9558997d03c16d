"""Feature extractors, registered by name. Importing this package registers the built-ins."""

from labswarm.audio.features.base import EXTRACTORS, FeatureConfig, FeatureExtractor, register_extractor
from labswarm.audio.features.cqt import Cqt, CqtConfig
from labswarm.audio.features.log_spectrogram import LogSpectrogram, LogSpectrogramConfig
from labswarm.audio.features.mel import Mel, MelConfig
from labswarm.audio.features.mfcc import Mfcc, MfccConfig
from labswarm.audio.features.stft import Stft, StftConfig

__all__ = [
    "EXTRACTORS",
    "Cqt",
    "CqtConfig",
    "FeatureConfig",
    "FeatureExtractor",
    "LogSpectrogram",
    "LogSpectrogramConfig",
    "Mel",
    "MelConfig",
    "Mfcc",
    "MfccConfig",
    "Stft",
    "StftConfig",
    "register_extractor",
]
