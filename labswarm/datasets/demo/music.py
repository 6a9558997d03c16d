"""Music renderers: MIDI through General MIDI soundfonts (pyfluidsynth), music on hold, looped samples.

FluidSynth keeps loaded soundfonts in a per-process cache while a synthesizer holds them, so a worker loads
each soundfont once (:func:`preload_soundfonts`, ~2 s for the MuseScore one) and every clip then gets a fresh
synthesizer whose ``sfload`` takes milliseconds. A fresh synthesizer per clip matters: one that is reused
carries state (dither, voice history) from the clips before it, and the bytes would depend on which worker
rendered what.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import lru_cache
from typing import Any

import numpy as np
from scipy import signal

from labswarm.datasets.demo import dsp
from labswarm.errors import DatasetError

#: Sample rate of the music-on-hold recordings, Hz.
MOH_RATE = 8000
_PREROLL_S = 1.0
_BLOCK = 64  # FluidSynth renders in blocks of 64 frames
_SETTINGS = {"synth.reverb.active": 0, "synth.chorus.active": 0, "synth.cpu-cores": 1, "synth.polyphony": 256}
_anchors: dict[str, Any] = {}  # soundfont path -> the synth that keeps it in FluidSynth's cache


def _fluidsynth() -> Any:
    try:
        import fluidsynth
    except ImportError as exc:  # pyfluidsynth missing, or it cannot find libfluidsynth
        raise DatasetError(
            f"cannot import pyfluidsynth ({exc}); install `pip install labswarm[demo]` and the Debian "
            "package libfluidsynth3"
        ) from exc
    return fluidsynth


def preload_soundfonts(paths: Sequence[str]) -> None:
    """Load each soundfont once in this process and keep it cached for the per-clip synthesizers.

    Raises:
        DatasetError: pyfluidsynth is missing or a soundfont cannot be loaded.
    """
    fluidsynth = _fluidsynth()
    for path in paths:
        if path not in _anchors:
            synth = fluidsynth.Synth(samplerate=float(dsp.SAMPLE_RATE), **_SETTINGS)
            if synth.sfload(path) < 0:
                raise DatasetError(f"FluidSynth cannot load soundfont {path}")
            _anchors[path] = synth


def release_soundfonts() -> None:
    """Free the soundfonts :func:`preload_soundfonts` holds (a few hundred MB for the MuseScore one)."""
    while _anchors:
        _anchors.popitem()[1].delete()


@lru_cache(maxsize=64)
def _midi_events(path: str) -> tuple[tuple[tuple[float, Any], ...], float]:
    """The channel messages of a MIDI file with absolute times (seconds), and its length (seconds)."""
    try:
        import mido

        midi = mido.MidiFile(path)
    except ImportError as exc:
        raise DatasetError("cannot import mido; install `pip install labswarm[demo]`") from exc
    except (OSError, ValueError, EOFError) as exc:
        raise DatasetError(f"cannot read MIDI file {path}: {exc}") from exc
    events, now = [], 0.0
    for msg in midi:
        now += msg.time
        if not msg.is_meta and hasattr(msg, "channel"):
            events.append((now, msg))
    return tuple(events), now


def render_midi(params: dict[str, Any], rng: np.random.Generator) -> np.ndarray:
    """Render a random window of a MIDI file, at a random tempo and transposition, some instruments swapped.

    Params:
        path: the MIDI file.
        soundfont: the ``.sf2``/``.sf3`` to play it with.
        soundfonts: all soundfonts of the set, preloaded once per process.

    Raises:
        DatasetError: pyfluidsynth or mido is missing, or a file cannot be read.
    """
    preload_soundfonts(params.get("soundfonts", [params["soundfont"]]))
    events, length = _midi_events(params["path"])
    tempo = float(rng.uniform(0.85, 1.2))
    transpose = int(rng.integers(-4, 5))
    swap = {p: int(rng.integers(0, 96)) for p in range(128) if rng.random() < 0.25}
    velocity = float(rng.uniform(0.7, 1.0))
    span = length / tempo
    x = np.zeros(dsp.CLIP_SAMPLES, np.float32)
    for _ in range(4):  # a silent window (intro, ending) gets another try
        t0 = float(rng.uniform(0.0, max(0.0, span - dsp.CLIP_SECONDS)))
        x = _render_window(params["soundfont"], events, tempo, t0, transpose, swap, velocity)
        if dsp.rms(x[: dsp.CLIP_SAMPLES // 2]) > 1e-3 and dsp.rms(x[dsp.CLIP_SAMPLES // 2 :]) > 1e-3:
            break
    if span < dsp.CLIP_SECONDS:  # a short tune: repeat it
        x = dsp.fit_length(x[: int(span * dsp.SAMPLE_RATE) + 1], dsp.CLIP_SAMPLES, rng)
    return x


def _render_window(
    soundfont: str,
    events: Sequence[tuple[float, Any]],
    tempo: float,
    t0: float,
    transpose: int,
    swap: dict[int, int],
    velocity: float,
) -> np.ndarray:
    """Render ``CLIP_SECONDS`` from ``t0`` (seconds, after the tempo change) with a fresh synthesizer."""
    synth = _fluidsynth().Synth(gain=0.5, samplerate=float(dsp.SAMPLE_RATE), **_SETTINGS)
    try:
        sfid = synth.sfload(soundfont)
        if sfid < 0:
            raise DatasetError(f"FluidSynth cannot load soundfont {soundfont}")

        def program(channel: int, number: int) -> None:
            bank = 128 if channel == 9 else 0
            number = number if channel == 9 else swap.get(number, number)
            if synth.sfpreset_name(sfid, bank, number) is None:  # e.g. a drum kit this soundfont lacks
                number = 0
            synth.program_select(channel, sfid, bank, number)

        for channel in range(16):
            program(channel, 0)
        start, sr = t0 - _PREROLL_S, dsp.SAMPLE_RATE
        total = -(-(int(_PREROLL_S * sr) + dsp.CLIP_SAMPLES) // _BLOCK) * _BLOCK
        chunks, produced = [], 0
        for t, msg in events:
            t /= tempo
            if t >= t0 + dsp.CLIP_SECONDS:
                break
            if t >= start:
                n = min(round((t - start) * sr), total) - produced
                if n > 0:
                    chunks.append(synth.get_samples(n))
                    produced += n
            elif msg.type in ("note_on", "note_off"):
                continue  # before the window only the channel state matters
            _play(synth, msg, transpose, velocity, program)
        if total > produced:
            chunks.append(synth.get_samples(total - produced))
    finally:
        synth.delete()
    stereo = np.concatenate(chunks).astype(np.float32).reshape(-1, 2) / 32768.0
    skip = int(_PREROLL_S * sr)
    return stereo.mean(axis=1)[skip : skip + dsp.CLIP_SAMPLES]


def _play(synth: Any, msg: Any, transpose: int, velocity: float, program: Callable[[int, int], None]) -> None:
    """Send one MIDI message (mido) to ``synth``: notes transposed by ``transpose`` semitones (drums, channel 9,
    never) and their velocity scaled by ``velocity``; a program change through ``program``; controllers and pitch
    bends as they are; any other channel message ignored."""
    ch = msg.channel
    if msg.type == "note_on" and msg.velocity > 0:
        key = msg.note if ch == 9 else min(127, max(0, msg.note + transpose))
        synth.noteon(ch, key, max(1, int(msg.velocity * velocity)))
    elif msg.type in ("note_off", "note_on"):
        synth.noteoff(ch, msg.note if ch == 9 else min(127, max(0, msg.note + transpose)))
    elif msg.type == "program_change":
        program(ch, msg.program)
    elif msg.type == "control_change":
        synth.cc(ch, msg.control, msg.value)
    elif msg.type == "pitchwheel":
        synth.pitch_bend(ch, msg.pitch)


def render_moh(params: dict[str, Any], rng: np.random.Generator) -> np.ndarray:
    """A random window of a music-on-hold recording (8 kHz).

    Params:
        path: the recording.
    """
    x = dsp.fit_length(dsp.load(params["path"], MOH_RATE), int(dsp.CLIP_SECONDS * MOH_RATE) + 1, rng)
    return dsp.fit_length(dsp.resample(x, MOH_RATE, dsp.SAMPLE_RATE), dsp.CLIP_SAMPLES, rng)


def render_loops(params: dict[str, Any], rng: np.random.Generator) -> np.ndarray:
    """One to three loops of a pool layered in time (a groove, a bass line, a pad), repeated to fill the clip.

    Each layer is stretched to the first one's duration times a power of two, so that bars line up; the
    stretch also shifts its pitch, by at most half an octave.

    Params:
        paths: the pool's loop files (FLAC or Ogg).
    """
    paths: list[str] = params["paths"]
    n_layers = min(len(paths), int(rng.choice([1, 2, 3], p=[0.1, 0.35, 0.55])))
    chosen = [paths[int(i)] for i in rng.choice(len(paths), size=n_layers, replace=False)]
    base = dsp.load(chosen[0])
    bar = max(1, int(base.size / rng.uniform(0.9, 1.12)))
    x = np.zeros(dsp.CLIP_SAMPLES + 8 * bar, np.float32)
    for path in chosen:
        layer = dsp.load(path)
        n = max(1, round(bar * 2.0 ** round(np.log2(layer.size / bar))))
        layer = signal.resample(layer, n).astype(np.float32)  # FFT resampling keeps a loop seamless
        reps = -(-x.size // n)
        x += np.tile(layer, reps)[: x.size] * np.float32(10 ** (rng.uniform(-9, 0) / 20))
    return dsp.fit_length(x, dsp.CLIP_SAMPLES, rng)


#: Renderer name -> function, for the music kinds of :class:`~.plan.Recipe`.
RENDERERS: dict[str, Callable[[dict[str, Any], np.random.Generator], np.ndarray]] = {
    "midi": render_midi,
    "moh": render_moh,
    "loops": render_loops,
}
