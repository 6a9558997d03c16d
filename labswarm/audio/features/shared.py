"""Intermediate results shared by the extractors of one waveform: the STFT magnitude and mel power.

An experiment that asks for a mel spectrogram and MFCCs with the same frame settings computes one STFT and one
mel projection, not two (librosa computes each from the waveform). The mel filter bank is cached per process.
Results equal librosa's own path: the same ``librosa.stft`` and ``librosa.filters.mel``, the same projection
(``einsum`` as in :func:`librosa.feature.melspectrogram`).
"""

from __future__ import annotations

from functools import lru_cache

import librosa
import numpy as np


@lru_cache(maxsize=32)
def mel_basis(sr: int, n_fft: int, n_mels: int, fmin: float, fmax: float | None) -> np.ndarray:
    """The mel filter bank (:func:`librosa.filters.mel`, Slaney scale and norm): float32 ``(n_mels, 1 + n_fft//2)``,
    cached (building it costs ~1 ms; it depends only on these parameters). Read-only."""
    basis = librosa.filters.mel(sr=sr, n_fft=n_fft, n_mels=n_mels, fmin=fmin, fmax=fmax)
    basis.setflags(write=False)
    return basis


class Spectra:
    """Memoized spectral representations of one waveform.

    Args:
        y: mono waveform, float32 ``(n,)``.
        sr: its sample rate in Hz.
    """

    def __init__(self, y: np.ndarray, sr: int) -> None:
        self.y = y
        self.sr = sr
        self._magnitude: dict[tuple, np.ndarray] = {}
        self._mel: dict[tuple, np.ndarray] = {}

    def magnitude(self, n_fft: int, hop_length: int, win_length: int | None = None,
                  window: str = "hann") -> np.ndarray:
        """``|STFT|``: float32 ``(1 + n_fft // 2, 1 + n // hop_length)``, centred frames (librosa defaults)."""
        key = (n_fft, hop_length, win_length or n_fft, window)
        found = self._magnitude.get(key)
        if found is None:
            stft = librosa.stft(self.y, n_fft=n_fft, hop_length=hop_length, win_length=win_length, window=window)
            found = self._magnitude[key] = np.abs(stft)
        return found

    def mel(self, n_fft: int, hop_length: int, win_length: int | None, n_mels: int, fmin: float,
            fmax: float | None, power: float) -> np.ndarray:
        """Mel spectrogram ``mel_basis · |STFT|**power``: float32 ``(n_mels, 1 + n // hop_length)``, as
        :func:`librosa.feature.melspectrogram` computes it."""
        key = (n_fft, hop_length, win_length or n_fft, n_mels, fmin, fmax, power)
        found = self._mel.get(key)
        if found is None:
            spec = self.magnitude(n_fft, hop_length, win_length) ** power
            basis = mel_basis(self.sr, n_fft, n_mels, fmin, fmax)
            found = self._mel[key] = np.einsum("...ft,mf->...mt", spec, basis, optimize=True)
        return found
