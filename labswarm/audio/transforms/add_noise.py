"""Additive noise at an exact signal-to-noise ratio: coloured Gaussian noise, or noise from an audio file."""

from __future__ import annotations

from typing import Literal

import numpy as np
import soundfile as sf
import soxr
from pydantic import Field

from labswarm.audio.transforms.base import Transformation, TransformationConfig, register_transformation
from labswarm.errors import AudioError, TransformError
from labswarm.store.keys import IdentityCache

#: Exponent ``beta`` of the power spectral density ``S(f) ~ 1 / f**beta`` of each noise colour
#: (white 0, pink 1, brown/red 2; https://en.wikipedia.org/wiki/Colors_of_noise).
COLOR_EXPONENTS: dict[str, float] = {"white": 0.0, "pink": 1.0, "brown": 2.0}


class AddNoiseConfig(TransformationConfig):
    """Parameters of :class:`AddNoise`.

    Attributes:
        snr_db: signal-to-noise power ratio of the result in dB, in [-30, 100]: ``10 * log10(P_signal /
            P_noise)`` with ``P`` the mean square over the clip.
        color: spectrum of the generated Gaussian noise: ``white`` (flat), ``pink`` (power ~ 1/f, -3 dB per
            octave) or ``brown`` (power ~ 1/f², -6 dB per octave). Ignored when ``file`` is given.
        file: an audio file to take the noise from instead (any format soundfile reads; mixed down to mono,
            resampled to the clip's rate, looped to the clip's length from a seeded random offset). In an
            experiment YAML a relative path is relative to the YAML file's folder. The file's content identity
            is part of the feature-store key (:meth:`AddNoise.key_spec`), so replacing it recomputes.
    """

    snr_db: float = Field(ge=-30.0, le=100.0)
    color: Literal["white", "pink", "brown"] = "white"
    file: str | None = Field(default=None, min_length=1)


@register_transformation
class AddNoise(Transformation):
    """Add noise scaled so that the result's SNR is exactly ``snr_db`` (to float32 rounding).

    The noise (generated, or the file's samples from a random offset) is drawn from the sample's seed, then
    scaled by ``sqrt(P_signal / (P_noise * 10**(snr_db / 10)))`` with both powers measured on this clip, so the
    SNR does not vary with the noise realisation.

    A silent input (zero power) is returned unchanged rather than raising: the noise power an SNR calls for is
    then zero, and a silent clip stays a computable sample instead of a failed one.
    """

    name = "add_noise"
    config_model = AddNoiseConfig
    random = True
    config: AddNoiseConfig

    def __init__(self, config: AddNoiseConfig | None = None) -> None:
        super().__init__(config)
        self._file_noise: dict[int, np.ndarray] = {}
        self._identity = IdentityCache()  # the noise file is hashed once, not at every sample's key

    def key_spec(self) -> dict:
        """The spec plus, with a noise file, that file's identity (size, mtime, content digest).

        Raises:
            TransformError: the noise file is missing or unreadable.
        """
        spec = self.spec()
        if self.config.file is not None:
            try:
                ident = self._identity(self.config.file)
            except AudioError as exc:
                raise TransformError(f"{self.name}: noise file {exc}") from exc
            spec["file_identity"] = [ident.size, ident.mtime_ns, ident.digest]
        return spec

    def apply(self, y: np.ndarray, sr: int, rng: np.random.Generator) -> np.ndarray:
        """Add noise to ``y`` (float32 ``(n,)`` at ``sr`` Hz); returns float32 ``(n,)``.

        Raises:
            TransformError: the noise file cannot be read or is silent, or the stretch drawn from it is silent.
        """
        signal_power = mean_square(y)
        if signal_power == 0.0:
            return y
        if self.config.file is not None:
            noise = self._noise_from_file(y.size, sr, rng)
        else:
            noise = colored_noise(y.size, COLOR_EXPONENTS[self.config.color], rng)
        noise_power = mean_square(noise)
        if noise_power == 0.0:  # only a file's all-zero stretch could do this; generated noise never does
            raise TransformError(f"{self.name}: the noise drawn for this clip is silent")
        scale = np.sqrt(signal_power / (noise_power * 10.0 ** (self.config.snr_db / 10.0)))
        return y + np.float32(scale) * noise

    def _noise_from_file(self, n: int, sr: int, rng: np.random.Generator) -> np.ndarray:
        noise = self._file_noise.get(sr)
        if noise is None:
            noise = self._file_noise[sr] = self._load(sr)
        offset = int(rng.integers(noise.size))
        if n <= noise.size - offset:
            return noise[offset : offset + n]
        return np.take(noise, np.arange(offset, offset + n) % noise.size)

    def _load(self, sr: int) -> np.ndarray:
        path = self.config.file
        try:
            data, file_sr = sf.read(path, dtype="float32", always_2d=True)
        except (OSError, sf.LibsndfileError) as exc:
            raise TransformError(f"{self.name}: cannot read noise file {path}: {exc}") from exc
        noise = data.mean(axis=1, dtype=np.float32)
        if file_sr != sr and noise.size:
            noise = soxr.resample(noise, file_sr, sr)
        if noise.size == 0 or not np.all(np.isfinite(noise)) or not np.any(noise):
            raise TransformError(f"{self.name}: noise file {path} is empty, silent or not finite")
        return np.ascontiguousarray(noise, dtype=np.float32)


def mean_square(x: np.ndarray) -> float:
    """Mean square (power) of ``x``, accumulated in float64 so long clips keep full precision."""
    x64 = x.astype(np.float64)
    return float(np.dot(x64, x64)) / x.size


def colored_noise(n: int, beta: float, rng: np.random.Generator) -> np.ndarray:
    """Gaussian noise whose power spectral density falls as ``1 / f**beta``.

    White noise (``beta == 0``) is drawn directly. Otherwise white Gaussian noise is shaped in the frequency
    domain: its real FFT is multiplied by ``f ** (-beta / 2)`` (the DC bin is zeroed, so the result has zero
    mean) and transformed back, the usual spectral-shaping method (e.g. audiomentations' ``AddColorNoise``).
    The FFT runs on :func:`scipy.fft.next_fast_len` samples and is cropped to ``n``.

    Args:
        n: number of samples.
        beta: spectral exponent, 0 for white, 1 for pink, 2 for brown.
        rng: the only source of randomness.

    Returns:
        float32 array ``(n,)``, arbitrary scale (the caller normalises the power).
    """
    if beta == 0.0:
        return rng.standard_normal(n, dtype=np.float32)
    import scipy.fft  # here, not at import (~0.4 s): a process that never colours noise never loads it

    size = scipy.fft.next_fast_len(max(n, 2), real=True)  # 2 at least: one bin besides the zeroed DC
    spectrum = scipy.fft.rfft(rng.standard_normal(size, dtype=np.float32))
    freqs = np.arange(spectrum.size, dtype=np.float32)
    freqs[0] = 1.0
    spectrum *= freqs ** np.float32(-beta / 2.0)
    spectrum[0] = 0.0
    return scipy.fft.irfft(spectrum, n=size)[:n].astype(np.float32, copy=False)
