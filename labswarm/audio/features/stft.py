"""Linear-magnitude short-time Fourier transform."""

from __future__ import annotations

import librosa
import numpy as np
from pydantic import ValidationInfo, field_validator

from labswarm.audio.features._params import HopLength, NFft, WinLength, check_win_length
from labswarm.audio.features.base import FeatureConfig, FeatureExtractor, register_extractor
from labswarm.audio.features.shared import Spectra


class StftConfig(FeatureConfig):
    """Parameters of :class:`Stft`.

    Attributes:
        n_fft: FFT size in samples (16 to 65536); ``1 + n_fft // 2`` frequency bins from 0 Hz to ``sr / 2``.
        hop_length: samples between frames (librosa's default 512 = 23 ms at 22.05 kHz).
        win_length: window length in samples, at most ``n_fft`` (zero-padded to it); ``None`` means ``n_fft``.
        window: a window name :func:`scipy.signal.get_window` knows (``hann``, ``hamming``, ``blackman``, ...).
    """

    n_fft: NFft = 2048
    hop_length: HopLength = 512
    win_length: WinLength = None
    window: str = "hann"

    @field_validator("win_length")
    @classmethod
    def _win_length(cls, value: int | None, info: ValidationInfo) -> int | None:
        return check_win_length(value, info.data.get("n_fft"))

    @field_validator("window")
    @classmethod
    def _window(cls, value: str) -> str:
        from scipy import signal  # here, not at import: scipy.signal takes ~1 s to import, a learner reading
                                  # its features from the store never needs it
        try:
            signal.get_window(value, 16)
        except ValueError as exc:
            raise ValueError(f"unknown window {value!r}: {exc}") from None
        return value


@register_extractor
class Stft(FeatureExtractor):
    """Magnitude spectrogram ``|STFT|`` (:func:`librosa.stft`, centred frames, zero padding).

    Returns float32 ``(1 + n_fft // 2, 1 + n_samples // hop_length)``, linear magnitude (same scale as the
    waveform times the window sum); bin ``k`` is at ``k * sr / n_fft`` Hz.
    """

    name = "stft"
    config_model = StftConfig
    config: StftConfig

    def compute(self, y: np.ndarray, sr: int, spectra: Spectra) -> np.ndarray:
        """Magnitude spectrogram of ``y`` (float32 ``(n,)``): float32 ``(1 + n_fft // 2, 1 + n // hop)``."""
        c = self.config
        return spectra.magnitude(c.n_fft, c.hop_length, c.win_length, c.window)

    def spectrum(self, y: np.ndarray) -> np.ndarray:
        """The complex STFT of ``y``: complex64 ``(1 + n_fft // 2, 1 + n // hop_length)``."""
        c = self.config
        return librosa.stft(y, n_fft=c.n_fft, hop_length=c.hop_length, win_length=c.win_length, window=c.window)
