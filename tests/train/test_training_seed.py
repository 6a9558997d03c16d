"""``training.seed`` (issue 23): it seeds what training draws (each epoch's sample order, the random crops, the
initial weights) and not the features, whose store keys follow the experiment's ``seed``; unset, training draws
exactly what it drew before the field existed (the experiment's seed).

One scenario through the trainer's own path (``Trainer.fit`` with the one-learner hooks of ``labswarm train`` and
a job: :class:`~labswarm.train.distributed.single.SingleLearner`), stopped by a hook before the first step: the
initial weights are the optimizer's parameters then, and the first epoch's batches (labels and crops, in order) are
read from the attached hooks. The experiment has a random transformation (``add_noise``), so each sample's feature
key holds its seed and another experiment seed would store new features."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from helpers import require
from three_classes import training_experiment, write_three_classes

from labswarm.config.experiment import parse_experiment
from labswarm.pipeline.features import FeaturesBlock
from labswarm.sample import iter_samples

torch = require("torch")  # skips here, fails in CI (tests/helpers.py)

from labswarm.train.distributed.single import SingleLearner  # noqa: E402 (after the torch check)
from labswarm.train.trainer import Trainer, TrainerHooks  # noqa: E402


class _Stop(Exception):
    """Raised by :class:`_Initial` to end the fit before its first step."""


class _Initial(TrainerHooks):
    """Keeps the parameters the first epoch starts from, then stops the fit."""

    weights: list[Any]

    def before_epoch(self, trainer: Trainer, epoch: int, optimizer: Any, schedule: Any) -> None:
        self.weights = [p.detach().clone() for p in optimizer.param_groups[0]["params"]]
        raise _Stop


def _store_files(store: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(store)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in sorted(store.rglob("*")) if p.is_file()}


def _draws(data: dict[str, Any], seed: int | None, home: Path) -> tuple[list[Any], list[Any], list[Any]]:
    """The initial weights and the first epoch's labels and crops, step by step, with ``training.seed: seed``."""
    training = {**data["training"], **({} if seed is None else {"seed": seed})}
    config = parse_experiment({**data, "training": training})
    hooks, initial = SingleLearner(), _Initial()
    trainer = Trainer(config, home, hooks=[initial], distributed=hooks)
    try:
        trainer.fit()
    except _Stop:
        pass
    else:
        raise AssertionError("the fit did not reach its first epoch")
    labels, crops = [], []
    with hooks.epoch(torch, 0, torch.device("cpu")) as steps:
        while (batch := steps.before_step(False)) is not None:
            crops.append(batch[0].clone())
            labels.append(batch[1].tolist())
    return initial.weights, labels, crops


def _same(a: list[Any], b: list[Any]) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


@pytest.mark.slow  # 6.8-8.7 s loaded: over CI's 10-s line at CI load
def test_the_training_seed_draws_the_order_crops_and_weights_and_leaves_the_features(tmp_path: Path) -> None:
    root = write_three_classes(tmp_path / "data", per_class=4)
    data = training_experiment(root, tmp_path / "store", seed=3,
                               transformations=[{"name": "identity"}, {"name": "add_noise", "snr_db": 20.0}],
                               training={"epochs": 1, "validation": 0.25, "threads": 1})
    data["pipeline"][3] = {"name": "batch", "size": 4, "frames": 8}
    config = parse_experiment(data)
    block = FeaturesBlock(config)
    for sample in iter_samples(config):
        block.process(sample)
    stored = _store_files(tmp_path / "store")
    assert stored

    default = _draws(data, None, tmp_path / "home")
    derived = _draws(data, 3, tmp_path / "home")  # the experiment's seed, given as the training seed
    seven, seven_again, eight = (_draws(data, s, tmp_path / "home") for s in (7, 7, 8))

    for same in (derived, seven_again):  # unset = the experiment's seed; a seed twice = the same draws
        other = default if same is derived else seven
        assert _same(same[0], other[0]) and same[1] == other[1] and _same(same[2], other[2])
    for a, b in ((seven, eight), (default, seven)):  # another seed: other weights, order and crops
        assert not _same(a[0], b[0])
        assert a[1] != b[1]
        assert not _same(a[2], b[2])
    assert sorted(y for step in seven[1] for y in step) == sorted(y for step in eight[1] for y in step)
    assert _store_files(tmp_path / "store") == stored  # no feature computed or rewritten: the same keys

    assert "seed" not in config.model_dump(mode="json")["training"]  # unset: the fingerprint of before the field
    assert parse_experiment({**data, "seed": 4}).training_seed == 4
