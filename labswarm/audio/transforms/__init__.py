"""Transformations (data augmentations), registered by name. Importing this package registers the built-ins."""

from labswarm.audio.transforms import identity  # noqa: F401  (registers)
from labswarm.audio.transforms.base import (
    TRANSFORMATIONS,
    Transformation,
    TransformationConfig,
    register_transformation,
)

__all__ = ["TRANSFORMATIONS", "Transformation", "TransformationConfig", "register_transformation"]
