"""Small signal helpers shared by the demo-set renderers; every waveform is float32 mono, 1-D ``(n,)``."""

from __future__ import annotations

import io
from fractions import Fraction
from functools import lru_cache
from math import gcd
from pathlib import Path

import numpy as np
import soundfile
from scipy import signal

from labswarm.errors import DatasetError

#: Sample rate of every demo clip, Hz.
SAMPLE_RATE = 22050
#: Duration of every demo clip, seconds.
CLIP_SECONDS = 10.0
#: Samples in one clip at :data:`SAMPLE_RATE`.
CLIP_SAMPLES = int(SAMPLE_RATE * CLIP_SECONDS)


def decode(data: bytes | str | Path, sr: int = SAMPLE_RATE) -> np.ndarray:
    """Decode an audio file (path or bytes) to float32 mono at ``sr`` Hz.

    Raises:
        DatasetError: libsndfile cannot decode it.
    """
    try:
        x, file_sr = soundfile.read(
            io.BytesIO(data) if isinstance(data, bytes) else str(data), dtype="float32", always_2d=True
        )
    except (soundfile.LibsndfileError, RuntimeError, OSError) as exc:
        name = "<bytes>" if isinstance(data, bytes) else data
        raise DatasetError(f"cannot decode {name}: {exc}") from exc
    return resample(x.mean(axis=1), file_sr, sr)


@lru_cache(maxsize=96)
def load(path: str, sr: int = SAMPLE_RATE) -> np.ndarray:
    """:func:`decode` a file once per process; the result is read-only (copy before changing it)."""
    x = decode(path, sr)
    x.flags.writeable = False
    return x


def resample(x: np.ndarray, sr_in: int, sr_out: int) -> np.ndarray:
    """Resample ``x`` from ``sr_in`` to ``sr_out`` Hz (polyphase, anti-aliased); float32 out."""
    if sr_in == sr_out:
        return np.asarray(x, dtype=np.float32)
    g = gcd(int(sr_in), int(sr_out))
    return signal.resample_poly(x, sr_out // g, sr_in // g).astype(np.float32)


def change_speed(x: np.ndarray, factor: float) -> np.ndarray:
    """Play ``x`` ``factor`` times faster (shorter, higher); the ratio is rounded to a small fraction."""
    ratio = Fraction(factor).limit_denominator(48)
    if ratio == 1:
        return x
    return signal.resample_poly(x, ratio.denominator, ratio.numerator).astype(np.float32)


def fit_length(x: np.ndarray, n: int, rng: np.random.Generator, gap: int = 0) -> np.ndarray:
    """Exactly ``n`` samples: a random window of long material, short material repeated.

    Args:
        x: the material; must not be empty.
        n: samples wanted.
        rng: picks the window start.
        gap: samples of silence between repeats.

    Raises:
        DatasetError: ``x`` is empty.
    """
    if x.size == 0:
        raise DatasetError("cannot fit empty audio to a clip")
    if x.size < n:
        unit = np.concatenate([x, np.zeros(gap, np.float32)])
        x = np.tile(unit, -(-(n + unit.size) // unit.size))
    start = int(rng.integers(0, x.size - n + 1))
    return np.array(x[start : start + n], dtype=np.float32)


def band_limit(x: np.ndarray, band_hz: int | None, sr: int = SAMPLE_RATE) -> np.ndarray:
    """Pass ``x`` through a ``band_hz`` sample rate (telephone 8000, wideband 16000) and back; None keeps it."""
    if band_hz is None or band_hz >= sr:
        return x
    return resample(resample(x, sr, band_hz), band_hz, sr)[: x.size]


def coloured_noise(n: int, exponent: float, rng: np.random.Generator) -> np.ndarray:
    """Noise whose power falls as ``1 / f**exponent`` (0 white, 1 pink, 2 brown, -1 blue); unit RMS."""
    spectrum = np.fft.rfft(rng.standard_normal(n))
    freqs = np.fft.rfftfreq(n)
    freqs[0] = freqs[1]
    x = np.fft.irfft(spectrum * freqs ** (-exponent / 2.0), n)
    return (x / (np.sqrt(np.mean(x**2)) + 1e-12)).astype(np.float32)


def hum(n: int, f0: float, rng: np.random.Generator, sr: int = SAMPLE_RATE) -> np.ndarray:
    """Mains hum: ``f0`` Hz (50 or 60) and random harmonics with a slow drift; unit RMS."""
    t = np.arange(n) / sr
    drift = 1.0 + 0.003 * np.sin(2 * np.pi * rng.uniform(0.05, 0.3) * t + rng.uniform(0, 2 * np.pi))
    phase = 2 * np.pi * f0 * np.cumsum(drift) / sr
    x = np.zeros(n)
    for k in range(1, int(rng.integers(4, 16))):
        x += rng.uniform(0.05, 1.0) / k ** rng.uniform(0.3, 1.5) * np.sin(k * phase + rng.uniform(0, 2 * np.pi))
    if rng.random() < 0.4:  # a buzzing, clipped transformer
        x = np.tanh(x * rng.uniform(2, 8))
    return (x / (np.sqrt(np.mean(x**2)) + 1e-12)).astype(np.float32)


def reverb(x: np.ndarray, rt60: float, rng: np.random.Generator, sr: int = SAMPLE_RATE) -> np.ndarray:
    """Convolve with a synthetic room (decaying noise, ``rt60`` seconds); same length as ``x``."""
    n = int(rt60 * sr)
    ir = rng.standard_normal(n) * np.exp(-6.9 * np.arange(n) / n)
    ir[0] = 1.0 / rng.uniform(0.3, 1.0)
    wet = signal.fftconvolve(x, ir / np.sqrt(np.sum(ir**2)))[: x.size]
    return wet.astype(np.float32)


def rms(x: np.ndarray) -> float:
    """Root mean square of ``x`` (linear, full scale 1.0); 0.0 for an empty array."""
    if x.size == 0:
        return 0.0
    return float(np.sqrt(np.mean(np.square(x, dtype=np.float64))))


def mix(signal_: np.ndarray, bed: np.ndarray, snr_db: float) -> np.ndarray:
    """``signal_ + bed`` with the bed scaled to ``snr_db`` dB below the signal's RMS."""
    gain = rms(signal_) / (rms(bed) + 1e-12) * 10 ** (-snr_db / 20)
    return (signal_ + gain * bed).astype(np.float32)


def to_pcm16(x: np.ndarray, peak_dbfs: float) -> np.ndarray:
    """Scale ``x`` to a peak of ``peak_dbfs`` dBFS and quantize to int16.

    Raises:
        DatasetError: ``x`` is silent or not finite.
    """
    peak = float(np.max(np.abs(x))) if x.size else 0.0
    if not np.isfinite(peak) or peak < 1e-6:
        raise DatasetError(f"rendered clip is silent or not finite (peak {peak})")
    y = x.astype(np.float64) * (10 ** (peak_dbfs / 20) / peak)
    return np.clip(np.round(y * 32767), -32768, 32767).astype(np.int16)
