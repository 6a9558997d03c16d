"""Mel spectrogram, in power or dB."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

import librosa
import numpy as np
from pydantic import Field, ValidationInfo, field_validator

from labswarm.audio.features._params import (
    Fmax,
    Fmin,
    HopLength,
    NFft,
    TopDb,
    WinLength,
    check_band,
    check_fmax,
    check_win_length,
)
from labswarm.audio.features.base import FeatureConfig, FeatureExtractor, register_extractor
from labswarm.audio.features.shared import Spectra

if TYPE_CHECKING:
    #: The static type of :attr:`MelConfig.power`: a float (a float ``Literal`` is no valid static type, PEP 586)
    MelPower = float
else:
    #: ``power``: pydantic validates it as one of these values (and lists them in the JSON schema)
    MelPower = Literal[1.0, 2.0]


class MelConfig(FeatureConfig):
    """Parameters of :class:`Mel` (defaults are librosa's).

    Attributes:
        n_fft: FFT size in samples.
        hop_length: samples between frames.
        win_length: window length in samples, at most ``n_fft``; ``None`` means ``n_fft``.
        n_mels: number of mel bands (1 to 1024).
        fmin: lowest band edge in Hz.
        fmax: highest band edge in Hz, above ``fmin`` and at most ``sr / 2`` (checked at compute time);
            ``None`` means ``sr / 2``.
        power: exponent of the magnitude before the mel filter bank: 1 for magnitude, 2 for power.
        log: convert to dB re 1.0 (:func:`librosa.power_to_db` for power 2, :func:`librosa.amplitude_to_db`
            for power 1, so either gives ``20 * log10`` of the magnitude scale).
        top_db: with ``log``, keep this many dB below the clip's peak; ``None`` keeps everything.
    """

    n_fft: NFft = 2048
    hop_length: HopLength = 512
    win_length: WinLength = None
    n_mels: int = Field(default=128, ge=1, le=1024)
    fmin: Fmin = 0.0
    fmax: Fmax = None
    power: MelPower = 2.0
    log: bool = True
    top_db: TopDb = 80.0

    @field_validator("win_length")
    @classmethod
    def _win_length(cls, value: int | None, info: ValidationInfo) -> int | None:
        return check_win_length(value, info.data.get("n_fft"))

    @field_validator("fmax")
    @classmethod
    def _fmax(cls, value: float | None, info: ValidationInfo) -> float | None:
        return check_fmax(value, info.data.get("fmin"))


@register_extractor
class Mel(FeatureExtractor):
    """Mel spectrogram (:func:`librosa.feature.melspectrogram`: centred Hann frames, Slaney mel scale and
    area normalisation, librosa's defaults).

    Returns float32 ``(n_mels, 1 + n_samples // hop_length)``: power (or magnitude with ``power=1``), or dB re
    1.0 with ``log``.

    Raises:
        FeatureError: ``fmax`` above, or ``fmin`` not below, the Nyquist frequency of the audio.
    """

    name = "mel"
    config_model = MelConfig
    config: MelConfig

    def bins(self, sr: int) -> int:
        """``n_mels`` (the band checked against ``sr``'s Nyquist frequency first)."""
        check_band(self.name, self.config.fmin, self.config.fmax, sr)
        return self.config.n_mels

    def compute(self, y: np.ndarray, sr: int, spectra: Spectra) -> np.ndarray:
        """Mel spectrogram of ``y`` (float32 ``(n,)`` at ``sr`` Hz): float32 ``(n_mels, 1 + n // hop)``."""
        c = self.config
        check_band(self.name, c.fmin, c.fmax, sr)
        s = spectra.mel(c.n_fft, c.hop_length, c.win_length, c.n_mels, c.fmin, c.fmax, c.power)
        if not c.log:
            return s
        if c.power == 2.0:
            return librosa.power_to_db(s, ref=1.0, top_db=c.top_db)
        return librosa.amplitude_to_db(s, ref=1.0, top_db=c.top_db)
