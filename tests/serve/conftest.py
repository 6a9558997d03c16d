"""The three-class model the endpoint's tests serve (trained once per session, in the test process)."""

from __future__ import annotations

from pathlib import Path

import pytest
from train.three_classes import training_experiment, write_three_classes

from labswarm.config.experiment import parse_experiment
from labswarm.train.trainer import Trainer


@pytest.fixture(scope="session")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The three-class model (2 epochs, in this process: a few seconds); its clips are in ``parents[2] / "data"``."""
    tmp = tmp_path_factory.mktemp("serve")
    root = write_three_classes(tmp / "data")
    config = parse_experiment(training_experiment(root, tmp / "store", pipeline=[
        {"name": "source"}, {"name": "shuffle"}, {"name": "features"}, {"name": "batch", "size": 8}],
        training={"epochs": 2, "learning_rate": 0.01, "validation": 0.25, "threads": 1}))
    return Trainer(config, tmp / "home").fit().model_path
