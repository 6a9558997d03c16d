"""The identity transformation: the clean clip, always one of an experiment's transformations."""

from __future__ import annotations

import numpy as np

from labswarm.audio.transforms.base import Transformation, register_transformation


@register_transformation
class Identity(Transformation):
    """Returns the waveform unchanged (the un-augmented sample)."""

    name = "identity"
    random = False

    def apply(self, y: np.ndarray, sr: int, rng: np.random.Generator) -> np.ndarray:
        return y
