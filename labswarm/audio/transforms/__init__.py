"""Transformations (data augmentations), registered by name. Importing this package registers the built-ins."""

from labswarm.audio.transforms.add_noise import AddNoise, AddNoiseConfig
from labswarm.audio.transforms.base import (
    TRANSFORMATIONS,
    Transformation,
    TransformationConfig,
    register_transformation,
)
from labswarm.audio.transforms.codec import Codec, CodecConfig
from labswarm.audio.transforms.eq import Eq, EqBand, EqConfig
from labswarm.audio.transforms.gain import Gain, GainConfig
from labswarm.audio.transforms.identity import Identity
from labswarm.audio.transforms.pitch_shift import PitchShift, PitchShiftConfig
from labswarm.audio.transforms.time_stretch import TimeStretch, TimeStretchConfig

__all__ = [
    "TRANSFORMATIONS",
    "AddNoise",
    "AddNoiseConfig",
    "Codec",
    "CodecConfig",
    "Eq",
    "EqBand",
    "EqConfig",
    "Gain",
    "GainConfig",
    "Identity",
    "PitchShift",
    "PitchShiftConfig",
    "TimeStretch",
    "TimeStretchConfig",
    "Transformation",
    "TransformationConfig",
    "register_transformation",
]
