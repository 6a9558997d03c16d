from __future__ import annotations

from pathlib import Path

import yaml
from helpers import experiment_dict, write_tone

from labswarm.config.experiment import load_experiment, parse_experiment
from labswarm.pipeline.features import FeaturesBlock
from labswarm.sample import iter_samples


def test_process_computes_then_finds_cached(tone_dataset: Path, tmp_path: Path) -> None:
    block = FeaturesBlock(parse_experiment(experiment_dict(tone_dataset, tmp_path / "store")))
    sample = next(iter(iter_samples(block.config)))
    first = block.process(sample)
    assert first.status == "computed" and first.reason is None and set(first.keys) == {"mel", "mfcc"}
    second = block.process(sample)
    assert second.status == "cached" and second.keys == first.keys
    # one missing output is recomputed alone
    block.store.delete(first.keys["mfcc"])
    assert block.process(sample).status == "computed"
    assert all(block.store.contains(k) for k in first.keys.values())


def test_deterministic_transformation_shares_keys_across_seeds(tone_dataset: Path, tmp_path: Path) -> None:
    a = FeaturesBlock(parse_experiment(experiment_dict(tone_dataset, tmp_path / "s", seed=1)))
    b = FeaturesBlock(parse_experiment(experiment_dict(tone_dataset, tmp_path / "s", seed=2)))
    sa, sb = next(iter(iter_samples(a.config))), next(iter(iter_samples(b.config)))
    assert sa.seed != sb.seed
    assert a.keys(sa) == b.keys(sb)  # identity ignores the seed: shared across experiments


def test_noise_file_path_is_relative_to_yaml_and_its_content_is_in_the_key(tone_dataset: Path, tmp_path: Path):
    noise = write_tone(tmp_path / "conf" / "noise.wav", freq=1000, seconds=1.0, seed=1)
    data = experiment_dict(tone_dataset, tmp_path / "store",
                           transformations=[{"name": "add_noise", "snr_db": 10, "file": "noise.wav"}])
    (tmp_path / "conf" / "e.yml").write_text(yaml.safe_dump(data))
    config = load_experiment(tmp_path / "conf" / "e.yml")
    assert config.transformations[0].file == str(noise.resolve())
    block = FeaturesBlock(config)
    sample = next(iter(iter_samples(config)))
    before = block.keys(sample)
    assert block.process(sample).status == "computed"
    write_tone(noise, freq=2000, seconds=1.0, seed=2)  # the noise file is replaced: features must be recomputed
    after = FeaturesBlock(config).keys(sample)
    assert after != before


def test_failures_are_reported_not_raised(tone_dataset: Path, tmp_path: Path) -> None:
    block = FeaturesBlock(parse_experiment(experiment_dict(tone_dataset, tmp_path / "store")))
    sample = next(iter(iter_samples(block.config)))
    Path(sample.path).write_bytes(b"garbage" * 100)
    result = block.process(sample)
    assert result.status == "failed" and result.reason.startswith("AudioError") and sample.path in result.reason
