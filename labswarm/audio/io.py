"""Loading audio: decode, mix to mono, cut a segment, resample.

Decoding is libsndfile's (PyPI ``soundfile``): WAV, FLAC, Ogg Vorbis, Opus, MP3 and the other formats it
lists in ``soundfile.available_formats()``. Resampling is librosa's (``soxr_hq``).
"""

from __future__ import annotations

from pathlib import Path
from typing import IO

import numpy as np
import soundfile as sf

from labswarm.errors import AudioError

#: A segment may end this many seconds past the end of the file before it counts as "past the end":
#: container durations are rounded, and a 10-s clip is sometimes a few samples short.
END_TOLERANCE_S = 0.01


def audio_info(path: str | Path, data: IO[bytes] | None = None) -> tuple[int, int]:
    """``(n_frames, sample_rate_hz)`` of an audio file, read from its header.

    Args:
        path: the file.
        data: the file's bytes, read from its start instead of opening ``path`` (an upload held in memory,
            e.g. an ``io.BytesIO``); ``path`` then only names it in errors.

    Raises:
        AudioError: the file is missing, unreadable, of an unsupported format, or holds no frames.
    """
    with _open(Path(path), data) as handle:
        return int(handle.frames), int(handle.samplerate)


def _open(path: Path, data: IO[bytes] | None = None) -> sf.SoundFile:
    """``path`` (or ``data``, read from its start: see :func:`audio_info`) opened for reading, with at least one
    frame: one open of the file for both its header and its frames (the header read by ``sf.info`` and then the
    file opened again by ``sf.read`` was ~15 % of a tiny sample's work, issue 27).

    Raises:
        AudioError: the file is missing, unreadable, of an unsupported format, or holds no frames.
    """
    if data is None and not path.is_file():
        raise AudioError(str(path), "file not found")
    try:
        if data is None:
            handle = sf.SoundFile(str(path))
        else:  # libsndfile's virtual I/O over the object: as fast as a file here (0.47 vs 0.49 ms a 10-s WAV)
            data.seek(0)
            handle = sf.SoundFile(data)
    except (sf.LibsndfileError, RuntimeError, OSError) as exc:
        empty = (data.seek(0, 2) if data is not None else path.stat().st_size) == 0
        # libsndfile's message names what it opened: for ``data`` the object's repr (a memory address), so the
        # path is named instead, as when the file itself is opened
        detail = f"Error opening {str(path)!r}: {exc.error_string}" if isinstance(exc, sf.LibsndfileError) else exc
        reason = "empty file" if empty else f"unreadable or unsupported format ({detail})"
        raise AudioError(str(path), reason) from exc
    if handle.frames <= 0:
        handle.close()
        raise AudioError(str(path), "no audio frames (zero-length audio)")
    return handle


def load_segment(
    path: str | Path,
    sr: int,
    start: float = 0.0,
    duration: float | None = None,
    *,
    pad: bool = False,
    data: IO[bytes] | None = None,
) -> np.ndarray:
    """Load ``[start, start + duration)`` seconds of a file as a mono waveform at ``sr`` Hz.

    Args:
        path: audio file.
        sr: target sample rate in Hz; the segment is resampled when the file's rate differs.
        start: segment start in seconds (>= 0).
        duration: segment length in seconds; ``None`` reads to the end of the file.
        pad: when the file ends before the segment does, zero-pad instead of failing.
        data: the file's bytes, read from its start instead of opening ``path`` (see :func:`audio_info`).

    Returns:
        float32 array ``(n,)`` in [-1, 1], ``n = round(duration * sr)`` when ``duration`` is given. Channels
        are averaged.

    Raises:
        AudioError: missing, empty, corrupt or unsupported file; a segment that starts at or past the end of
            the file, or (unless ``pad``) ends more than :data:`END_TOLERANCE_S` past it.
    """
    path = Path(path)
    if start < 0 or (duration is not None and duration <= 0):
        raise AudioError(str(path), f"invalid segment start={start} s, duration={duration} s")
    with _open(path, data) as handle:
        n_frames, native_sr = int(handle.frames), int(handle.samplerate)
        frames = _read(handle, path, start, duration, n_frames, native_sr, pad)
    if frames.shape[0] == 0:
        raise AudioError(str(path), "decoded no audio frames")
    y = frames.mean(axis=1) if frames.shape[1] > 1 else frames[:, 0]
    if not np.all(np.isfinite(y)):
        raise AudioError(str(path), "decoded audio has NaN or infinite values")
    if native_sr != sr:
        import librosa

        y = librosa.resample(y, orig_sr=native_sr, target_sr=sr, res_type="soxr_hq")
    if duration is not None:
        n = round(duration * sr)
        y = y[:n] if y.shape[0] >= n else np.pad(y, (0, n - y.shape[0]))
    return np.ascontiguousarray(y, dtype=np.float32)


def _read(handle: sf.SoundFile, path: Path, start: float, duration: float | None, n_frames: int, native_sr: int,
          pad: bool) -> np.ndarray:
    """The frames of ``[start, start + duration)`` s from the open ``handle``, ``(n, channels)`` float32.

    Raises:
        AudioError: the segment starts past the end, or (unless ``pad``) ends past it; the frames cannot be
            decoded.
    """
    first = round(start * native_sr)
    if first >= n_frames:
        raise AudioError(
            str(path), f"segment starts at {start:.3f} s, past the end of the file ({n_frames / native_sr:.3f} s)"
        )
    if duration is None:
        last = n_frames
    else:
        last = first + round(duration * native_sr)
        overrun = (last - n_frames) / native_sr
        if overrun > END_TOLERANCE_S and not pad:
            raise AudioError(
                str(path),
                f"segment {start:.3f}-{start + duration:.3f} s ends past the end of the file "
                f"({n_frames / native_sr:.3f} s); `pad: true` in the experiment's dataset.segment zero-pads "
                "such clips",
            )
    try:
        if first:
            handle.seek(first)
        return handle.read(min(last, n_frames) - first, dtype="float32", always_2d=True)
    except (sf.LibsndfileError, RuntimeError, OSError, ValueError) as exc:
        raise AudioError(str(path), f"cannot decode audio ({exc})") from exc
