"""Gain: scale the waveform by a fixed number of decibels."""

from __future__ import annotations

import numpy as np
from pydantic import Field

from labswarm.audio.transforms.base import Transformation, TransformationConfig, register_transformation


class GainConfig(TransformationConfig):
    """Parameters of :class:`Gain`.

    Attributes:
        gain_db: amplitude gain in dB, in [-120, 60]; the waveform is multiplied by ``10 ** (gain_db / 20)``.
        clip: clip the result to [-1, 1] (full scale) instead of letting loud peaks exceed it.
    """

    gain_db: float = Field(ge=-120.0, le=60.0)
    clip: bool = False


@register_transformation
class Gain(Transformation):
    """Multiply by ``10 ** (gain_db / 20)``, optionally clipping to [-1, 1]. Deterministic."""

    name = "gain"
    config_model = GainConfig
    random = False
    config: GainConfig

    def apply(self, y: np.ndarray, sr: int, rng: np.random.Generator) -> np.ndarray:
        """Scale ``y`` (float32 ``(n,)``); returns float32 ``(n,)``."""
        out = y * np.float32(10.0 ** (self.config.gain_db / 20.0))
        if self.config.clip:
            np.clip(out, -1.0, 1.0, out=out)
        return out
