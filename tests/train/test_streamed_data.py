"""The distributed mode's training inputs streamed from the store (issue 24 item 1): the same crops as the
single-process StoreDataset and as the in-memory mode, with nothing kept in memory."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import numpy as np
import pytest
import yaml
from helpers import require
from three_classes import LEARNER_PIPELINE, training_experiment, write_learner_experiment

from labswarm.config.experiment import parse_experiment
from labswarm.errors import ConfigError
from labswarm.pipeline.pipeline import Pipeline

torch = require("torch")  # skips here, fails in CI (tests/helpers.py)

from test_distributed import (  # noqa: E402
    test_allreduce_learners_halted_mid_epoch_resume_the_pass_train_each_sample_once_and_stay_equal as _exactly_once,
)

from labswarm.pipeline.torch_data import StoreDataset  # noqa: E402 (imports torch)
from labswarm.train.distributed.data import (  # noqa: E402
    KEEP_BYTES,
    KEEP_BYTES_ENV,
    TrainingSamples,
    keep_bytes_default,
)


def test_streamed_crops_are_the_single_process_crops_and_nothing_is_kept(three_classes: Path, tmp_path: Path) -> None:
    config = parse_experiment(training_experiment(three_classes, tmp_path / "store", pipeline=LEARNER_PIPELINE))
    kept = TrainingSamples(config, Pipeline(config, split="train"), "mel")
    streamed = TrainingSamples(config, Pipeline(config, split="train"), "mel", keep_bytes=0)
    assert streamed.load() == kept.load() == list(range(36))
    assert streamed.streaming and not kept.streaming
    assert streamed.nbytes == 0 and kept.nbytes > 0
    reference = StoreDataset(config, "train", "mel", frames=24, random_crop=True)
    order = np.random.default_rng(3).permutation(36).tolist()
    for epoch in (0, 2):
        reference.set_epoch(epoch)
        for chunk in (order[:7], order[7:20], order[20:]):
            x, y = streamed.batch(epoch, chunk)
            assert torch.equal(x, kept.batch(epoch, chunk)[0]), (epoch, chunk)
            for row, j in enumerate(chunk):
                rx, ry = reference[j]
                assert torch.equal(x[row], rx) and int(y[row]) == int(ry), (epoch, j)


def retained_by_load(samples: TrainingSamples) -> int:
    """Bytes that ``samples.load()`` allocates and keeps (Python and numpy allocations, tracemalloc)."""
    tracemalloc.start()
    try:
        samples.load()
        return tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()


def test_streaming_starts_when_the_budget_is_exceeded_and_keeps_nothing(three_classes: Path, tmp_path: Path) -> None:
    config = parse_experiment(training_experiment(three_classes, tmp_path / "store", pipeline=LEARNER_PIPELINE))
    whole = TrainingSamples(config, Pipeline(config, split="train"), "mel")
    kept_bytes = retained_by_load(whole)
    per_sample = whole.nbytes // 36
    samples = TrainingSamples(config, Pipeline(config, split="train"), "mel", keep_bytes=10 * per_sample)
    streamed_bytes = retained_by_load(samples)
    assert samples.streaming and samples.nbytes == 0 and not whole.streaming
    assert kept_bytes > whole.nbytes and streamed_bytes < kept_bytes / 3, (streamed_bytes, kept_bytes)
    for epoch in range(2):
        assert torch.equal(samples.batch(epoch, range(36))[0], whole.batch(epoch, range(36))[0])


@pytest.mark.slow
def test_halted_learners_train_each_sample_exactly_once_when_streaming(three_classes: Path, tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """tests/train/test_distributed.py's halt-and-resume test (real learner processes, exactly once across a
    halt, learners equal) with every learner streaming its features (the experiment's training.keep_bytes: 0),
    each step's chunk claimed and read one step ahead (steps.py): the halt gives the chunk held ahead back."""
    import test_distributed

    def streaming(root: Path, tmp: Path, epochs: int) -> tuple[dict, Path, Path]:
        data, experiment, home = write_learner_experiment(root, tmp, epochs)
        data["training"] = {**data["training"], "keep_bytes": 0}
        experiment.write_text(yaml.safe_dump(data))
        return data, experiment, home

    # the setting reaches the learners and wins: the variable, invalid here, is not read (it would fail them)
    monkeypatch.setenv(KEEP_BYTES_ENV, "not-a-number")
    monkeypatch.setattr(test_distributed, "write_learner_experiment", streaming)
    _exactly_once(three_classes, tmp_path)


def test_the_budget_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(KEEP_BYTES_ENV, raising=False)
    assert keep_bytes_default() == KEEP_BYTES
    monkeypatch.setenv(KEEP_BYTES_ENV, "0")
    assert keep_bytes_default() == 0
    for bad in ("-1", "1GB"):
        monkeypatch.setenv(KEEP_BYTES_ENV, bad)
        with pytest.raises(ConfigError, match=KEEP_BYTES_ENV):
            keep_bytes_default()
