from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from helpers import write_tone

from labswarm.audio.io import audio_info, load_segment
from labswarm.errors import AudioError


def test_load_segment_mono_resampled(tmp_path: Path) -> None:
    path = write_tone(tmp_path / "a.wav", freq=440, seconds=3.0, sr=44100, channels=2)
    y = load_segment(path, 22050, start=1.0, duration=1.5)
    assert y.dtype == np.float32 and y.shape == (int(1.5 * 22050),)
    spectrum = np.abs(np.fft.rfft(y))
    assert abs(np.argmax(spectrum) * 22050 / y.size - 440) < 2


@pytest.mark.parametrize("suffix,subtype", [(".flac", "PCM_16"), (".ogg", "VORBIS")])
def test_other_formats(tmp_path: Path, suffix: str, subtype: str) -> None:
    path = write_tone(tmp_path / f"a{suffix}", seconds=1.0, subtype=subtype)
    assert audio_info(path) == (22050, 22050)
    assert load_segment(path, 22050, 0.0, 1.0).shape == (22050,)


def test_whole_file_and_padding(tmp_path: Path) -> None:
    path = write_tone(tmp_path / "a.wav", seconds=1.0)
    assert load_segment(path, 22050, 0.0, None).shape == (22050,)
    padded = load_segment(path, 22050, 0.5, 1.0, pad=True)
    assert padded.shape == (22050,) and np.all(padded[11025 + 10:] == 0)


@pytest.mark.parametrize(
    "make,reason",
    [
        (lambda p: p, "file not found"),
        (lambda p: (p.write_bytes(b""), p)[1], "empty file"),
        (lambda p: (p.write_bytes(b"RIFF\x00\x00\x00\x00WAVEjunkjunkjunk" * 10), p)[1], "unreadable"),
        (lambda p: (p.write_text("not audio at all " * 100), p)[1], "unreadable"),
    ],
)
def test_bad_files_raise_audio_error_naming_file(tmp_path: Path, make, reason: str) -> None:
    path = make(tmp_path / "bad.wav")
    with pytest.raises(AudioError, match=reason) as info:
        load_segment(path, 22050, 0.0, 1.0)
    assert info.value.path == str(path)


def test_zero_frames_wav(tmp_path: Path) -> None:
    import soundfile as sf

    path = tmp_path / "zero.wav"
    sf.write(path, np.zeros(0, np.float32), 22050)
    with pytest.raises(AudioError, match="zero-length"):
        load_segment(path, 22050)


def test_segment_past_the_end(tmp_path: Path) -> None:
    path = write_tone(tmp_path / "a.wav", seconds=1.0)
    with pytest.raises(AudioError, match="past the end"):
        load_segment(path, 22050, 2.0, 1.0)
    with pytest.raises(AudioError, match="ends past the end"):
        load_segment(path, 22050, 0.5, 1.0)


def test_a_clip_shorter_than_the_segment_says_how_to_pad_it(tmp_path: Path) -> None:
    path = write_tone(tmp_path / "short.wav", seconds=1.0)
    with pytest.raises(AudioError, match=r"`pad: true` in the experiment's dataset.segment"):
        load_segment(path, 22050, 0.0, 3.0)
    assert load_segment(path, 22050, 0.0, 3.0, pad=True).size == 3 * 22050


def test_bytes_in_memory_read_as_the_file_and_errors_name_the_path(tmp_path: Path) -> None:
    """``data``: a file's bytes held in memory (the prediction endpoint's uploads) read as the file itself."""
    import io

    path = write_tone(tmp_path / "a.flac", freq=440, seconds=3.0, sr=44100, channels=2, subtype="PCM_16")
    data = io.BytesIO(path.read_bytes())
    data.seek(100)  # read from its start wherever it stands
    assert audio_info("upload.flac", data) == audio_info(path) == (3 * 44100, 44100)
    for start, duration in ((0.0, 1.0), (1.0, 1.5)):  # twice from the same object: each window of a file
        assert np.array_equal(load_segment("upload.flac", 22050, start, duration, data=data),
                              load_segment(path, 22050, start, duration))
    for bad, reason in ((b"", "empty file"), (b"RIFF\x00\x00\x00\x00WAVEjunkjunkjunk" * 10, "unreadable")):
        with pytest.raises(AudioError, match=reason) as info:
            audio_info("upload.wav", io.BytesIO(bad))
        assert info.value.path == "upload.wav"
        # libsndfile's own message named the object's repr ('<_io.BytesIO object at 0x...>'): the path instead, as
        # for a file (the prediction endpoint puts the upload's name in its place in a 422's reason)
        assert "0x" not in str(info.value) and "object at" not in str(info.value), info.value
    assert "Error opening 'upload.wav': " in info.value.reason, info.value
