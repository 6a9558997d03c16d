"""Noise renderers: recorded sound effects scattered over a bed, coloured noise, mains hum, alsa's noise.

Each renderer takes a recipe's ``params`` and generator and returns a float32 clip of exactly
:data:`~.dsp.CLIP_SAMPLES` samples at :data:`~.dsp.SAMPLE_RATE` Hz.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import lru_cache
from typing import Any

import numpy as np
from scipy import signal

from labswarm.datasets.demo import dsp
from labswarm.datasets.demo.opensfx import read_cat
from labswarm.errors import DatasetError

#: opensfx entries that are musical stings, not noise.
_MUSICAL_SFX = frozenset({"Good Year", "Bad Year"})


@lru_cache(maxsize=2)
def _opensfx_pools(cat: str, n_pools: int) -> dict[int, tuple[np.ndarray, ...]]:
    """The non-empty, non-musical effects of a bank, decoded at the clip rate, grouped by ``index % n_pools``."""
    pools: dict[int, list[np.ndarray]] = {}
    for entry in read_cat(cat):
        if entry.title in _MUSICAL_SFX:
            continue
        x = dsp.decode(entry.wav)
        if x.size > dsp.SAMPLE_RATE // 20 and dsp.rms(x) > 1e-4:
            pools.setdefault(entry.index % n_pools, []).append(x)
    return {k: tuple(v) for k, v in pools.items()}


def render_opensfx(params: dict[str, Any], rng: np.random.Generator) -> np.ndarray:
    """Effects of one openttd-opensfx pool scattered over ten seconds, sometimes over a noise bed.

    Params:
        cat: the ``opensfx.cat`` bank. pool: which pool. n_pools: how many pools the bank is split into.
    """
    sounds = _opensfx_pools(params["cat"], params["n_pools"]).get(params["pool"])
    if not sounds:
        raise DatasetError(f"opensfx pool {params['pool']} of {params['n_pools']} has no effects")
    return _scatter(sounds, rng)


def render_samples(params: dict[str, Any], rng: np.random.Generator) -> np.ndarray:
    """Sound-effect samples of one pool (Sonic Pi, lmms) scattered over ten seconds.

    Params:
        paths: the pool's sample files.
    """
    return _scatter([dsp.load(p) for p in params["paths"]], rng)


def render_alsa(params: dict[str, Any], rng: np.random.Generator) -> np.ndarray:
    """alsa-utils' noise burst repeated with random gaps, speeds and levels.

    Params:
        path: ``Noise.wav``.
    """
    burst = dsp.load(params["path"])
    x = np.zeros(dsp.CLIP_SAMPLES, np.float32)
    at = -int(rng.integers(burst.size))
    while at < x.size:
        piece = dsp.change_speed(burst, float(rng.uniform(0.7, 1.3))) * np.float32(10 ** (rng.uniform(-9, 0) / 20))
        _add(x, piece, at)
        at += piece.size + int(rng.uniform(0.0, 1.5) * dsp.SAMPLE_RATE)
    return x + 0.01 * dsp.coloured_noise(x.size, float(rng.uniform(0, 2)), rng)


def render_coloured(params: dict[str, Any], rng: np.random.Generator) -> np.ndarray:
    """Coloured noise (white to brown), sometimes band-passed, with slow gusts like wind or surf."""
    del params
    n = dsp.CLIP_SAMPLES
    x = dsp.coloured_noise(n, float(rng.uniform(-0.8, 2.3)), rng)
    if rng.random() < 0.4:
        centre = float(np.exp(rng.uniform(np.log(150), np.log(6000))))
        width = float(rng.uniform(0.3, 1.5))
        low, high = centre / 2**width, min(centre * 2**width, 0.45 * dsp.SAMPLE_RATE)
        sos = signal.butter(2, [low, high], btype="bandpass", fs=dsp.SAMPLE_RATE, output="sos")
        x = signal.sosfilt(sos, x).astype(np.float32)
    if rng.random() < 0.6:
        x = x * _gusts(n, rng)
    return x.astype(np.float32)


def render_hum(params: dict[str, Any], rng: np.random.Generator) -> np.ndarray:
    """Mains hum (50 or 60 Hz and harmonics) over a faint noise floor, sometimes switching on and off."""
    del params
    n = dsp.CLIP_SAMPLES
    x = dsp.hum(n, float(rng.choice([50.0, 60.0])), rng)
    if rng.random() < 0.3:
        x = x * _gusts(n, rng)
    return x + np.float32(10 ** (rng.uniform(-30, -6) / 20)) * dsp.coloured_noise(n, float(rng.uniform(0, 2)), rng)


def _scatter(sounds: Sequence[np.ndarray], rng: np.random.Generator) -> np.ndarray:
    """2 to 12 events drawn from ``sounds`` at random times, speeds and levels; some repeat like a machine."""
    x = np.zeros(dsp.CLIP_SAMPLES, np.float32)
    for _ in range(int(rng.integers(2, 13))):
        sound = sounds[int(rng.integers(len(sounds)))]
        piece = dsp.change_speed(sound, float(rng.uniform(0.75, 1.3))) * np.float32(10 ** (rng.uniform(-14, 0) / 20))
        at = int(rng.integers(-piece.size // 2, x.size))
        if rng.random() < 0.2 and piece.size < x.size // 3:  # a repeating machine-like pattern
            period = piece.size + int(rng.uniform(0.0, 0.5) * dsp.SAMPLE_RATE)
            for start in range(at % period - period, x.size, period):
                _add(x, piece, start)
        else:
            _add(x, piece, at)
    if dsp.rms(x) < 1e-6:
        _add(x, sounds[0], 0)
    if rng.random() < 0.85:  # an ambient bed, as in a field recording
        bed = dsp.coloured_noise(x.size, float(rng.uniform(0, 2)), rng) * _gusts(x.size, rng)
        x = dsp.mix(x, bed, float(rng.uniform(0, 20)))
    return x


def _add(x: np.ndarray, piece: np.ndarray, at: int) -> None:
    """Add ``piece`` into ``x`` starting at sample ``at`` (may be negative), clipped to ``x``'s bounds."""
    lo, hi = max(at, 0), min(at + piece.size, x.size)
    if hi > lo:
        x[lo:hi] += piece[lo - at : hi - at]


def _gusts(n: int, rng: np.random.Generator) -> np.ndarray:
    """A slow random envelope in [0.1, 1]: smoothed noise at 0.1-2 Hz."""
    knots = int(rng.uniform(1, 20)) + 2
    env = np.interp(np.linspace(0, knots - 1, n), np.arange(knots), rng.uniform(0.1, 1.0, knots))
    return env.astype(np.float32)


#: Renderer name -> function, for the noise kinds of :class:`~.plan.Recipe`.
RENDERERS: dict[str, Callable[[dict[str, Any], np.random.Generator], np.ndarray]] = {
    "opensfx": render_opensfx,
    "samples": render_samples,
    "alsa": render_alsa,
    "coloured": render_coloured,
    "hum": render_hum,
}
