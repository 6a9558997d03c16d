"""The trainer on real audio: it learns, logs one record per epoch, checkpoints, saves the model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from three_classes import training_experiment

from labswarm.config.experiment import parse_experiment
from labswarm.errors import ConfigError
from labswarm.pipeline.pipeline import Pipeline
from labswarm.pipeline.prefetch import PipelineError
from labswarm.train import checkpoint
from labswarm.train.checkpoint import CheckpointError
from labswarm.train.trainer import Trainer, load_model


@pytest.mark.parametrize("model", [{"name": "cnn", "input": "mel", "channels": [8, 16]},
                                   {"name": "mlp", "input": "mfcc", "hidden": [32]}])
def test_learns_held_out_sources(three_classes: Path, tmp_path: Path, model: dict) -> None:
    config = parse_experiment(training_experiment(three_classes, tmp_path / "store", model=model))
    seen = []
    result = Trainer(config, tmp_path / "home", on_epoch=seen.append).fit()
    assert [r["epoch"] for r in result.metrics] == [1, 2, 3, 4]
    assert seen == result.metrics
    final = result.final
    assert final["val_accuracy"] >= 0.9, final
    assert set(final["val_f1"]) == {"high", "low", "noise"}
    # the validation set is the held-out sources, all of them, and no training sample
    validation = Pipeline(config, split="validation", train=False)
    assert final["val_samples"] == sum(len(b) for b in validation.epoch(0))
    assert final["samples"] + final["val_samples"] == 3 * 8 * 2
    logged = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in logged] == [1, 2, 3, 4]
    assert 0.0 <= final["data_wait_share"] <= 1.0 and final["samples_per_s"] > 0


def test_model_file_is_named_by_the_configuration_and_loads(three_classes: Path, tmp_path: Path) -> None:
    config = parse_experiment(training_experiment(three_classes, tmp_path / "store"))
    result = Trainer(config, tmp_path / "home").fit()
    assert result.model_path == tmp_path / "home" / "models" / f"three-{config.fingerprint()}.pt"
    model, meta = load_model(result.model_path)
    assert meta["classes"] == ["high", "low", "noise"] and meta["input"] == "mel"
    assert meta["fingerprint"] == config.fingerprint()
    batch = next(iter(Pipeline(config, split="validation", train=False).epoch(0)))
    with torch.no_grad():
        logits = model(torch.from_numpy(batch.features["mel"]))
    assert logits.shape == (len(batch), 3)
    accuracy = float((logits.argmax(1).numpy() == batch.labels).mean())
    assert accuracy >= 0.9
    other = parse_experiment(training_experiment(three_classes, tmp_path / "store", seed=1))
    assert Trainer(other, tmp_path / "home").model_path != result.model_path


def test_resume_continues_after_the_checkpoint(three_classes: Path, tmp_path: Path) -> None:
    config = parse_experiment(training_experiment(three_classes, tmp_path / "store"))
    trainer = Trainer(config, tmp_path / "home")
    trainer.fit()
    # as if the run had died in epoch 3 after logging it: the checkpoint says 2 epochs, the log has 3
    state = checkpoint.load(trainer.checkpoint_path)
    state["epoch"] = 2
    checkpoint.save(state, trainer.checkpoint_path)
    result = Trainer(config, tmp_path / "home").fit(resume=True)
    assert result.resumed_from == 2
    assert [r["epoch"] for r in checkpoint.read_metrics(trainer.metrics_path)] == [1, 2, 3, 4]
    assert checkpoint.load(trainer.checkpoint_path)["epoch"] == 4


def test_without_a_checkpoint_resume_starts_over(three_classes: Path, tmp_path: Path) -> None:
    config = parse_experiment(training_experiment(three_classes, tmp_path / "store",
                                                  training={"epochs": 1, "validation": 0.25}))
    result = Trainer(config, tmp_path / "home").fit(resume=True)
    assert result.resumed_from == 0 and [r["epoch"] for r in result.metrics] == [1]


def test_training_needs_model_and_training_sections(three_classes: Path, tmp_path: Path) -> None:
    data = training_experiment(three_classes, tmp_path / "store")
    del data["training"]
    with pytest.raises(ConfigError, match="training"):
        Trainer(parse_experiment(data), tmp_path / "home")
    data["training"] = {"epochs": 1}
    del data["model"]
    with pytest.raises(ConfigError) as caught:
        parse_experiment(data)
    assert ("training", "Value error, training needs a `model` section (e.g. {name: cnn, input: mel})") in \
        caught.value.errors


def test_the_same_configuration_trains_the_same_model(three_classes: Path, tmp_path: Path) -> None:
    config = parse_experiment(training_experiment(three_classes, tmp_path / "store",
                                                  training={"epochs": 1, "validation": 0.25, "threads": 1}))
    first = Trainer(config, tmp_path / "a").fit()
    second = Trainer(config, tmp_path / "b").fit()
    weights = [load_model(r.model_path)[0].state_dict() for r in (first, second)]
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])
    assert first.final["train_loss"] == second.final["train_loss"]


def test_an_unreadable_store_stops_training_instead_of_training_on_nothing(three_classes: Path,
                                                                            tmp_path: Path) -> None:
    config = parse_experiment(training_experiment(three_classes, tmp_path / "store",
                                                  training={"epochs": 1, "validation": 0.25, "threads": 1}))
    Trainer(config, tmp_path / "home").fit()  # computes and stores the features
    for entry in (tmp_path / "store").rglob("*.npy"):
        entry.write_bytes(b"not an array")  # every entry corrupt: not the samples' fault
    with pytest.raises(PipelineError, match="StoreError"):
        Trainer(config, tmp_path / "home").fit()


def test_a_corrupt_checkpoint_or_model_file_is_a_checkpoint_error(tmp_path: Path) -> None:
    for content in (b"", b"not a checkpoint", b"PK\x03\x04truncated"):
        path = tmp_path / "checkpoint.pt"
        path.write_bytes(content)
        with pytest.raises(CheckpointError, match="cannot read"):
            checkpoint.load(path)
        with pytest.raises(CheckpointError):
            load_model(path)


def test_fit_leaves_the_caller_s_torch_state_alone(three_classes: Path, tmp_path: Path) -> None:
    config = parse_experiment(training_experiment(three_classes, tmp_path / "store",
                                                  training={"epochs": 1, "validation": 0.25, "threads": 1}))
    threads = torch.get_num_threads()
    torch.manual_seed(1234)
    expected = torch.rand(3)
    torch.manual_seed(1234)
    Trainer(config, tmp_path / "home").fit()
    assert torch.equal(torch.rand(3), expected)
    assert torch.get_num_threads() == threads
