"""Time labswarm's transformations against audiomentations' equivalents on the same clips, in one process.

Usage::

    python bench/transforms_vs_audiomentations.py [WAV_DIR] [--repeats N] [--all-cores]

With ``WAV_DIR``, up to 10 audio files from it (mixed to mono, resampled to 22.05 kHz, cropped or looped to 10 s);
without, 10 synthetic 10-s clips (harmonic tones with vibrato and tremolo, plus noise bursts). Every call runs
with one maths thread (``threadpoolctl.threadpool_limits(1)``), as a worker does. By default the process is also
pinned to one CPU: a worker process owns one core, so a library that spreads one call over extra threads of its
own (fast-mp3-augment runs its encoder and decoder concurrently) gains nothing in production; ``--all-cores``
lets it.

Prints, per pair: the median milliseconds per clip for labswarm and audiomentations, and their ratio
(labswarm / audiomentations; below 1 means labswarm is faster). Needs the ``bench`` extra (audiomentations;
fast-mp3-augment for its default MP3 backend, else its ``lameenc`` backend is timed).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from labswarm.audio.transforms import Transformation

SR = 22050
SECONDS = 10.0
N_CLIPS = 10

#: Seven peaking bands inside the ranges of audiomentations' SevenBandParametricEQ (one shelf or peak each).
EQ_BANDS = [
    {"freq_hz": f, "gain_db": g, "q": 1.0}
    for f, g in zip([63, 140, 300, 630, 1400, 3000, 6500], [6, -4, 3, -6, 4, -3, 5], strict=True)
]


def _pairs() -> list[tuple[str, dict[str, Any], Any]]:
    """(row label, labswarm spec, audiomentations transform) with matching, fixed parameters and p=1."""
    import audiomentations as am

    try:
        import fast_mp3_augment  # noqa: F401

        mp3 = am.Mp3Compression(min_bitrate=64, max_bitrate=64, backend="fast-mp3-augment", quality=7, p=1.0)
        mp3_label = "codec mp3 64k (vs fast-mp3-augment)"
    except ImportError:
        with warnings.catch_warnings():  # the lameenc backend is deprecated in audiomentations, still the same LAME
            warnings.simplefilter("ignore", DeprecationWarning)
            mp3 = am.Mp3Compression(64, 64, backend="lameenc", preserve_delay=True, quality=7, p=1.0)
        mp3_label = "codec mp3 64k (vs lameenc backend)"
    return [
        ("pitch_shift +3 (vs signalsmith)", {"name": "pitch_shift", "semitones": 3}, am.PitchShift(3, 3, p=1.0)),
        (
            "pitch_shift +3 (vs librosa)",
            {"name": "pitch_shift", "semitones": 3},
            am.PitchShift(3, 3, method="librosa_phase_vocoder", p=1.0),
        ),
        (mp3_label, {"name": "codec", "format": "mp3", "bitrate_kbps": 64}, mp3),
        ("eq 7 bands", {"name": "eq", "bands": EQ_BANDS}, am.SevenBandParametricEQ(-6, 6, p=1.0)),
        ("add_noise white 20 dB", {"name": "add_noise", "snr_db": 20}, am.AddGaussianSNR(20, 20, p=1.0)),
        ("gain +6 dB", {"name": "gain", "gain_db": 6}, am.Gain(6, 6, p=1.0)),
        (
            "time_stretch 1.25 (vs signalsmith)",
            {"name": "time_stretch", "rate": 1.25},
            am.TimeStretch(1.25, 1.25, leave_length_unchanged=False, p=1.0),
        ),
        (
            "time_stretch 1.25 (vs librosa)",
            {"name": "time_stretch", "rate": 1.25},
            am.TimeStretch(1.25, 1.25, leave_length_unchanged=False, method="librosa_phase_vocoder", p=1.0),
        ),
    ]


def _time_ms(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> float:
    start = time.perf_counter()
    fn(*args, **kwargs)
    return (time.perf_counter() - start) * 1000.0


def compare(clips: list[np.ndarray], sr: int, repeats: int = 3) -> list[dict[str, Any]]:
    """Median ms per clip of each labswarm transformation and its audiomentations equivalent.

    Both run on the same float32 clips, interleaved call by call (so drift hits both alike), after one warm-up
    call each, inside ``threadpool_limits(1)``.

    Args:
        clips: mono float32 waveforms ``(n_samples,)`` at ``sr``.
        sr: sample rate in Hz.
        repeats: passes over the clips; the median is over ``repeats * len(clips)`` calls.

    Returns:
        One row per pair: ``transformation`` (label), ``labswarm_ms``, ``audiomentations_ms``, ``ratio``
        (labswarm / audiomentations).
    """
    from threadpoolctl import threadpool_limits

    rows = []
    with threadpool_limits(1):
        for label, spec, theirs in _pairs():
            ours = Transformation.from_spec(spec)
            ours(clips[0], sr, 0)  # warm-up: imports, numba compilation, filter caches
            theirs(samples=clips[0], sample_rate=sr)
            ours_ms: list[float] = []
            theirs_ms: list[float] = []
            for _ in range(repeats):
                for seed, clip in enumerate(clips):
                    ours_ms.append(_time_ms(ours, clip, sr, seed))
                    theirs_ms.append(_time_ms(theirs, samples=clip, sample_rate=sr))
            a, b = statistics.median(ours_ms), statistics.median(theirs_ms)
            rows.append({"transformation": label, "labswarm_ms": a, "audiomentations_ms": b, "ratio": a / b})
    return rows


def synthetic_clips(n: int = N_CLIPS, sr: int = SR, seconds: float = SECONDS, seed: int = 0) -> list[np.ndarray]:
    """Real-ish clips: a harmonic tone (random f0, vibrato, tremolo, decaying partials) plus noise bursts."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * sr)) / sr
    clips = []
    for _ in range(n):
        f0 = rng.uniform(80, 600)
        phase = 2 * np.pi * f0 * (t + 0.002 * np.sin(2 * np.pi * rng.uniform(3, 7) * t))
        tone = sum(rng.uniform(0.3, 1.0) / k * np.sin(k * phase) for k in range(1, 9))
        tone *= 0.5 + 0.5 * np.abs(np.sin(2 * np.pi * rng.uniform(0.2, 2.0) * t))
        bursts = (np.sin(2 * np.pi * rng.uniform(0.1, 1.0) * t) > 0.7) * rng.standard_normal(t.size)
        y = tone + rng.uniform(0.05, 0.3) * bursts
        clips.append((0.5 * y / np.max(np.abs(y))).astype(np.float32))
    return clips


def load_clips(folder: Path, n: int = N_CLIPS, sr: int = SR, seconds: float = SECONDS) -> list[np.ndarray]:
    """Up to ``n`` audio files from ``folder``: mono, resampled to ``sr``, cropped or looped to ``seconds``."""
    import soundfile as sf
    import soxr

    size = int(seconds * sr)
    clips = []
    for path in sorted(folder.rglob("*")):
        if len(clips) == n or not path.is_file():
            continue
        try:
            data, file_sr = sf.read(path, dtype="float32", always_2d=True)
        except sf.LibsndfileError:
            continue
        y = data.mean(axis=1)
        if file_sr != sr:
            y = soxr.resample(y, file_sr, sr)
        if y.size and np.any(y):
            clips.append(np.resize(y, size).astype(np.float32))
    return clips


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("wav_dir", nargs="?", type=Path, help="folder of audio files (default: synthetic clips)")
    parser.add_argument("--repeats", type=int, default=3, help="passes over the clips (default 3)")
    parser.add_argument("--all-cores", action="store_true", help="do not pin the process to one CPU")
    args = parser.parse_args(argv)

    if not args.all_cores and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    clips = load_clips(args.wav_dir) if args.wav_dir else synthetic_clips()
    if not clips:
        print(f"no readable audio in {args.wav_dir}", file=sys.stderr)
        return 1
    source = str(args.wav_dir) if args.wav_dir else "synthetic"
    cores = "all cores" if args.all_cores else "pinned to 1 CPU"
    print(f"{len(clips)} clips of {SECONDS:g} s at {SR} Hz ({source}), 1 maths thread, {cores}\n")
    rows = compare(clips, SR, repeats=args.repeats)
    width = max(len(r["transformation"]) for r in rows)
    print(f"{'transformation':<{width}}  {'labswarm ms':>11}  {'audiomentations ms':>18}  {'ratio':>6}")
    for r in rows:
        print(
            f"{r['transformation']:<{width}}  {r['labswarm_ms']:>11.2f}  {r['audiomentations_ms']:>18.2f}"
            f"  {r['ratio']:>6.2f}"
        )
    print("\nratio = labswarm / audiomentations (median ms per clip); below 1: labswarm is faster")
    return 0


if __name__ == "__main__":
    sys.exit(main())
