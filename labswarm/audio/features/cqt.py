"""Constant-Q transform magnitude, linear or dB."""

from __future__ import annotations

import warnings

import librosa
import numpy as np
from pydantic import Field

from labswarm.audio.features._params import HopLength, TopDb
from labswarm.audio.features.base import FeatureConfig, FeatureExtractor, register_extractor
from labswarm.audio.features.shared import Spectra
from labswarm.errors import FeatureError

#: C1 in Hz (MIDI note 24, A4 = 440 Hz tuning), librosa's default lowest CQT bin (``librosa.note_to_hz("C1")``).
C1_HZ = 32.70


class CqtConfig(FeatureConfig):
    """Parameters of :class:`Cqt` (defaults are librosa's: 7 octaves of semitones from C1).

    Attributes:
        hop_length: samples between frames.
        fmin: centre frequency of the lowest bin in Hz.
        n_bins: number of bins (1 to 1024); the highest is at ``fmin * 2 ** ((n_bins - 1) / bins_per_octave)``
            Hz, which must be below ``sr / 2`` (checked at compute time).
        bins_per_octave: bins per octave (12: semitones).
        log: convert the magnitude to dB re 1.0 (:func:`librosa.amplitude_to_db`).
        top_db: with ``log``, keep this many dB below the clip's peak; ``None`` keeps everything. Default 80
            (librosa's for ``amplitude_to_db``).
    """

    hop_length: HopLength = 512
    fmin: float = Field(default=C1_HZ, gt=0.0)
    n_bins: int = Field(default=84, ge=1, le=1024)
    bins_per_octave: int = Field(default=12, ge=1, le=240)
    log: bool = True
    top_db: TopDb = 80.0


@register_extractor
class Cqt(FeatureExtractor):
    """Magnitude of the constant-Q transform (:func:`librosa.cqt`, recursive down-sampling, soxr resampling).

    Returns float32 ``(n_bins, 1 + n_samples // hop_length)`` (the multi-rate transform's frame count is
    trimmed or edge-padded to that): linear magnitude, or dB re 1.0 with ``log``.
    Bin ``k`` is centred at ``fmin * 2 ** (k / bins_per_octave)`` Hz.

    Raises:
        FeatureError: the highest bin is not below the Nyquist frequency, or librosa rejects the filter bank
            (a filter's bandwidth crosses the Nyquist frequency).
    """

    name = "cqt"
    config_model = CqtConfig
    config: CqtConfig

    def compute(self, y: np.ndarray, sr: int, spectra: Spectra) -> np.ndarray:
        """CQT magnitude of ``y`` (float32 ``(n,)`` at ``sr`` Hz): float32 ``(n_bins, 1 + n // hop)``."""
        c = self.config
        top_hz = c.fmin * 2.0 ** ((c.n_bins - 1) / c.bins_per_octave)
        if top_hz >= sr / 2.0:
            raise FeatureError(
                f"{self.name}: the highest bin ({top_hz:.1f} Hz) is not below the Nyquist frequency "
                f"{sr / 2.0:g} Hz of {sr} Hz audio; lower n_bins or fmin"
            )
        with warnings.catch_warnings():
            # On short clips (below ~3 s at the defaults) the downsampled low octaves are shorter than their FFT and
            # librosa warns once per octave; the transform is still defined (zero padding), so only that warning
            # is silenced.
            warnings.filterwarnings("ignore", message=r"n_fft=\d+ is too large for input signal", category=UserWarning)
            spectrum = librosa.cqt(
                y, sr=sr, hop_length=c.hop_length, fmin=c.fmin, n_bins=c.n_bins, bins_per_octave=c.bins_per_octave
            )
        # The multi-rate CQT can end one frame off 1 + n // hop_length (its octaves are framed after
        # downsampling): trim, or repeat the last frame, so every extractor frames a clip alike.
        magnitude = librosa.util.fix_length(np.abs(spectrum), size=1 + y.size // c.hop_length, axis=-1, mode="edge")
        if not c.log:
            return magnitude
        return librosa.amplitude_to_db(magnitude, ref=1.0, top_db=c.top_db)
