"""Fixtures of the pipeline tests: a tiny experiment of real tones whose features are already in its store."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import experiment_dict, write_tone_set

from labswarm.config.experiment import ExperimentConfig, parse_experiment
from labswarm.pipeline.features import FeaturesBlock
from labswarm.sample import iter_samples


def tiny_experiment(root: Path, tones: int = 8, **overrides: object) -> ExperimentConfig:
    """An experiment over ``tones`` real 2-s tones (two labels, one source each) × 2 transformations, with its
    store under ``root``; nothing computed yet."""
    data = write_tone_set(root / "data", tones=tones, seconds=2.0)
    return parse_experiment(experiment_dict(data, root / "store", **overrides))


@pytest.fixture
def fresh_tones(tmp_path: Path) -> ExperimentConfig:
    """4 tones × 2 transformations in ``tmp_path``, with an empty store: a test may spoil its files."""
    return tiny_experiment(tmp_path, tones=4)


@pytest.fixture(scope="session")
def tones(tmp_path_factory: pytest.TempPathFactory) -> ExperimentConfig:
    """16 samples (8 tones × identity, gain) whose mel and mfcc features are in the store. They are computed
    here, in the test process, so that producer processes forked later read the store with warm libraries."""
    config = tiny_experiment(tmp_path_factory.mktemp("pipeline"))
    block = FeaturesBlock(config)
    for sample in iter_samples(config):
        result = block.process(sample)
        assert result.status == "computed", result.reason
    return config
