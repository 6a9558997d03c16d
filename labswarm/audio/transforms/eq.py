"""Parametric equalizer: a cascade of peaking biquads, filtered in one pass."""

from __future__ import annotations

import math

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from labswarm.audio.transforms.base import Transformation, TransformationConfig, register_transformation
from labswarm.errors import TransformError


class EqBand(BaseModel):
    """One peaking band.

    Attributes:
        freq_hz: centre frequency in Hz, > 0; must be below the Nyquist frequency of the audio it is applied to
            (checked when applied).
        gain_db: gain at the centre frequency in dB, in [-40, 40]; negative cuts.
        q: quality factor (centre frequency / bandwidth), in (0, 100]; higher is narrower.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    freq_hz: float = Field(gt=0.0)
    gain_db: float = Field(ge=-40.0, le=40.0)
    q: float = Field(gt=0.0, le=100.0)


class EqConfig(TransformationConfig):
    """Parameters of :class:`Eq`.

    Attributes:
        bands: the peaking bands, at least one, applied in cascade (their gains in dB add up where they overlap).
    """

    bands: tuple[EqBand, ...] = Field(min_length=1, max_length=64)


def peaking_sos(freq_hz: float, gain_db: float, q: float, sr: int) -> np.ndarray:
    """One peaking-EQ biquad as a second-order section.

    Formula: R. Bristow-Johnson, "Cookbook formulae for audio EQ biquad filter coefficients" (the Audio EQ
    Cookbook, https://www.w3.org/TR/audio-eq-cookbook/), "peakingEQ": ``A = 10**(gain_db/40)``,
    ``w0 = 2*pi*freq_hz/sr``, ``alpha = sin(w0)/(2*q)``; ``b = [1 + alpha*A, -2*cos(w0), 1 - alpha*A]``,
    ``a = [1 + alpha/A, -2*cos(w0), 1 - alpha/A]``, normalised by ``a0``. Its gain is exactly ``gain_db`` at
    ``freq_hz`` and 0 dB at DC and Nyquist.

    Returns:
        float64 array ``(6,)``: ``b0, b1, b2, 1, a1, a2``.
    """
    amp = 10.0 ** (gain_db / 40.0)
    w0 = 2.0 * math.pi * freq_hz / sr
    alpha = math.sin(w0) / (2.0 * q)
    cos_w0 = math.cos(w0)
    a0 = 1.0 + alpha / amp
    return np.array([1.0 + alpha * amp, -2.0 * cos_w0, 1.0 - alpha * amp, a0, -2.0 * cos_w0, 1.0 - alpha / amp]) / a0


@register_transformation
class Eq(Transformation):
    """Parametric equalizer: every band a peaking biquad, all stacked in one SOS array, one ``sosfilt`` call.

    The filter starts in the steady state for the first sample (``sosfilt_zi``), so a clip that does not start
    at zero gets no click. Deterministic: the seed is not used.
    """

    name = "eq"
    config_model = EqConfig
    random = False
    config: EqConfig

    def __init__(self, config: EqConfig | None = None) -> None:
        super().__init__(config)
        self._cache: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def sos(self, sr: int) -> np.ndarray:
        """The stacked second-order sections at ``sr`` Hz: float64 ``(n_bands, 6)``.

        Raises:
            TransformError: a band's frequency is not below the Nyquist frequency ``sr / 2``.
        """
        return self._filter(sr)[0]

    def apply(self, y: np.ndarray, sr: int, rng: np.random.Generator) -> np.ndarray:
        """Equalize ``y`` (float32 ``(n,)`` at ``sr`` Hz); returns float32 ``(n,)``.

        Raises:
            TransformError: a band's frequency is not below ``sr / 2``.
        """
        from scipy import signal  # here, not at import (~1 s): a process that never equalizes never loads it

        sos, zi = self._filter(sr)
        out, _ = signal.sosfilt(sos, y, zi=zi * y[0])
        return out.astype(np.float32, copy=False)

    def _filter(self, sr: int) -> tuple[np.ndarray, np.ndarray]:
        cached = self._cache.get(sr)
        if cached is None:
            from scipy import signal

            nyquist = sr / 2.0
            for index, band in enumerate(self.config.bands):
                if band.freq_hz >= nyquist:
                    raise TransformError(
                        f"{self.name}: bands.{index}.freq_hz={band.freq_hz:g} Hz is not below the Nyquist "
                        f"frequency {nyquist:g} Hz of {sr} Hz audio"
                    )
            sos = np.stack([peaking_sos(b.freq_hz, b.gain_db, b.q, sr) for b in self.config.bands])
            cached = self._cache[sr] = (sos, signal.sosfilt_zi(sos))
        return cached
