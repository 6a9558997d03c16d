"""Model plugins (issue 25, item 1): an installed package's model (examples/labswarm-example-net) listed, validated
by its own config and trained; a network from a Python file (``model: {code: FILE.py:Class}``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from example_net import MODEL, ensure_example_net
from three_classes import training_experiment

from labswarm.config.experiment import load_experiment, parse_experiment
from labswarm.errors import ConfigError
from labswarm.pipeline.pipeline import Pipeline
from labswarm.train.trainer import Trainer, load_model

NET = '''
import torch
from torch import nn

class Net(nn.Module):
    def __init__(self, n_bins, n_classes, width=8):
        super().__init__()
        self.norm = nn.BatchNorm1d(n_bins)
        self.linear = nn.Linear(n_bins, n_classes)
        self.width = width

    def forward(self, x):
        return self.linear(self.norm(x).mean(dim=2))
'''


@pytest.fixture(scope="module", autouse=True)
def example_net() -> None:
    ensure_example_net()


def test_models_list_shows_the_installed_plugin_its_source_input_and_parameters() -> None:
    """A fresh interpreter (the entry points as a user's shell sees them), ~3 s."""
    out = subprocess.run([sys.executable, "-m", "labswarm.cli", "models", "list", "--json"], capture_output=True,
                         text=True, check=True, timeout=120).stdout
    models = {m["name"]: m for m in json.loads(out)}
    assert {"cnn", "mlp", "code", MODEL} <= set(models)
    plugin = models[MODEL]
    assert plugin["source"] == "labswarm-example-net 0.1.0" and plugin["input"] == "mel"
    assert plugin["cls"] == "labswarm_example_net:ConvGRU"
    hidden = next(p for p in plugin["parameters"] if p["name"] == "hidden")
    assert hidden["default"] == 32 and hidden["type"] == "int" and ">= 1" in hidden["constraints"]
    assert models["cnn"]["source"].startswith("labswarm ")


def test_a_parameter_the_plugin_s_config_rejects_is_an_error_naming_it(three_classes: Path, tmp_path: Path) -> None:
    data = training_experiment(three_classes, tmp_path / "store", model={"name": MODEL, "hidden": 0, "depth": 2})
    with pytest.raises(ConfigError) as caught:
        parse_experiment(data)
    paths = dict(caught.value.errors)
    assert set(paths) == {"model.hidden", "model.depth"}, caught.value.errors
    assert "greater than or equal to 1" in paths["model.hidden"]


def test_the_example_package_s_model_trains_and_its_file_loads(three_classes: Path, tmp_path: Path) -> None:
    config = parse_experiment(training_experiment(three_classes, tmp_path / "store",
                                                  model={"name": MODEL, "hidden": 16},
                                                  training={"epochs": 3, "learning_rate": 0.01, "validation": 0.25,
                                                            "threads": 1}))
    result = Trainer(config, tmp_path / "home").fit()
    assert result.final["val_accuracy"] >= 0.75, result.final
    model, meta = load_model(result.model_path)
    assert type(model).__name__ == "ConvGRUNet" and meta["model"]["name"] == MODEL
    assert model.gru.hidden_size == 16


def test_a_network_from_a_file_relative_to_the_experiment_trains(three_classes: Path, tmp_path: Path) -> None:
    (tmp_path / "nets").mkdir()
    (tmp_path / "nets" / "my_net.py").write_text(NET)
    data = training_experiment(three_classes, tmp_path / "store", model={"code": "nets/my_net.py:Net",
                                                                         "params": {"width": 4}})
    data["training"]["epochs"] = 1
    (tmp_path / "experiment.yml").write_text(yaml.safe_dump(data))
    config = load_experiment(tmp_path / "experiment.yml")
    assert config.model is not None and config.model.name == "code"
    assert config.model.code == f"{tmp_path / 'nets' / 'my_net.py'}:Net"
    result = Trainer(config, tmp_path / "home").fit()
    model, _ = load_model(result.model_path)
    assert model.width == 4
    batch = next(iter(Pipeline(config, split="validation", train=False).epoch(0)))
    with torch.no_grad():
        assert model(torch.from_numpy(batch.features["mel"])).shape == (len(batch), 3)


@pytest.mark.parametrize(("code", "params", "field", "words"), [
    ("my_net.py:Net", {"depth": 3}, "model.params", "depth"),
    ("my_net.py:Missing", {}, "model.code", "has no 'Missing'"),
    ("absent.py:Net", {}, "model.code", "no such file"),
])
def test_a_file_model_s_errors_name_the_field(three_classes: Path, tmp_path: Path, code: str, params: dict,
                                              field: str, words: str) -> None:
    (tmp_path / "my_net.py").write_text(NET)
    config = parse_experiment(training_experiment(three_classes, tmp_path / "store",
                                                  model={"code": str(tmp_path / code), "params": params}))
    with pytest.raises(ConfigError) as caught:
        Trainer(config, tmp_path / "home").fit()
    assert caught.value.errors[0][0] == field and words in caught.value.errors[0][1], caught.value.errors
