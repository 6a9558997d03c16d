"""Built-in transformations on real signals, through real codecs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile as sf
from scipy import signal

from labswarm.audio.transforms import TRANSFORMATIONS, Transformation
from labswarm.audio.transforms.codec import MP3_RATES, mp3_rate
from labswarm.errors import ConfigError, TransformError

SR = 22050
SECONDS = 2.0


def tone(freq: float, seconds: float = SECONDS, sr: int = SR, amp: float = 0.5) -> np.ndarray:
    t = np.arange(int(seconds * sr)) / sr
    return (amp * np.sin(2 * np.pi * freq * t)).astype(np.float32)


def music_like(seconds: float = SECONDS, sr: int = SR, seed: int = 0) -> np.ndarray:
    """Harmonic tones under a tremolo, plus band-limited noise bursts: sharp autocorrelation, codec-friendly."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * sr)) / sr
    y = sum(0.15 / k * np.sin(2 * np.pi * 196.0 * k * t + k) for k in range(1, 6))
    y = y * (1.0 + 0.5 * np.sin(2 * np.pi * 3.0 * t))
    noise = signal.sosfilt(signal.butter(4, min(3000.0, 0.4 * sr), fs=sr, output="sos"), rng.standard_normal(t.size))
    bursts = (np.sin(2 * np.pi * 2.5 * t) > 0.6).astype(float)
    return (y + 0.3 * noise * bursts).astype(np.float32)


def peak_hz(y: np.ndarray, sr: int = SR) -> float:
    """Frequency of the strongest spectral peak of the middle half of ``y`` (zero-padded FFT, 0.1-Hz grid)."""
    seg = y[y.size // 4 : 3 * y.size // 4] * np.hanning(y.size // 2)
    n_fft = 1 << int(np.ceil(np.log2(sr * 10)))
    spectrum = np.abs(np.fft.rfft(seg, n_fft))
    return float(np.argmax(spectrum)) * sr / n_fft


def rms_db(y: np.ndarray) -> float:
    return 10 * np.log10(np.mean(np.asarray(y, dtype=np.float64) ** 2))


def best_lag(reference: np.ndarray, other: np.ndarray, max_lag: int = 4000) -> int:
    corr = signal.correlate(other, reference, mode="full", method="fft")
    lags = signal.correlation_lags(other.size, reference.size, mode="full")
    keep = np.abs(lags) <= max_lag
    return int(lags[keep][np.argmax(corr[keep])])


@pytest.fixture(scope="module")
def clip() -> np.ndarray:
    return music_like()


@pytest.fixture(scope="module")
def noise_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real 0.7-s noise recording at 16 kHz, stereo: looped, mixed down and resampled when used."""
    rng = np.random.default_rng(7)
    path = tmp_path_factory.mktemp("noise") / "hum.flac"
    t = np.arange(int(0.7 * 16000)) / 16000
    hum = 0.2 * np.sin(2 * np.pi * 50 * t)[:, None] + 0.05 * rng.standard_normal((t.size, 2))
    sf.write(path, hum.astype(np.float32), 16000)
    return path


SPECS: list[dict[str, Any]] = [
    {"name": "identity"},
    {"name": "pitch_shift", "semitones": 3},
    {"name": "pitch_shift", "semitones": -2.5, "bins_per_octave": 12},
    {"name": "eq", "bands": [{"freq_hz": 150, "gain_db": -9, "q": 0.7}, {"freq_hz": 2500, "gain_db": 6, "q": 1.0}]},
    {"name": "add_noise", "snr_db": 10},
    {"name": "add_noise", "snr_db": 5, "color": "pink"},
    {"name": "add_noise", "snr_db": 20, "color": "brown"},
    {"name": "codec", "format": "mp3", "bitrate_kbps": 64},
    {"name": "codec", "format": "vorbis", "quality": 0.3},
    {"name": "codec", "format": "opus", "bitrate_kbps": 24},
    {"name": "gain", "gain_db": -6},
    {"name": "gain", "gain_db": 12, "clip": True},
    {"name": "time_stretch", "rate": 1.25},
]


def _ids(specs: list[dict[str, Any]]) -> list[str]:
    return [f"{s['name']}-{i}" for i, s in enumerate(specs)]


def test_every_registered_transformation_is_exercised() -> None:
    assert {s["name"] for s in SPECS} == set(TRANSFORMATIONS.names())


@pytest.mark.parametrize("spec", SPECS, ids=_ids(SPECS))
def test_shape_dtype_and_seeding(spec: dict[str, Any], clip: np.ndarray) -> None:
    t = Transformation.from_spec(spec)
    out = t(clip, SR, seed=1)
    expected = round(clip.size / spec["rate"]) if spec["name"] == "time_stretch" else clip.size
    assert out.shape == (expected,)
    assert out.dtype == np.float32
    assert out.flags.c_contiguous
    assert np.all(np.isfinite(out))
    np.testing.assert_array_equal(out, t(clip, SR, seed=1))  # same seed, same output
    other = t(clip, SR, seed=2)
    if t.random:
        assert not np.array_equal(out, other)
    else:  # the store leaves the seed out of a deterministic transformation's key: it must not matter
        np.testing.assert_array_equal(out, other)


@pytest.mark.parametrize("spec", SPECS, ids=_ids(SPECS))
def test_spec_round_trip(spec: dict[str, Any]) -> None:
    t = Transformation.from_spec(spec)
    again = Transformation.from_spec(t.spec())
    assert type(again) is type(t)
    assert again.spec() == t.spec()
    assert again.config == t.config
    assert Transformation.from_spec(t.config).spec() == t.spec()


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"name": "pitch_shift", "semitones": 0}, "semitones"),
        ({"name": "pitch_shift", "semitones": 24.5}, "semitones"),
        ({"name": "pitch_shift", "semitones": "up"}, "semitones"),
        ({"name": "pitch_shift"}, "semitones"),
        ({"name": "pitch_shift", "semitones": 2, "bins_per_octave": 0}, "bins_per_octave"),
        ({"name": "eq", "bands": []}, "bands"),
        ({"name": "eq", "bands": [{"freq_hz": 0, "gain_db": 3, "q": 1}]}, "bands.0.freq_hz"),
        (
            {"name": "eq", "bands": [{"freq_hz": 100, "gain_db": 3, "q": 1}, {"freq_hz": 1e3, "gain_db": 1}]},
            "bands.1.q",
        ),
        ({"name": "eq", "bands": [{"freq_hz": 100, "gain_db": 3, "q": -1}]}, "bands.0.q"),
        ({"name": "add_noise"}, "snr_db"),
        ({"name": "add_noise", "snr_db": 10, "color": "blue"}, "color"),
        ({"name": "codec", "format": "aac"}, "format"),
        ({"name": "codec", "format": "mp3", "bitrate_kbps": 65}, "bitrate_kbps"),
        ({"name": "codec", "format": "opus", "bitrate_kbps": 300}, "bitrate_kbps"),
        ({"name": "codec", "format": "opus", "bitrate_kbps": 4}, "bitrate_kbps"),
        ({"name": "codec", "format": "vorbis", "bitrate_kbps": 64}, "bitrate_kbps"),
        ({"name": "codec", "format": "mp3", "quality": 0.5}, "quality"),
        ({"name": "codec", "format": "vorbis", "quality": 1.5}, "quality"),
        ({"name": "gain", "gain_db": "loud"}, "gain_db"),
        ({"name": "gain", "gain_db": 3, "volume": 1}, "volume"),
        ({"name": "time_stretch", "rate": 0}, "rate"),
        ({"name": "time_stretch", "rate": -1.5}, "rate"),
    ],
)
def test_invalid_params_name_the_field(spec: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError) as info:
        Transformation.from_spec(spec)
    assert field in [path for path, _ in info.value.errors]


def test_pitch_shift_scales_frequency() -> None:
    y = tone(440.0)
    for semitones in (3.0, -5.0, 12.0):
        out = Transformation.from_spec({"name": "pitch_shift", "semitones": semitones})(y, SR)
        assert out.size == y.size
        assert peak_hz(out) / 440.0 == pytest.approx(2 ** (semitones / 12), rel=0.02)
    quarter = Transformation.from_spec({"name": "pitch_shift", "semitones": 2, "bins_per_octave": 24})
    assert peak_hz(quarter(y, SR)) / 440.0 == pytest.approx(2 ** (2 / 24), rel=0.02)


@pytest.mark.parametrize("gain_db", [6.0, -9.0, 12.0])
def test_eq_changes_band_energy_by_the_gain(gain_db: float) -> None:
    bands = [{"freq_hz": 1000, "gain_db": gain_db, "q": 1.4}, {"freq_hz": 6000, "gain_db": -12, "q": 2}]
    eq = Transformation.from_spec({"name": "eq", "bands": bands})
    centre, far = tone(1000.0), tone(100.0)
    mid = slice(SR // 2, -SR // 2)  # steady state
    assert rms_db(eq(centre, SR)[mid]) - rms_db(centre[mid]) == pytest.approx(gain_db, abs=1.0)
    assert abs(rms_db(eq(far, SR)[mid]) - rms_db(far[mid])) < 0.5


def test_eq_rejects_a_band_above_nyquist() -> None:
    eq = Transformation.from_spec({"name": "eq", "bands": [{"freq_hz": 5000, "gain_db": 3, "q": 1}]})
    eq(tone(440.0, sr=16000), 16000)
    with pytest.raises(TransformError, match=r"bands\.0\.freq_hz"):
        eq(tone(440.0, sr=8000), 8000)


def _snr_db(clean: np.ndarray, noisy: np.ndarray) -> float:
    return rms_db(clean) - rms_db(noisy.astype(np.float64) - clean)


@pytest.mark.parametrize("color", ["white", "pink", "brown"])
@pytest.mark.parametrize("snr_db", [0.0, 10.0, 30.0])
def test_noise_hits_the_snr(color: str, snr_db: float, clip: np.ndarray) -> None:
    t = Transformation.from_spec({"name": "add_noise", "snr_db": snr_db, "color": color})
    for seed in range(3):
        assert _snr_db(clip, t(clip, SR, seed)) == pytest.approx(snr_db, abs=0.5)


@pytest.mark.parametrize(("color", "ratio"), [("white", 10.0), ("pink", 1.0), ("brown", 0.1)])
def test_noise_colours_have_their_spectral_slope(color: str, ratio: float) -> None:
    """Power in 1-2 kHz over power in 100-200 Hz: 10 for white (flat), 1 for pink (equal per octave), 0.1 brown."""
    y = tone(440.0)
    noise = Transformation.from_spec({"name": "add_noise", "snr_db": 0, "color": color})(y, SR, 3) - y
    freqs, psd = signal.welch(noise, fs=SR, nperseg=4096)
    high = psd[(freqs >= 1000) & (freqs < 2000)].sum()
    low = psd[(freqs >= 100) & (freqs < 200)].sum()
    assert high / low == pytest.approx(ratio, rel=0.5)


def test_noise_from_a_file_hits_the_snr_and_depends_on_the_seed(noise_file: Path, clip: np.ndarray) -> None:
    t = Transformation.from_spec({"name": "add_noise", "snr_db": 6, "file": str(noise_file), "color": "brown"})
    first = t(clip, SR, seed=0)
    assert _snr_db(clip, first) == pytest.approx(6.0, abs=0.5)
    assert peak_hz(first - clip) == pytest.approx(50.0, abs=1.0)  # the file's hum, resampled 16 kHz -> 22.05 kHz
    assert not np.array_equal(first, t(clip, SR, seed=1))  # another offset into the file


def test_noise_file_errors(tmp_path: Path, clip: np.ndarray) -> None:
    missing = Transformation.from_spec({"name": "add_noise", "snr_db": 6, "file": str(tmp_path / "nope.wav")})
    with pytest.raises(TransformError, match="cannot read noise file"):
        missing(clip, SR)
    sf.write(tmp_path / "silence.wav", np.zeros(1000, dtype=np.float32), SR)
    silent = Transformation.from_spec({"name": "add_noise", "snr_db": 6, "file": str(tmp_path / "silence.wav")})
    with pytest.raises(TransformError, match="silent"):
        silent(clip, SR)


def test_noise_leaves_silence_unchanged() -> None:
    zeros = np.zeros(SR, dtype=np.float32)
    out = Transformation.from_spec({"name": "add_noise", "snr_db": 10})(zeros, SR, 5)
    np.testing.assert_array_equal(out, zeros)


CODECS = [
    ({"format": "mp3", "bitrate_kbps": 64}, SR),
    ({"format": "mp3", "bitrate_kbps": 32}, 16000),
    ({"format": "mp3", "bitrate_kbps": 8}, 44100),  # resampled to 24 kHz: 8 kbps needs MPEG-2
    ({"format": "mp3", "bitrate_kbps": 128}, 48000),
    ({"format": "mp3", "bitrate_kbps": 24}, 11025),
    ({"format": "vorbis", "quality": 0.4}, SR),
    ({"format": "vorbis", "quality": 0.0}, 16000),
    ({"format": "opus", "bitrate_kbps": 32}, SR),  # resampled to 24 kHz and back
    ({"format": "opus", "bitrate_kbps": 16}, 16000),
    ({"format": "opus", "bitrate_kbps": 64}, 44100),  # resampled to 48 kHz and back
]


@pytest.mark.parametrize(("params", "sr"), CODECS, ids=[f"{p['format']}-{sr}-{i}" for i, (p, sr) in enumerate(CODECS)])
def test_codec_keeps_length_and_alignment(params: dict[str, Any], sr: int) -> None:
    y = music_like(sr=sr, seed=sr)
    out = Transformation.from_spec({"name": "codec", **params})(y, sr)
    assert out.shape == y.shape
    assert abs(best_lag(y, out)) <= 3
    similarity = float(np.dot(y, out) / np.sqrt(np.dot(y, y) * np.dot(out, out)))
    assert similarity > 0.8  # the same waveform, degraded
    assert not np.array_equal(out, y)


def test_codec_defaults_are_explicit_in_the_spec() -> None:
    assert Transformation.from_spec({"name": "codec"}).spec() == {
        "name": "codec",
        "format": "mp3",
        "bitrate_kbps": 64,
        "quality": None,
    }
    assert Transformation.from_spec({"name": "codec", "format": "opus"}).spec()["bitrate_kbps"] == 32
    assert Transformation.from_spec({"name": "codec", "format": "vorbis"}).spec()["quality"] == 0.4


def test_mp3_keeps_loud_peaks() -> None:
    y = 2.0 * music_like()
    out = Transformation.from_spec({"name": "codec", "format": "mp3", "bitrate_kbps": 128})(y, SR)
    assert np.max(np.abs(out)) > 1.5  # scaled down for the 16-bit encoder, then back up: not clipped at 1


def test_mp3_rate_choice() -> None:
    assert mp3_rate(22050, 64) == 22050
    assert mp3_rate(44100, 8) == 24000
    assert mp3_rate(20000, 64) == 22050
    assert mp3_rate(96000, 320) == 48000
    assert all(mp3_rate(rate, 32) == rate for rate in MP3_RATES)


@pytest.mark.parametrize("gain_db", [-12.0, 3.0, 6.0])
def test_gain_scales_rms(gain_db: float, clip: np.ndarray) -> None:
    out = Transformation.from_spec({"name": "gain", "gain_db": gain_db})(clip, SR)
    assert rms_db(out) - rms_db(clip) == pytest.approx(gain_db, abs=0.01)


def test_gain_clip() -> None:
    y = tone(440.0, amp=0.9)
    loud = Transformation.from_spec({"name": "gain", "gain_db": 12})(y, SR)
    clipped = Transformation.from_spec({"name": "gain", "gain_db": 12, "clip": True})(y, SR)
    assert np.max(np.abs(loud)) > 3.0
    assert np.max(np.abs(clipped)) == pytest.approx(1.0)


@pytest.mark.parametrize("rate", [0.8, 1.25, 2.0])
def test_time_stretch_changes_length_not_pitch(rate: float) -> None:
    y = tone(440.0)
    out = Transformation.from_spec({"name": "time_stretch", "rate": rate})(y, SR)
    assert out.size == round(y.size / rate)
    assert peak_hz(out) == pytest.approx(440.0, rel=0.02)
