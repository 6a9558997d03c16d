"""A worker process warms up an experiment's transformations and features once (:func:`labswarm.queue.worker.warm_up`):
a standby worker warmed it before its session, and the worker it becomes does not run the same warm-up again
(issue 27: ~0.2 s of CPU a worker between the session's start and its first task). The test counts the block's
warm-ups in place of running them: the real one is the audio libraries' first imports (librosa's spectrum module,
scipy.signal, numba: ~2.5 s of a fresh process at load 4, 7-8 s at load 7-10, whatever the features), which every
worker of the queue tests runs."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import experiment_dict, write_dataset

from labswarm.config.experiment import parse_experiment
from labswarm.pipeline.features import FeaturesBlock
from labswarm.queue import worker


def test_an_experiment_is_warmed_up_once_and_another_one_again(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    runs: list[list[str]] = []

    def counted(block: FeaturesBlock, seconds: float = 1.0) -> None:
        runs.append([spec.name for spec in block.config.transformations])

    monkeypatch.setattr(FeaturesBlock, "warm_up", counted)
    monkeypatch.setattr(worker, "_warmed", set())  # this test process's own, not another test's
    data = write_dataset(tmp_path / "data", n_per_label=1)
    config = parse_experiment(experiment_dict(data, tmp_path / "store"))
    worker.warm_up(config)
    # the same transformations and features under another name and store (the manager's copy of the experiment)
    worker.warm_up(parse_experiment(experiment_dict(data, tmp_path / "other", name="tones-again")))
    assert runs == [["identity", "gain"]]
    other = parse_experiment(experiment_dict(data, tmp_path / "store", transformations=[{"name": "identity"}]))
    worker.warm_up(other)  # other transformations: warmed up too
    assert runs == [["identity", "gain"], ["identity"]]
