"""Time stretch: change the tempo (and duration) without changing the pitch."""

from __future__ import annotations

import numpy as np
from pydantic import Field

from labswarm.audio.transforms.base import Transformation, TransformationConfig, register_transformation
from labswarm.audio.transforms.vocoder import time_stretch


class TimeStretchConfig(TransformationConfig):
    """Parameters of :class:`TimeStretch`.

    Attributes:
        rate: speed factor, in [0.1, 10] (audiomentations' bounds): above 1 is faster and shorter, below 1
            slower and longer. The output has ``round(n / rate)`` samples, so the bounds keep it within 10× the
            input.
    """

    rate: float = Field(ge=0.1, le=10.0)


@register_transformation
class TimeStretch(Transformation):
    """Phase-vocoder time stretch (what :func:`librosa.effects.time_stretch` computes, STFT ``n_fft=2048``, hop 512,
    through :mod:`labswarm.audio.transforms.vocoder`).

    The output length is ``round(n_samples / rate)``: this transformation changes the duration. Deterministic.
    """

    name = "time_stretch"
    config_model = TimeStretchConfig
    random = False
    config: TimeStretchConfig

    def apply(self, y: np.ndarray, sr: int, rng: np.random.Generator) -> np.ndarray:
        """Stretch ``y`` (float32 ``(n,)``); returns float32 ``(round(n / rate),)``."""
        return time_stretch(y, self.config.rate)
