"""Parameter types and checks shared by the spectral extractors (private)."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from labswarm.errors import FeatureError

#: FFT size in samples.
NFft = Annotated[int, Field(ge=16, le=65536)]
#: Hop between frames in samples.
HopLength = Annotated[int, Field(ge=1, le=65536)]
#: Window length in samples, at most ``n_fft``; ``None`` means ``n_fft``.
WinLength = Annotated[int | None, Field(ge=1, le=65536)]
#: Lowest frequency in Hz.
Fmin = Annotated[float, Field(ge=0.0)]
#: Highest frequency in Hz; ``None`` means the Nyquist frequency ``sr / 2``.
Fmax = Annotated[float | None, Field(gt=0.0)]
#: Dynamic range kept below the peak, in dB; ``None`` keeps everything.
TopDb = Annotated[float | None, Field(gt=0.0)]


def check_win_length(win_length: int | None, n_fft: int | None) -> int | None:
    """Validator body: ``win_length <= n_fft``.

    Raises:
        ValueError: it is longer.
    """
    if win_length is not None and n_fft is not None and win_length > n_fft:
        raise ValueError(f"must be at most n_fft ({n_fft})")
    return win_length


def check_fmax(fmax: float | None, fmin: float | None) -> float | None:
    """Validator body: ``fmax > fmin``.

    Raises:
        ValueError: it is not.
    """
    if fmax is not None and fmin is not None and fmax <= fmin:
        raise ValueError(f"must be above fmin ({fmin:g} Hz)")
    return fmax


def check_band(name: str, fmin: float, fmax: float | None, sr: int) -> None:
    """At compute time: ``fmin < sr / 2`` and ``fmax <= sr / 2`` (the Nyquist frequency).

    Raises:
        FeatureError: a limit lies above the Nyquist frequency of this audio.
    """
    nyquist = sr / 2.0
    if fmax is not None and fmax > nyquist:
        raise FeatureError(f"{name}: fmax={fmax:g} Hz is above the Nyquist frequency {nyquist:g} Hz ({sr} Hz audio)")
    if fmin >= nyquist:
        raise FeatureError(
            f"{name}: fmin={fmin:g} Hz is not below the Nyquist frequency {nyquist:g} Hz ({sr} Hz audio)"
        )
