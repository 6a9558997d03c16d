"""Log-magnitude (dB) short-time Fourier transform."""

from __future__ import annotations

import librosa
import numpy as np

from labswarm.audio.features._params import TopDb
from labswarm.audio.features.base import register_extractor
from labswarm.audio.features.shared import Spectra
from labswarm.audio.features.stft import Stft, StftConfig


class LogSpectrogramConfig(StftConfig):
    """Parameters of :class:`LogSpectrogram`: those of :class:`~labswarm.audio.features.stft.StftConfig`, plus

    Attributes:
        top_db: keep this many dB below the clip's peak, clamping lower values; ``None`` keeps everything down
            to the -100 dB floor (librosa's ``amin=1e-5``). Default 80 (librosa's).
    """

    top_db: TopDb = 80.0


@register_extractor
class LogSpectrogram(Stft):
    """Magnitude spectrogram in dB re 1.0 (``20 * log10(max(|STFT|, 1e-5))``, :func:`librosa.amplitude_to_db`).

    Returns float32 ``(1 + n_fft // 2, 1 + n_samples // hop_length)``, dB.
    """

    name = "log_spectrogram"
    config_model = LogSpectrogramConfig
    config: LogSpectrogramConfig

    def compute(self, y: np.ndarray, sr: int, spectra: Spectra) -> np.ndarray:
        """dB spectrogram of ``y`` (float32 ``(n,)``): float32 ``(1 + n_fft // 2, 1 + n // hop)``."""
        c = self.config
        magnitude = spectra.magnitude(c.n_fft, c.hop_length, c.win_length, c.window)
        return librosa.amplitude_to_db(magnitude, ref=1.0, top_db=c.top_db)
