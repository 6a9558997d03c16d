"""The phase-vocoder time stretch and pitch shift of :mod:`librosa.effects`, from librosa's core functions.

What :func:`librosa.effects.time_stretch` and :func:`librosa.effects.pitch_shift` compute (librosa 0.11: an STFT,
:func:`librosa.phase_vocoder`, the inverse STFT; then, for the shift, :func:`librosa.resample` and
:func:`librosa.util.fix_length`), the same calls with the same arguments, so the same samples bit for bit
(tests/audio/test_vocoder.py compares them). Why not call them: importing :mod:`librosa.effects` imports
:mod:`librosa.decompose` and with it scikit-learn (``sklearn.decomposition``), ~0.13 s of CPU of every worker's
start on the 2-core benchmark machine, where both workers' starts come before a short run's first task (issue 27,
docs/benchmarks/distributed.md); nothing here uses scikit-learn.
"""

from __future__ import annotations

import librosa
import numpy as np


def time_stretch(y: np.ndarray, rate: float) -> np.ndarray:
    """``y`` (float ``(n,)``) played ``rate`` times faster, pitch kept: float ``(round(n / rate),)``, the dtype of
    ``y``. STFT ``n_fft`` 2048, hop 512 (librosa's defaults), as :func:`librosa.effects.time_stretch`.

    Raises:
        ValueError: ``rate`` is not positive.
    """
    if rate <= 0:
        raise ValueError(f"rate must be positive, got {rate}")
    stretched = librosa.phase_vocoder(librosa.stft(y), rate=rate)
    return librosa.istft(stretched, dtype=y.dtype, length=round(y.shape[-1] / rate))


def pitch_shift(y: np.ndarray, sr: float, n_steps: float, bins_per_octave: int = 12,
                res_type: str = "soxr_hq") -> np.ndarray:
    """``y`` (float ``(n,)`` at ``sr`` Hz) shifted by ``n_steps`` steps of ``1 / bins_per_octave`` octave, duration
    kept: float ``(n,)``. As :func:`librosa.effects.pitch_shift` (without ``scale``): a time stretch by
    ``2 ** (-n_steps / bins_per_octave)``, then resampling from ``sr / rate`` to ``sr`` Hz with ``res_type``, cut or
    zero-padded to ``n`` samples.

    Raises:
        ValueError: ``bins_per_octave`` is not a positive integer.
    """
    if not isinstance(bins_per_octave, (int, np.integer)) or bins_per_octave < 1:
        raise ValueError(f"bins_per_octave must be a positive integer, got {bins_per_octave!r}")
    rate = 2.0 ** (-float(n_steps) / bins_per_octave)
    shifted = librosa.resample(time_stretch(y, rate), orig_sr=float(sr) / rate, target_sr=sr, res_type=res_type)
    return librosa.util.fix_length(shifted, size=y.shape[-1])
