from __future__ import annotations

import os
from pathlib import Path

import pytest

from labswarm.errors import AudioError
from labswarm.store.keys import AudioIdentity, IdentityCache, audio_identity, fast_digest, feature_key

BASE = dict(
    sample_rate=22050,
    start=0.0,
    duration=10.0,
    pad=False,
    transformation={"name": "pitch_shift", "semitones": 2.0, "bins_per_octave": 12},
    transformation_version=1,
    seed=None,
    features={"name": "mel", "n_mels": 128},
    features_version=1,
)
AUDIO = AudioIdentity(size=1000, mtime_ns=123, digest="00" * 16)


def test_key_is_stable_hex() -> None:
    key = feature_key(AUDIO, **BASE)
    assert key == feature_key(AUDIO, **BASE)
    assert len(key) == 40 and int(key, 16) >= 0


@pytest.mark.parametrize(
    "field,value",
    [
        ("sample_rate", 16000),
        ("start", 1.0),
        ("duration", 5.0),
        ("duration", None),
        ("pad", True),
        ("transformation", {"name": "pitch_shift", "semitones": -2.0, "bins_per_octave": 12}),
        ("transformation", {"name": "identity"}),
        ("transformation_version", 2),
        ("seed", 7),
        ("features", {"name": "mel", "n_mels": 64}),
        ("features", {"name": "mfcc", "n_mels": 128}),
        ("features_version", 2),
    ],
)
def test_key_changes_with_each_input(field: str, value) -> None:
    assert feature_key(AUDIO, **{**BASE, field: value}) != feature_key(AUDIO, **BASE)


@pytest.mark.parametrize("audio", [AudioIdentity(1001, 123, "00" * 16), AudioIdentity(1000, 124, "00" * 16),
                                   AudioIdentity(1000, 123, "01" * 16)])
def test_key_changes_with_audio_identity(audio: AudioIdentity) -> None:
    assert feature_key(audio, **BASE) != feature_key(AUDIO, **BASE)


def test_key_ignores_spec_key_order() -> None:
    reordered = {**BASE, "features": {"n_mels": 128, "name": "mel"}}
    assert feature_key(AUDIO, **reordered) == feature_key(AUDIO, **BASE)


def test_identity_tracks_content_size_and_mtime(tmp_path: Path) -> None:
    path = tmp_path / "a.bin"
    path.write_bytes(b"x" * 300_000)
    first = audio_identity(path)
    assert first.size == 300_000
    # same size and mtime, different content in a hashed block: the digest catches it
    st = os.stat(path)
    path.write_bytes(b"y" + b"x" * 299_999)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    second = audio_identity(path)
    assert second.mtime_ns == first.mtime_ns and second.digest != first.digest
    assert fast_digest(path, 300_000) == second.digest


def test_identity_cache_refreshes_on_change(tmp_path: Path) -> None:
    path = tmp_path / "a.bin"
    path.write_bytes(b"abc")
    cache = IdentityCache()
    first = cache(path)
    assert cache(path) is first
    path.write_bytes(b"abcd")
    assert cache(path).size == 4
    with pytest.raises(AudioError, match="not found"):
        cache(tmp_path / "missing.wav")


def test_identity_cache_is_bounded_least_recently_used_out(tmp_path: Path) -> None:
    paths = []
    for i in range(5):
        paths.append(tmp_path / f"c{i}.wav")
        paths[-1].write_bytes(bytes([i]) * 10)
    cache = IdentityCache(max_entries=3)
    first = cache(paths[0])
    cache(paths[1])
    cache(paths[2])
    assert cache(paths[0]) is first  # a hit makes c0 the most recent: c1 is the oldest now
    cache(paths[3])
    cache(paths[4])
    assert len(cache) == 3
    assert cache(paths[0]) is first  # kept: used recently
    again = cache(paths[1])  # evicted: computed anew, equal but not the same object
    assert again == audio_identity(paths[1]) and len(cache) == 3
