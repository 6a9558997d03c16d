from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import experiment_dict
from torch.utils.data import DataLoader

from labswarm.config.experiment import parse_experiment
from labswarm.errors import ConfigError
from labswarm.pipeline import Pipeline
from labswarm.pipeline.features import FeaturesBlock
from labswarm.pipeline.torch_data import PipelineIterableDataset, StoreDataset
from labswarm.sample import iter_samples

BLOCKS = [
    {"name": "source"},
    {"name": "shuffle", "buffer": 100},
    {"name": "features", "outputs": ["mel"]},
    {"name": "batch", "size": 3, "frames": 40},
    {"name": "prefetch", "producers": 2, "depth": 2},
]


@pytest.fixture
def experiment(tone_dataset: Path, tmp_path: Path):
    """4 tones (2 labels × 2 sources) × 2 transformations = 8 samples of 2 s; mel (32 bands) and MFCC."""
    return parse_experiment(experiment_dict(tone_dataset, tmp_path / "store"))


def _planted(experiment, sample, frames: int = 50) -> np.ndarray:
    """Put a recognisable mel array for ``sample`` into the store (as if a worker had computed it)."""
    block = FeaturesBlock(experiment)
    array = np.arange(32 * frames, dtype=np.float32).reshape(32, frames) - 1000.0
    block.store.put(block.keys(sample)["mel"], array)
    return array


def test_store_dataset_item_is_the_stores_array(experiment) -> None:
    ds = StoreDataset(experiment, split="all", output="mel")
    samples = list(iter_samples(experiment))
    assert len(ds) == len(samples) == 8 and [s.id for s in ds.samples] == [s.id for s in samples]
    planted = _planted(experiment, samples[3])
    x, y = ds[3]
    assert x.dtype == torch.float32 and x.shape == (32, 50)
    np.testing.assert_array_equal(x.numpy(), planted)  # read from the store, not recomputed
    assert y.dtype == torch.int64 and y.ndim == 0 and ds.classes[int(y)] == samples[3].label
    assert ds[-5][0].shape == x.shape  # negative indices as for a list
    with pytest.raises(IndexError):
        ds[8]


def test_store_dataset_computes_and_stores_missing_features(experiment) -> None:
    ds = StoreDataset(experiment, split="all", output="mfcc")
    block = FeaturesBlock(experiment)
    sample = ds.samples[1]
    key = block.keys(sample)["mfcc"]
    assert not block.store.contains(key)
    x, _ = ds[1]
    assert block.store.contains(key)  # stored, so the next epoch reads it
    np.testing.assert_allclose(x.numpy(), block.compute(sample, {"mfcc"})["mfcc"], rtol=1e-5, atol=1e-4)
    assert x.shape[0] == 13


def test_store_dataset_crops_centred_and_pads_with_the_minimum(experiment) -> None:
    sample = next(iter(iter_samples(experiment)))
    planted = _planted(experiment, sample)
    cropped, _ = StoreDataset(experiment, split="all", frames=20)[0]
    np.testing.assert_array_equal(cropped.numpy(), planted[:, 15:35])
    padded, _ = StoreDataset(experiment, split="all", frames=60)[0]
    np.testing.assert_array_equal(padded.numpy()[:, :50], planted)
    assert (padded.numpy()[:, 50:] == planted.min()).all()


def test_store_dataset_random_crop_is_seeded_by_epoch_and_index(experiment) -> None:
    sample = next(iter(iter_samples(experiment)))
    planted = _planted(experiment, sample, frames=400)

    def starts(epoch: int) -> list[int]:
        ds = StoreDataset(experiment, split="all", frames=10, random_crop=True)
        ds.set_epoch(epoch)
        return [int(ds[0][0][0, 0] - planted[0, 0]) for _ in range(3)]

    first = starts(0)
    assert first == starts(0) and len(set(first)) == 1  # same epoch, same crop, in any process
    assert all(0 <= s <= 390 for s in first)
    assert {starts(e)[0] for e in range(1, 6)} != {first[0]}  # a new crop per epoch


def test_store_dataset_splits_by_source(experiment) -> None:
    train = StoreDataset(experiment, split="train", validation=0.5)
    held = StoreDataset(experiment, split="validation", validation=0.5)
    every = StoreDataset(experiment, split="all")
    assert len(train) == len(held) == 4
    assert sorted(s.id for s in train.samples + held.samples) == sorted(s.id for s in every.samples)
    assert not {s.source for s in train.samples} & {s.source for s in held.samples}


def test_store_dataset_rejects_an_unknown_output(experiment) -> None:
    with pytest.raises(ConfigError, match="cqt"):
        StoreDataset(experiment, output="cqt")


def test_store_dataset_with_dataloader_workers(experiment) -> None:
    ds = StoreDataset(experiment, split="all", output="mel", frames=40)
    loader = DataLoader(ds, batch_size=3, shuffle=True, num_workers=2, generator=torch.Generator().manual_seed(0))
    batches = list(loader)
    assert [len(b[1]) for b in batches] == [3, 3, 2]
    x, y = batches[0]
    assert x.dtype == torch.float32 and x.shape == (3, 32, 40) and y.dtype == torch.int64
    assert sorted(int(v) for b in batches for v in b[1]) == sorted(ds.labels)


def test_iterable_dataset_with_two_workers_yields_every_sample_once(experiment) -> None:
    pipeline = Pipeline(experiment, split="all", blocks=BLOCKS)
    ds = PipelineIterableDataset(pipeline, epoch=0)
    for epoch in (0, 1):
        ds.set_epoch(epoch)
        batches = list(DataLoader(ds, batch_size=None, num_workers=2))
        ids = Counter(i for b in batches for i in b.ids)
        assert ids == Counter(s.id for s in iter_samples(experiment))  # every sample exactly once
        first = batches[0]
        assert isinstance(first.features["mel"], torch.Tensor)
        assert first.features["mel"].dtype == torch.float32 and first.features["mel"].shape == (3, 32, 40)
        assert first.labels.dtype == torch.int64 and first.labels.shape == (3,)
        index = {label: i for i, label in enumerate(pipeline.classes)}
        by_id = {s.id: index[s.label] for s in iter_samples(experiment)}
        assert all(int(label) == by_id[i] for b in batches for i, label in zip(b.ids, b.labels, strict=True))


def test_iterable_dataset_order_is_the_prefetchers(experiment) -> None:
    pipeline = Pipeline(experiment, split="all", blocks=BLOCKS)
    with pipeline.epoch(1) as batches:
        labswarm = [b.ids for b in batches]
    torch_order = [b.ids for b in DataLoader(PipelineIterableDataset(pipeline, epoch=1), batch_size=None,
                                             num_workers=2)]
    assert torch_order == labswarm
    # in one process the chain runs as a single producer: the same samples, a different order
    alone = list(PipelineIterableDataset(pipeline, epoch=1, tensors=False))
    assert isinstance(alone[0].features["mel"], np.ndarray)
    assert sorted(i for b in alone for i in b.ids) == sorted(i for ids in labswarm for i in ids)
