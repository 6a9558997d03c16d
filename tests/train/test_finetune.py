"""Fine-tuning (issue 25, item 4, first half): ``training.init_from: {model: PATH}`` and ``training.freeze``."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from three_classes import training_experiment

from labswarm.config.experiment import parse_experiment
from labswarm.errors import ConfigError
from labswarm.train import checkpoint
from labswarm.train.finetune import init_from
from labswarm.train.trainer import Trainer

MODEL = {"name": "cnn", "input": "mel", "channels": [8, 16]}
HEAD = ("head.2.weight", "head.2.bias")


def _train(root: Path, store: Path, home: Path, epochs: int = 1, **training: object) -> Path:
    config = parse_experiment(training_experiment(root, store, model=MODEL, training={
        "epochs": epochs, "learning_rate": 0.01, "validation": 0.25, "threads": 1, **training}))
    return Trainer(config, home).fit().model_path


def _two_classes(three_classes: Path, tmp_path: Path) -> Path:
    """The same clips with 'high' and 'low' merged into 'tone': other classes than the parent's."""
    labels = (three_classes / "labels.csv").read_text().replace(",high,", ",tone,").replace(",low,", ",tone,")
    other = tmp_path / "two"
    other.mkdir()
    for sub in ("high", "low", "noise"):
        (other / sub).symlink_to(three_classes / sub)
    (other / "labels.csv").write_text(labels)
    return other


def test_fine_tuning_from_a_model_with_other_classes_keeps_the_body_and_gets_a_new_head(
        three_classes: Path, tmp_path: Path) -> None:
    parent = _train(three_classes, tmp_path / "store", tmp_path / "parent")
    before = checkpoint.load(parent)["state_dict"]
    child = _train(_two_classes(three_classes, tmp_path), tmp_path / "store2", tmp_path / "child",
                   epochs=1, init_from={"model": str(parent)}, freeze=["features."], learning_rate=0.05)
    saved = checkpoint.load(child)
    after, init = saved["state_dict"], saved["init_from"]
    assert saved["classes"] == ["noise", "tone"] and after["head.2.weight"].shape[0] == 2
    assert init["fingerprint"] == checkpoint.load(parent)["fingerprint"] and set(init["fresh"]) == set(HEAD)
    frozen = [k for k in after if k.startswith("features.") and k.endswith(("weight", "bias"))]
    assert frozen and init["frozen"] == frozen
    assert all(torch.equal(after[k], before[k]) for k in frozen)  # frozen: the parent's, unchanged by training
    assert not torch.equal(after["head.2.bias"][:2], before["head.2.bias"][:2])


def test_the_same_classes_copy_every_tensor_and_other_ones_in_the_same_number_renew_the_head(
        three_classes: Path, tmp_path: Path) -> None:
    parent = _train(three_classes, tmp_path / "store", tmp_path / "parent")
    before = checkpoint.load(parent)["state_dict"]
    config = parse_experiment(training_experiment(three_classes, tmp_path / "store", model=MODEL, training={
        "epochs": 1, "validation": 0.25, "threads": 1, "init_from": {"model": str(parent)}}))
    trainer = Trainer(config, tmp_path / "child")
    model = trainer.spec.build(32, 3)
    done = init_from(model, config.training, ["high", "low", "noise"])
    assert done is not None and done["fresh"] == []
    assert all(torch.equal(model.state_dict()[k], before[k]) for k in before)
    renamed = trainer.spec.build(32, 3)  # as many classes, other ones: the head's rows would mean other classes
    done = init_from(renamed, config.training, ["high", "noise", "low"])
    assert done is not None and set(done["fresh"]) == set(HEAD)
    assert not torch.equal(renamed.state_dict()["head.2.weight"], before["head.2.weight"])


@pytest.mark.parametrize(("training", "field"), [
    ({"freeze": ["encoder."]}, "training.freeze"),
    ({"init_from": {"model": "/nonexistent/model.pt"}}, "training.init_from.model"),
])
def test_a_bad_init_or_freeze_names_the_field(three_classes: Path, tmp_path: Path, training: dict,
                                              field: str) -> None:
    with pytest.raises(ConfigError) as caught:
        _train(three_classes, tmp_path / "store", tmp_path / "home", **training)
    assert caught.value.errors[0][0] == field, caught.value.errors
