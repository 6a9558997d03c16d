"""The ``training`` section's ``seed`` (issue 23): an int >= 0; a bad one is refused naming ``training.seed``, in an
experiment, in a job manifest's training overrides, and by ``labswarm train`` (exit 2) before anything trains."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from helpers import experiment_dict, write_dataset
from typer.testing import CliRunner

from labswarm.cli import exits
from labswarm.cli.main import app
from labswarm.config.experiment import parse_experiment
from labswarm.config.manifest import parse_manifest
from labswarm.errors import ConfigError

MODEL = {"name": "cnn", "input": "mel"}
MANIFEST = {"name": "j", "experiment": "three", "results_store": {"name": "local", "path": "r"}}


@pytest.mark.parametrize("seed", [-1, "seven", 1.5, True])
def test_a_bad_training_seed_is_refused_naming_the_field(tmp_path: Path, seed: object) -> None:
    data = experiment_dict(tmp_path, tmp_path / "store", model=MODEL, training={"seed": seed})
    with pytest.raises(ConfigError) as raised:
        parse_experiment(data)
    assert "training.seed" in dict(raised.value.errors), raised.value.errors
    with pytest.raises(ConfigError) as raised:
        parse_manifest({**MANIFEST, "training": {"seed": seed}})
    assert "training.seed" in dict(raised.value.errors), raised.value.errors


def test_the_training_seed_defaults_to_the_experiments_and_labswarm_train_refuses_a_bad_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = experiment_dict(tmp_path, tmp_path / "store", seed=5, model=MODEL, training={"epochs": 1})
    assert parse_experiment(data).training_seed == 5
    assert parse_experiment({**data, "training": {"seed": 0}}).training_seed == 0
    assert parse_manifest({**MANIFEST, "training": {"seed": 9}}).training == {"seed": 9}

    write_dataset(tmp_path / "data", n_per_label=2)
    path = tmp_path / "e.yml"
    path.write_text(yaml.safe_dump({**experiment_dict(tmp_path / "data", tmp_path / "store", model=MODEL),
                                    "training": {"seed": -3}}))
    monkeypatch.setenv("LABSWARM_HOME", str(tmp_path / "home"))
    result = CliRunner().invoke(app, ["train", str(path)])
    assert result.exit_code == exits.USAGE == 2, result.output
    assert "training.seed" in result.output
    assert not (tmp_path / "home").exists() or not any((tmp_path / "home").rglob("*.pt"))
