from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from helpers import experiment_dict, write_tone

from labswarm.config.experiment import parse_experiment
from labswarm.local import run_local
from labswarm.pipeline.features import FeaturesBlock
from labswarm.sample import iter_samples
from labswarm.store import FeatureStore


@pytest.mark.parametrize("jobs", [1, 2])
def test_run_then_rerun_is_all_cached(tone_dataset: Path, tmp_path: Path, jobs: int) -> None:
    config = parse_experiment(experiment_dict(tone_dataset, tmp_path / "store"))
    seen = []
    first = run_local(config, jobs=jobs, on_result=seen.append)
    assert (first.total, first.computed, first.cached, first.failed) == (8, 8, 0, 0)
    assert len(seen) == 8
    assert first.store.entries == 8 * 2  # two feature outputs per sample
    second = run_local(config, jobs=jobs)
    assert (second.computed, second.cached, second.failed) == (0, 8, 0)
    assert second.store == first.store


def test_stored_features_equal_direct_computation(tone_dataset: Path, tmp_path: Path) -> None:
    config = parse_experiment(experiment_dict(tone_dataset, tmp_path / "store"))
    run_local(config, jobs=2)
    block = FeaturesBlock(config)
    store = FeatureStore(config.store.root)
    sample = list(iter_samples(config))[3]
    direct = block.compute(sample)
    for name, key in block.keys(sample).items():
        stored = store.get(key)
        assert stored.dtype == np.float32
        np.testing.assert_allclose(stored, direct[name], rtol=1e-5, atol=1e-4)
    assert direct["mel"].shape == (32, 1 + 2 * 22050 // 512)
    assert direct["mfcc"].shape[0] == 13


def test_bad_files_fail_alone_with_reasons(tone_dataset: Path, tmp_path: Path) -> None:
    (tone_dataset / "low" / "corrupt.wav").write_bytes(b"RIFF....WAVEfmt garbage" * 20)
    (tone_dataset / "low" / "empty.wav").write_bytes(b"")
    write_tone(tone_dataset / "low" / "short.wav", seconds=0.5)
    with open(tone_dataset / "labels.csv", "a") as handle:
        handle.write("low/corrupt.wav,low,c\nlow/empty.wav,low,e\nlow/short.wav,low,s\nlow/gone.wav,low,g\n")
    config = parse_experiment(experiment_dict(tone_dataset, tmp_path / "store"))
    summary = run_local(config, jobs=2)
    assert summary.total == 16 and summary.computed == 8 and summary.failed == 8
    reasons = dict(summary.failures)
    assert "unreadable" in reasons["low/corrupt.wav#0"] and "AudioError" in reasons["low/corrupt.wav#0"]
    assert "empty file" in reasons["low/empty.wav#1"]
    assert "past the end" in reasons["low/short.wav#0"]
    assert "not found" in reasons["low/gone.wav#1"]


def test_config_error_starts_no_work(tone_dataset: Path, tmp_path: Path) -> None:
    from labswarm.errors import ConfigError

    with pytest.raises(ConfigError):
        parse_experiment(experiment_dict(tone_dataset, tmp_path / "store", features=[{"name": "mel", "n_fft": -1}]))
    assert not (tmp_path / "store").exists()
