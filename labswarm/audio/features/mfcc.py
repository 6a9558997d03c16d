"""Mel-frequency cepstral coefficients."""

from __future__ import annotations

import librosa
import numpy as np
from pydantic import Field, ValidationInfo, field_validator

from labswarm.audio.features._params import Fmax, Fmin, HopLength, NFft, check_band, check_fmax
from labswarm.audio.features.base import FeatureConfig, FeatureExtractor, register_extractor
from labswarm.audio.features.shared import Spectra


class MfccConfig(FeatureConfig):
    """Parameters of :class:`Mfcc` (defaults are librosa's).

    Attributes:
        n_mfcc: number of coefficients kept (1 to ``n_mels``).
        n_fft: FFT size in samples.
        hop_length: samples between frames.
        n_mels: number of mel bands the DCT runs over (at least ``n_mfcc``).
        fmin: lowest mel band edge in Hz.
        fmax: highest mel band edge in Hz, above ``fmin`` and at most ``sr / 2`` (checked at compute time);
            ``None`` means ``sr / 2``.
        lifter: cepstral liftering coefficient ``L`` (0 disables it): coefficient ``n`` is scaled by
            ``1 + (L / 2) * sin(pi * (n + 1) / L)``.
    """

    n_mfcc: int = Field(default=20, ge=1, le=1024)
    n_fft: NFft = 2048
    hop_length: HopLength = 512
    n_mels: int = Field(default=128, ge=1, le=1024)
    fmin: Fmin = 0.0
    fmax: Fmax = None
    lifter: int = Field(default=0, ge=0, le=1000)

    @field_validator("n_mels")
    @classmethod
    def _n_mels(cls, value: int, info: ValidationInfo) -> int:
        n_mfcc = info.data.get("n_mfcc")
        if n_mfcc is not None and value < n_mfcc:
            raise ValueError(f"must be at least n_mfcc ({n_mfcc})")
        return value

    @field_validator("fmax")
    @classmethod
    def _fmax(cls, value: float | None, info: ValidationInfo) -> float | None:
        return check_fmax(value, info.data.get("fmin"))


@register_extractor
class Mfcc(FeatureExtractor):
    """MFCCs (:func:`librosa.feature.mfcc`): type-II orthonormal DCT of the log-power mel spectrogram
    (:func:`librosa.power_to_db`, ref 1.0, top_db 80: librosa's defaults), centred Hann frames.

    Returns float32 ``(n_mfcc, 1 + n_samples // hop_length)``, cepstral coefficients (dB scale, unitless DCT).

    Raises:
        FeatureError: ``fmax`` above, or ``fmin`` not below, the Nyquist frequency of the audio.
    """

    name = "mfcc"
    config_model = MfccConfig
    config: MfccConfig

    def bins(self, sr: int) -> int:
        """``n_mfcc`` (the band checked against ``sr``'s Nyquist frequency first)."""
        check_band(self.name, self.config.fmin, self.config.fmax, sr)
        return self.config.n_mfcc

    def compute(self, y: np.ndarray, sr: int, spectra: Spectra) -> np.ndarray:
        """MFCCs of ``y`` (float32 ``(n,)`` at ``sr`` Hz): float32 ``(n_mfcc, 1 + n // hop)``."""
        c = self.config
        check_band(self.name, c.fmin, c.fmax, sr)
        # librosa.feature.mfcc(y=...): power_to_db(melspectrogram(power=2)) (ref 1.0, top_db 80), then the DCT
        log_mel = librosa.power_to_db(spectra.mel(c.n_fft, c.hop_length, None, c.n_mels, c.fmin, c.fmax, 2.0))
        return librosa.feature.mfcc(S=log_mel, sr=sr, n_mfcc=c.n_mfcc, lifter=c.lifter)
