"""Pitch shift: move every frequency by a fixed number of steps, keeping the duration."""

from __future__ import annotations

import numpy as np
from pydantic import Field, field_validator

from labswarm.audio.transforms.base import Transformation, TransformationConfig, register_transformation
from labswarm.audio.transforms.vocoder import pitch_shift

#: Resampler used after the phase-vocoder stretch. soxr's "HQ" is librosa's default and what audiomentations
#: uses for its librosa method; the lower soxr qualities measured no faster here (the phase vocoder dominates).
RES_TYPE = "soxr_hq"


class PitchShiftConfig(TransformationConfig):
    """Parameters of :class:`PitchShift`.

    Attributes:
        semitones: the shift in steps of ``1 / bins_per_octave`` octave (semitones with the default 12);
            negative is down. Nonzero, at most 24 steps either way. Frequencies scale by
            ``2 ** (semitones / bins_per_octave)``.
        bins_per_octave: steps per octave, at least 1.
    """

    semitones: float = Field(ge=-24.0, le=24.0)
    bins_per_octave: int = Field(default=12, ge=1, le=120)

    @field_validator("semitones")
    @classmethod
    def _nonzero(cls, value: float) -> float:
        if value == 0:
            raise ValueError("must be nonzero (use the `identity` transformation for no shift)")
        return value


@register_transformation
class PitchShift(Transformation):
    """Shift the pitch without changing the tempo: a phase-vocoder time stretch, then resampling.

    What :func:`librosa.effects.pitch_shift` computes (STFT with ``n_fft=2048``, hop 512; resampler :data:`RES_TYPE`),
    through :mod:`labswarm.audio.transforms.vocoder` (without scikit-learn's import).
    The output has exactly the input's length. Deterministic: the seed is not used.
    """

    name = "pitch_shift"
    config_model = PitchShiftConfig
    random = False
    config: PitchShiftConfig

    def apply(self, y: np.ndarray, sr: int, rng: np.random.Generator) -> np.ndarray:
        """Shift ``y`` (float32 ``(n,)`` at ``sr`` Hz); returns float32 ``(n,)``."""
        return pitch_shift(y, sr, self.config.semitones, self.config.bins_per_octave, RES_TYPE)
