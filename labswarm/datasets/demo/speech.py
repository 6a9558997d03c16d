"""Speech renderers: recorded asterisk prompts and three synthesizers (espeak-ng, flite, festival).

Each renderer takes a recipe's ``params`` and generator and returns a float32 clip of exactly
:data:`~.dsp.CLIP_SAMPLES` samples at :data:`~.dsp.SAMPLE_RATE` Hz.
"""

from __future__ import annotations

import subprocess
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from labswarm.datasets.demo import dsp
from labswarm.errors import DatasetError

#: Sample rate of the asterisk prompts, Hz.
ASTERISK_RATE = 8000


def render_asterisk(params: dict[str, Any], rng: np.random.Generator) -> np.ndarray:
    """Concatenate prompts of one language pool, in random order with pauses, to fill a clip.

    Params:
        prompts: wav paths (8 kHz telephone speech) of one pool.
    """
    prompts: Sequence[str] = params["prompts"]
    need = int(dsp.CLIP_SECONDS * ASTERISK_RATE * 1.1)
    parts: list[np.ndarray] = []
    total = 0
    for index in rng.permutation(len(prompts)):
        x = _trim(dsp.load(prompts[int(index)], ASTERISK_RATE))
        pause = np.zeros(int(rng.uniform(0.1, 0.7) * ASTERISK_RATE), np.float32)
        parts += [x * np.float32(10 ** (rng.uniform(-4, 4) / 20)), pause]
        total += x.size + pause.size
        if total >= need:
            break
    x = dsp.resample(np.concatenate(parts), ASTERISK_RATE, dsp.SAMPLE_RATE)
    return dsp.fit_length(x, dsp.CLIP_SAMPLES, rng, gap=int(0.4 * dsp.SAMPLE_RATE))


def render_espeak(params: dict[str, Any], rng: np.random.Generator) -> np.ndarray:
    """Synthesize prose with espeak-ng.

    Params:
        program: the espeak-ng executable. voice: ``language+variant``. speed: words per minute.
        pitch: 0-99. word_gap: pause between words, units of 10 ms. text: what to say.
    """
    argv = [
        params["program"],
        "-v",
        params["voice"],
        "-s",
        str(params["speed"]),
        "-p",
        str(params["pitch"]),
        "-g",
        str(params["word_gap"]),
    ]
    return _speak(argv, params["text"], rng, out_flag="-w", text_flag="-f")


def render_flite(params: dict[str, Any], rng: np.random.Generator) -> np.ndarray:
    """Synthesize prose with flite.

    Params:
        program: the flite executable. voice: a built-in voice (``slt``, ``kal``, ...).
        stretch: duration factor (>1 slower). f0: mean pitch, Hz. text: what to say.
    """
    argv = [
        params["program"],
        "-voice",
        params["voice"],
        "--setf",
        f"duration_stretch={params['stretch']}",
        "--setf",
        f"int_f0_target_mean={params['f0']}",
    ]
    return _speak(argv, params["text"], rng, out_flag="-o", text_flag="-f")


def render_festival(params: dict[str, Any], rng: np.random.Generator) -> np.ndarray:
    """Synthesize prose with festival's ``text2wave``.

    Params:
        program: the text2wave script. voice: ``kal_diphone`` or ``cmu_us_slt_arctic_hts``.
        stretch: duration factor (diphone voices only). text: what to say.
    """
    argv = [
        params["program"],
        "-eval",
        f"(voice_{params['voice']})",
        "-eval",
        f"(Parameter.set 'Duration_Stretch {params['stretch']})",
    ]
    return _speak(argv, params["text"], rng, out_flag="-o", text_flag="")


def _speak(argv: list[str], text: str, rng: np.random.Generator, *, out_flag: str, text_flag: str) -> np.ndarray:
    """Run a synthesizer into a temporary wav, then vary its speed and fit it to a clip.

    Raises:
        DatasetError: the program fails, times out or writes no audio.
    """
    with tempfile.TemporaryDirectory(prefix="labswarm-tts-") as tmp:
        text_path, wav_path = Path(tmp) / "text.txt", Path(tmp) / "out.wav"
        text_path.write_text(text + "\n", encoding="utf-8")
        full = [*argv, out_flag, str(wav_path), *([text_flag] if text_flag else []), str(text_path)]
        try:
            subprocess.run(full, capture_output=True, check=True, timeout=120, stdin=subprocess.DEVNULL)
        except subprocess.CalledProcessError as exc:
            err = exc.stderr.decode(errors="replace").strip()[-300:]
            raise DatasetError(f"{' '.join(argv[:3])} failed ({exc.returncode}): {err}") from exc
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise DatasetError(f"cannot run {argv[0]}: {exc}") from exc
        x = _trim(dsp.decode(wav_path))
    if x.size < dsp.SAMPLE_RATE // 2:
        raise DatasetError(f"{' '.join(argv[:3])} produced only {x.size} samples")
    x = dsp.change_speed(x, float(rng.uniform(0.92, 1.08)))
    return dsp.fit_length(x, dsp.CLIP_SAMPLES, rng, gap=int(rng.uniform(0.3, 1.0) * dsp.SAMPLE_RATE))


def _trim(x: np.ndarray, threshold_db: float = -45.0) -> np.ndarray:
    """Cut leading and trailing silence (below ``threshold_db`` re the peak)."""
    loud = np.flatnonzero(np.abs(x) > np.max(np.abs(x), initial=0.0) * 10 ** (threshold_db / 20))
    return x[loud[0] : loud[-1] + 1] if loud.size else x


#: Renderer name -> function, for the speech kinds of :class:`~.plan.Recipe`.
RENDERERS: dict[str, Callable[[dict[str, Any], np.random.Generator], np.ndarray]] = {
    "asterisk": render_asterisk,
    "espeak": render_espeak,
    "flite": render_flite,
    "festival": render_festival,
}
