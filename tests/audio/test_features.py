"""Built-in feature extractors on real signals."""

from __future__ import annotations

from typing import Any

import librosa
import numpy as np
import pytest

from labswarm.audio.features import EXTRACTORS, FeatureExtractor
from labswarm.errors import ConfigError, FeatureError

SR = 22050


def tone(freq: float, seconds: float = 1.5, sr: int = SR) -> np.ndarray:
    t = np.arange(int(seconds * sr)) / sr
    return (0.5 * np.sin(2 * np.pi * freq * t)).astype(np.float32)


def harmonic(seconds: float = 1.5, sr: int = SR) -> np.ndarray:
    rng = np.random.default_rng(0)
    t = np.arange(int(seconds * sr)) / sr
    y = sum(0.2 / k * np.sin(2 * np.pi * 220.0 * k * t) for k in range(1, 6)) + 0.01 * rng.standard_normal(t.size)
    return y.astype(np.float32)


#: (spec, expected number of bins)
SPECS: list[tuple[dict[str, Any], int]] = [
    ({"name": "mel"}, 128),
    ({"name": "mel", "n_mels": 40, "hop_length": 256, "log": False, "fmin": 50.0, "fmax": 8000.0}, 40),
    ({"name": "mel", "n_fft": 1024, "win_length": 512, "power": 1.0, "top_db": None}, 128),
    ({"name": "mfcc"}, 20),
    ({"name": "mfcc", "n_mfcc": 13, "n_mels": 40, "hop_length": 300, "lifter": 22}, 13),
    ({"name": "cqt"}, 84),
    ({"name": "cqt", "n_bins": 48, "bins_per_octave": 24, "hop_length": 256, "log": False}, 48),
    ({"name": "stft"}, 1025),
    ({"name": "stft", "n_fft": 512, "hop_length": 128, "window": "hamming"}, 257),
    ({"name": "log_spectrogram"}, 1025),
    ({"name": "log_spectrogram", "n_fft": 1024, "win_length": 800, "top_db": None}, 513),
]


def _ids() -> list[str]:
    return [f"{spec['name']}-{i}" for i, (spec, _) in enumerate(SPECS)]


def test_every_registered_extractor_is_exercised() -> None:
    assert {spec["name"] for spec, _ in SPECS} == set(EXTRACTORS.names())


@pytest.mark.parametrize(("spec", "n_bins"), SPECS, ids=_ids())
def test_shape_dtype_determinism(spec: dict[str, Any], n_bins: int) -> None:
    y = harmonic()[:33_001]  # not a multiple of any hop
    ex = FeatureExtractor.from_spec(spec)
    out = ex(y, SR)
    hop = spec.get("hop_length", 512)
    assert out.shape == (n_bins, 1 + y.size // hop)
    assert ex.bins(SR) in (None, n_bins)  # the rows the parameters declare, where they do, are the computed ones
    assert out.dtype == np.float32
    assert out.flags.c_contiguous
    assert np.all(np.isfinite(out))
    np.testing.assert_array_equal(out, ex(y, SR))


@pytest.mark.parametrize(("spec", "n_bins"), SPECS, ids=_ids())
def test_spec_round_trip(spec: dict[str, Any], n_bins: int) -> None:
    ex = FeatureExtractor.from_spec({**spec, "output": "custom"})
    assert ex.output_name == "custom"
    assert "output" not in ex.spec()
    again = FeatureExtractor.from_spec(ex.spec())
    assert type(again) is type(ex)
    assert again.spec() == ex.spec()
    assert again.output_name == spec["name"]


def _mean_over_frames(out: np.ndarray) -> np.ndarray:
    return out[:, 2:-2].mean(axis=1)


@pytest.mark.parametrize("freq", [440.0, 1000.0, 3000.0])
def test_mel_peak_is_at_the_sine(freq: float) -> None:
    for log in (True, False):
        out = FeatureExtractor.from_spec({"name": "mel", "n_mels": 64, "log": log})(tone(freq), SR)
        centres = librosa.mel_frequencies(n_mels=64 + 2, fmin=0.0, fmax=SR / 2)[1:-1]
        expected = int(np.argmin(np.abs(centres - freq)))
        assert abs(int(np.argmax(_mean_over_frames(out))) - expected) <= 1


def test_mel_log_is_power_to_db_of_the_linear() -> None:
    y = harmonic()
    linear = FeatureExtractor.from_spec({"name": "mel", "log": False})(y, SR)
    db = FeatureExtractor.from_spec({"name": "mel", "top_db": None})(y, SR)
    np.testing.assert_allclose(db, 10 * np.log10(np.maximum(linear, 1e-10)), atol=1e-3)


@pytest.mark.parametrize("freq", [110.0, 440.0, 1760.0])
def test_cqt_peak_is_at_the_sine(freq: float) -> None:
    out = FeatureExtractor.from_spec({"name": "cqt"})(tone(freq), SR)
    expected = round(12 * np.log2(freq / 32.70))  # semitones above C1
    assert int(np.argmax(_mean_over_frames(out))) == expected


@pytest.mark.parametrize("seconds", [0.3, 0.77, 2.9])
def test_cqt_of_short_clips_has_the_common_frame_count(seconds: float) -> None:
    y = harmonic(seconds)  # low octaves shorter than their FFT: no warning escapes (warnings are errors here)
    out = FeatureExtractor.from_spec({"name": "cqt", "hop_length": 256})(y, SR)
    assert out.shape == (84, 1 + y.size // 256)


@pytest.mark.parametrize("name", ["stft", "log_spectrogram"])
@pytest.mark.parametrize("freq", [440.0, 2500.0])
def test_stft_peak_is_at_the_sine(name: str, freq: float) -> None:
    out = FeatureExtractor.from_spec({"name": name, "n_fft": 2048})(tone(freq), SR)
    assert int(np.argmax(_mean_over_frames(out))) == round(freq * 2048 / SR)


def test_mfcc_tell_tones_apart() -> None:
    mfcc = FeatureExtractor.from_spec({"name": "mfcc", "n_mfcc": 13})
    low, high = _mean_over_frames(mfcc(tone(220.0), SR)), _mean_over_frames(mfcc(tone(3520.0), SR))
    assert np.linalg.norm(low - high) > 10.0
    np.testing.assert_allclose(_mean_over_frames(mfcc(tone(220.0), SR)), low)


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"name": "mel", "n_mels": 0}, "n_mels"),
        ({"name": "mel", "n_fft": 8}, "n_fft"),
        ({"name": "mel", "hop_length": 0}, "hop_length"),
        ({"name": "mel", "n_fft": 512, "win_length": 1024}, "win_length"),
        ({"name": "mel", "fmin": 500.0, "fmax": 400.0}, "fmax"),
        ({"name": "mel", "fmin": -1.0}, "fmin"),
        ({"name": "mel", "power": 3.0}, "power"),
        ({"name": "mel", "top_db": -5.0}, "top_db"),
        ({"name": "mel", "log": "sometimes"}, "log"),
        ({"name": "mel", "bands": 3}, "bands"),
        ({"name": "mfcc", "n_mfcc": 0}, "n_mfcc"),
        ({"name": "mfcc", "n_mfcc": 40, "n_mels": 20}, "n_mels"),
        ({"name": "mfcc", "lifter": -1}, "lifter"),
        ({"name": "cqt", "n_bins": 0}, "n_bins"),
        ({"name": "cqt", "fmin": 0.0}, "fmin"),
        ({"name": "cqt", "bins_per_octave": 0}, "bins_per_octave"),
        ({"name": "stft", "window": "no-such-window"}, "window"),
        ({"name": "stft", "n_fft": 512, "win_length": 513}, "win_length"),
        ({"name": "log_spectrogram", "top_db": 0}, "top_db"),
    ],
)
def test_invalid_params_name_the_field(spec: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError) as info:
        FeatureExtractor.from_spec(spec)
    assert field in [path for path, _ in info.value.errors]


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ({"name": "mel", "fmax": 11025.0}, "fmax=11025 Hz is above the Nyquist"),
        ({"name": "mel", "fmin": 4000.0}, "fmin=4000 Hz is not below the Nyquist"),
        ({"name": "mfcc", "fmax": 6000.0}, "fmax=6000 Hz is above the Nyquist"),
        ({"name": "cqt", "n_bins": 96}, "highest bin"),
    ],
)
def test_limits_above_nyquist_fail_at_compute_time(spec: dict[str, Any], match: str) -> None:
    ex = FeatureExtractor.from_spec(spec)
    with pytest.raises(FeatureError, match=match):
        ex(tone(440.0, sr=8000), 8000)
    if spec["name"] in ("mel", "mfcc"):  # their declared rows check the band as computing does
        with pytest.raises(FeatureError, match=match):
            ex.bins(8000)


def test_declared_rows_need_no_audio_library_and_a_learner_starts_without_scipy_signal() -> None:
    """feature_bins of a mel or mfcc experiment, and the learner's own imports, load no scipy.signal or scipy.fft
    (~1.5 s of CPU of every learner's start before they were imported lazily), in a fresh interpreter."""
    import subprocess
    import sys

    code = ("import sys\n"
            "import labswarm.jobs.learner.entry\n"
            "from labswarm.audio.features import FeatureExtractor\n"
            "assert FeatureExtractor.from_spec({'name': 'mel', 'n_mels': 32}).bins(16000) == 32\n"
            "assert FeatureExtractor.from_spec({'name': 'mfcc', 'n_mfcc': 13}).bins(16000) == 13\n"
            "print(sorted(m for m in ('scipy.signal', 'scipy.fft', 'scipy.stats') if m in sys.modules))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]", done.stdout


def test_fmax_at_nyquist_is_allowed() -> None:
    out = FeatureExtractor.from_spec({"name": "mel", "fmax": 4000.0, "n_mels": 40})(tone(440.0, sr=8000), 8000)
    assert out.shape[0] == 40


def test_shared_spectra_equal_librosa_direct_path() -> None:
    """Mel and MFCC computed from one shared STFT equal librosa's own y-to-feature functions."""
    import librosa

    from labswarm.audio.features.shared import Spectra

    rng = np.random.default_rng(3)
    y = (0.3 * np.sin(2 * np.pi * 440 * np.arange(SR * 2) / SR) + 0.05 * rng.standard_normal(SR * 2)).astype(np.float32)
    mel = FeatureExtractor.from_spec({"name": "mel", "n_mels": 64})
    mfcc = FeatureExtractor.from_spec({"name": "mfcc", "n_mfcc": 13, "n_mels": 64})
    spectra = Spectra(y, SR)
    got_mel, got_mfcc = mel(y, SR, spectra), mfcc(y, SR, spectra)
    assert len(spectra._magnitude) == 1  # one STFT for both
    want_mel = librosa.power_to_db(librosa.feature.melspectrogram(y=y, sr=SR, n_mels=64), ref=1.0, top_db=80.0)
    want_mfcc = librosa.feature.mfcc(y=y, sr=SR, n_mfcc=13, n_mels=64)
    np.testing.assert_allclose(got_mel, want_mel, rtol=1e-5, atol=1e-3)
    np.testing.assert_allclose(got_mfcc, want_mfcc, rtol=1e-5, atol=1e-3)
