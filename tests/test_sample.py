from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import experiment_dict

from labswarm.config.experiment import parse_experiment
from labswarm.datasets.folder import read_clips
from labswarm.errors import DatasetError
from labswarm.sample import Sample, count_samples, iter_samples, sample_seed


def test_samples_are_clips_times_transformations(tone_dataset: Path, tmp_path: Path) -> None:
    config = parse_experiment(experiment_dict(tone_dataset, tmp_path / "store"))
    samples = list(iter_samples(config))
    assert len(samples) == count_samples(config) == 4 * 2
    assert samples[0].id == "low/low_0.wav#0" and samples[1].id == "low/low_0.wav#1"
    assert samples[1].transformation == {"name": "gain", "gain_db": -6.0, "clip": False}
    assert samples[0].source == "low-src0" and samples[0].label == "low"
    assert Path(samples[0].path).is_file()
    # a sample is a small JSON message that round-trips
    text = json.dumps(samples[1].to_dict())
    assert Sample.from_dict(json.loads(text)) == samples[1]
    assert len(text) < 400


def test_seed_depends_on_experiment_clip_and_transformation_not_position() -> None:
    spec = {"name": "add_noise", "snr_db": 10}
    assert sample_seed(0, "a.wav", spec) == sample_seed(0, "a.wav", dict(reversed(list(spec.items()))))
    assert sample_seed(0, "a.wav", spec) != sample_seed(1, "a.wav", spec)
    assert sample_seed(0, "a.wav", spec) != sample_seed(0, "b.wav", spec)
    assert sample_seed(0, "a.wav", spec) != sample_seed(0, "a.wav", {**spec, "snr_db": 11})
    assert 0 <= sample_seed(0, "a.wav", spec) < 2**63


@pytest.mark.parametrize(
    "csv,match",
    [
        ("file,label\na.wav,x\n", "missing column"),
        ("path,label\na.wav,\n", "line 2: empty path or label"),
        ("path,label\na.wav,x\na.wav,y\n", "listed twice"),
    ],
)
def test_bad_labels_csv(tmp_path: Path, csv: str, match: str) -> None:
    (tmp_path / "labels.csv").write_text(csv)
    with pytest.raises(DatasetError, match=match):
        read_clips(tmp_path, tmp_path / "labels.csv")


def test_missing_labels_csv(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="cannot read labels CSV"):
        read_clips(tmp_path, tmp_path / "labels.csv")
