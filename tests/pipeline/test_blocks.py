from __future__ import annotations

import pickle
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from helpers import experiment_dict

from labswarm.config.experiment import ExperimentConfig, parse_experiment
from labswarm.errors import ConfigError, SampleError
from labswarm.pipeline import SKIPPED, Block, Context, Pipeline, chain
from labswarm.pipeline.blocks import Batch, Batcher, Features, Item, Prefetch, Shuffle, Source
from labswarm.sample import iter_samples

SPECS = [
    {"name": "source", "limit": 3},
    {"name": "shuffle", "buffer": 5},
    {"name": "features", "outputs": ["mel"], "compute_missing": False},
    {"name": "batch", "size": 3, "frames": 40, "drop_last": True},
    {"name": "prefetch", "producers": 1, "depth": 2, "memory_limit_mb": 100.0, "check_interval": 0.1,
     "grace": 1.0, "start_method": "spawn", "threads": 2},
]


def _context(config: ExperimentConfig, **changes: Any) -> Context:
    return Context(experiment=config, classes=("high", "low"), **changes)


def _batches(config: ExperimentConfig, *blocks: dict, train: bool = False) -> list[Batch]:
    pipeline = Pipeline(config, split="all", train=train, blocks=[{"name": "source"}, {"name": "features"}, *blocks])
    assert pipeline.prefetch.producers == 0  # no prefetch block: in process
    return list(pipeline.epoch(0))


# spec, pickle and YAML round trips


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s["name"])
def test_spec_round_trip(spec: dict) -> None:
    block = Block.from_spec(spec)
    assert type(block).name == spec["name"]
    assert block.spec() == {**block.config_model(name=spec["name"]).model_dump(mode="json"), **spec}
    again = Block.from_spec(block.spec())
    assert type(again) is type(block) and again.config == block.config


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s["name"])
def test_pickle_round_trip(spec: dict) -> None:
    block = Block.from_spec(spec)
    again = pickle.loads(pickle.dumps(block))
    assert type(again) is type(block) and again.spec() == block.spec()


def test_features_block_pickles_without_its_compute_state(tones: ExperimentConfig) -> None:
    block = Features()
    items = list(block(iter(iter_samples(tones)), _context(tones)))  # the block now holds a FeaturesBlock
    again = pickle.loads(pickle.dumps(block))
    assert again._compute is None and again.spec() == block.spec()
    fresh = next(again(iter(iter_samples(tones)), _context(tones)))
    np.testing.assert_array_equal(fresh.features["mel"], items[0].features["mel"])


def test_pipeline_section_round_trips_through_yaml(tmp_path: Path) -> None:
    pipeline = [*SPECS[:4], {"name": "prefetch", "producers": 3, "memory_limit_mb": 512}]
    data = experiment_dict(tmp_path / "data", tmp_path / "store", pipeline=pipeline)
    config = parse_experiment(data)
    assert [b.name for b in config.pipeline] == ["source", "shuffle", "features", "batch", "prefetch"]
    text = yaml.safe_dump(config.model_dump(mode="json"))
    again = parse_experiment(text)
    assert again == config
    assert again.pipeline[3].frames == 40 and again.pipeline[4].memory_limit_mb == 512


def test_default_pipeline_is_valid(tmp_path: Path) -> None:
    config = parse_experiment(experiment_dict(tmp_path, tmp_path / "store"))
    assert [b.name for b in config.pipeline] == ["source", "shuffle", "features", "batch", "prefetch"]


# configuration errors


@pytest.mark.parametrize(
    "pipeline,path,reason",
    [
        ([{"name": "source"}, {"name": "sparkle"}, {"name": "features"}, {"name": "batch"}], "pipeline.1.name",
         "unknown pipeline block 'sparkle'; known: batch, features, prefetch, shuffle, source"),
        ([{"name": "source"}, {"name": "features"}, {"name": "batch", "size": 0}], "pipeline.2.size",
         "greater than or equal to 1"),
        ([{"name": "features"}, {"name": "source"}, {"name": "batch"}], "pipeline", "first block must be a `source`"),
        ([{"name": "source"}, {"name": "features"}, {"name": "prefetch"}, {"name": "batch"}], "pipeline",
         "`prefetch` can only be the last block"),
        ([{"name": "source"}, {"name": "features"}], "pipeline", "a `batch` block is missing"),
        ([{"name": "source"}, {"name": "batch"}], "pipeline", "a `features` block is missing"),
        ([{"name": "source"}, {"name": "features"}, {"name": "batch"}, {"name": "batch"}], "pipeline",
         "item 3 repeats the `batch` block of item 2"),
        ([], "pipeline", "first block must be a `source`"),
    ],
)
def test_invalid_pipeline_is_named(tmp_path: Path, pipeline: list, path: str, reason: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_experiment(experiment_dict(tmp_path, tmp_path / "store", pipeline=pipeline))
    errors = dict(info.value.errors)
    assert path in errors, errors
    assert reason in errors[path]


def test_from_spec_errors_name_the_known_blocks() -> None:
    with pytest.raises(ConfigError, match="unknown pipeline block 'sparkle'; known: batch, features, prefetch"):
        Block.from_spec({"name": "sparkle"})
    with pytest.raises(ConfigError) as info:
        Block.from_spec({"name": "shuffle", "buffer": 0})
    assert list(dict(info.value.errors)) == ["buffer"]


# shuffle


def test_shuffle_is_a_seeded_permutation_per_epoch(tones: ExperimentConfig) -> None:
    block = Shuffle.from_spec({"name": "shuffle", "buffer": 7})
    ctx = _context(tones)
    first = list(block(iter(range(50)), ctx))
    assert sorted(first) == list(range(50)) and first != list(range(50))
    assert list(block(iter(range(50)), ctx)) == first  # same context, same order
    assert list(pickle.loads(pickle.dumps(block))(iter(range(50)), ctx)) == first
    second = list(block(iter(range(50)), ctx.with_(epoch=1)))
    assert sorted(second) == list(range(50)) and second != first
    assert list(block(iter(range(50)), ctx.with_(producer=1, producers=2))) != first  # another shard's seed
    assert list(block(iter(range(50)), ctx.with_(train=False))) == list(range(50))


def test_shuffle_with_a_large_buffer_and_an_empty_input(tones: ExperimentConfig) -> None:
    block = Shuffle.from_spec({"name": "shuffle", "buffer": 1000})
    out = list(block(iter(range(20)), _context(tones)))
    assert sorted(out) == list(range(20)) and out != list(range(20))
    assert list(block(iter(()), _context(tones))) == []


# source


def test_source_shards_are_disjoint_and_cover_the_split(tones: ExperimentConfig) -> None:
    every = [s.id for s in iter_samples(tones)]
    ctx = _context(tones)
    shards = [[s.id for s in Source()(None, ctx.with_(producer=k, producers=3))] for k in range(3)]
    assert sorted(i for shard in shards for i in shard) == sorted(every) and all(shards)
    assert [s.id for s in Source.from_spec({"name": "source", "limit": 5})(None, ctx)] == every[:5]


# batch


def test_batch_shapes_labels_and_drop_last(tones: ExperimentConfig) -> None:
    samples = list(iter_samples(tones))
    batches = _batches(tones, {"name": "batch", "size": 3, "frames": 50})
    assert [len(b) for b in batches] == [3, 3, 3, 3, 3, 1]
    for batch in batches:
        assert batch.features["mel"].shape == (len(batch), 32, 50)
        assert batch.features["mfcc"].shape == (len(batch), 13, 50)
        assert all(a.dtype == np.float32 for a in batch.features.values())
        assert batch.labels.dtype == np.int64 and batch.failed == []
    assert [i for b in batches for i in b.ids] == [s.id for s in samples]
    labels = {s.id: ("high", "low").index(s.label) for s in samples}
    assert [int(x) for b in batches for x in b.labels] == [labels[i] for b in batches for i in b.ids]
    assert set(labels.values()) == {0, 1}
    dropped = _batches(tones, {"name": "batch", "size": 3, "frames": 50, "drop_last": True})
    assert [len(b) for b in dropped] == [3] * 5


def test_batch_pads_with_the_minimum_and_crops(tones: ExperimentConfig) -> None:
    item = next(Features()(iter(iter_samples(tones)), _context(tones)))
    raw = item.features["mel"]
    n = raw.shape[-1]
    padded = _batches(tones, {"name": "batch", "size": 1, "frames": n + 20})[0].features["mel"][0]
    np.testing.assert_array_equal(padded[:, :n], raw)
    np.testing.assert_array_equal(padded[:, n:], np.full((raw.shape[0], 20), raw.min(), np.float32))
    centred = _batches(tones, {"name": "batch", "size": 1, "frames": 40})[0].features["mel"][0]
    start = (n - 40) // 2
    np.testing.assert_array_equal(centred, raw[:, start:start + 40])
    # training mode: a random window of the array, drawn from the context (the same on a second run)
    windows = [_batches(tones, {"name": "batch", "size": 1, "frames": 40}, train=True)[0].features["mel"][0]
               for _ in range(2)]
    np.testing.assert_array_equal(windows[0], windows[1])
    assert any(np.array_equal(windows[0], raw[:, s:s + 40]) for s in range(n - 39))
    # no frames: padded to the longest in the batch (all equal here)
    assert _batches(tones, {"name": "batch", "size": 2})[0].features["mel"].shape == (2, 32, n)


class _CountingItem:
    """An item whose features are counted, and fail when ``fail`` is set."""

    loads = 0

    def __init__(self, sample: Any, label: int, fail: bool = False) -> None:
        self.sample, self.label, self.fail = sample, label, fail

    @property
    def features(self) -> dict[str, np.ndarray]:
        type(self).loads += 1
        if self.fail:
            raise SampleError(f"{self.sample.id}: cannot be read")
        return {"mel": np.full((4, 6), self.label, np.float32)}


def test_batch_skips_without_reading_features(tones: ExperimentConfig) -> None:
    samples = list(iter_samples(tones))[:7]
    items = [_CountingItem(s, i % 2, fail=i < 4) for i, s in enumerate(samples)]  # the skipped ones would fail
    _CountingItem.loads = 0
    out = list(Batcher.from_spec({"name": "batch", "size": 2})(iter(items), _context(tones, skip=2)))
    assert out[:2] == [SKIPPED, SKIPPED]
    assert [b.ids for b in out[2:]] == [[samples[4].id, samples[5].id], [samples[6].id]]
    assert _CountingItem.loads == 3  # only the items of the batches yielded
    assert repr(SKIPPED) == "SKIPPED" and pickle.loads(pickle.dumps(SKIPPED)) is SKIPPED
    # every batch skipped, even the last short one
    everything = list(Batcher.from_spec({"name": "batch", "size": 2})(iter(items), _context(tones, skip=4)))
    assert everything == [SKIPPED] * 4 and _CountingItem.loads == 3


def test_failed_items_are_dropped_and_reported(tones: ExperimentConfig) -> None:
    samples = list(iter_samples(tones))[:3]
    items = [_CountingItem(s, 1, fail=i == 1) for i, s in enumerate(samples)]
    batch, = Batcher.from_spec({"name": "batch", "size": 3})(iter(items), _context(tones))
    assert batch.ids == [samples[0].id, samples[2].id] and batch.labels.tolist() == [1, 1]
    assert batch.features["mel"].shape == (2, 4, 6)
    assert batch.failed == [(samples[1].id, f"SampleError: {samples[1].id}: cannot be read")]
    empty, = Batcher.from_spec({"name": "batch", "size": 3})(iter(items[1:2]), _context(tones))
    assert len(empty) == 0 and empty.features == {} and empty.labels.shape == (0,) and len(empty.failed) == 1


def test_corrupt_audio_fails_its_samples_and_the_epoch_goes_on(fresh_tones: ExperimentConfig) -> None:
    config = fresh_tones
    bad = next(iter(iter_samples(config)))
    Path(bad.path).write_bytes(b"definitely not a wav file" * 200)
    batches = _batches(config, {"name": "batch", "size": 3})
    failed = dict(f for b in batches for f in b.failed)
    bad_ids = {s.id for s in iter_samples(config) if s.path == bad.path}
    assert set(failed) == bad_ids and len(bad_ids) == 2
    assert all(reason.startswith("AudioError") and bad.path in reason for reason in failed.values())
    assert sorted(i for b in batches for i in b.ids) == sorted(s.id for s in iter_samples(config)
                                                               if s.id not in bad_ids)


def test_features_block_reads_the_store_only_when_told(tmp_path: Path, tones: ExperimentConfig) -> None:
    config = tones.model_copy(update={"store": tones.store.model_copy(update={"root": str(tmp_path / "empty")})})
    strict = Block.from_spec({"name": "features", "outputs": ["mfcc"], "compute_missing": False})
    item = next(strict(iter(iter_samples(config)), _context(config)))
    with pytest.raises(SampleError, match=r"features \['mfcc'\] are not in the store"):
        item.features  # noqa: B018
    shutil.copytree(tones.store.root, tmp_path / "empty", dirs_exist_ok=True)
    item = next(strict(iter(iter_samples(config)), _context(config)))
    assert list(item.features) == ["mfcc"]
    unknown = Block.from_spec({"name": "features", "outputs": ["chroma"]})
    with pytest.raises(Exception, match="unknown output"):
        next(unknown(iter(iter_samples(config)), _context(config)))


def test_items_pickle_with_their_features(tones: ExperimentConfig) -> None:
    item = next(Features()(iter(iter_samples(tones)), _context(tones)))
    again = pickle.loads(pickle.dumps(item))
    assert isinstance(again, Item) and again.sample == item.sample and again.label == item.label
    np.testing.assert_array_equal(again.features["mfcc"], item.features["mfcc"])


def test_chain_and_prefetch_pass_through(tones: ExperimentConfig) -> None:
    blocks = [Source(), Prefetch()]
    assert [s.id for s in chain(blocks, _context(tones))] == [s.id for s in iter_samples(tones)]
    with pytest.raises(ValueError, match="empty chain"):
        chain([], _context(tones))


def test_batch_crops_every_feature_of_a_sample_at_one_position(tones: ExperimentConfig) -> None:
    item = next(Features()(iter(iter_samples(tones)), _context(tones)))
    mel, mfcc = item.features["mel"], item.features["mfcc"]
    assert mel.shape[-1] == mfcc.shape[-1]  # one hop length: one frame rate
    batch = _batches(tones, {"name": "batch", "size": 1, "frames": 20}, train=True)[0]
    starts = [next(s for s in range(mel.shape[-1] - 19) if np.array_equal(batch.features[name][0], raw[:, s:s + 20]))
              for name, raw in (("mel", mel), ("mfcc", mfcc))]
    assert starts[0] == starts[1]


def test_eval_frames_none_keeps_whole_clips_in_evaluation(tones: ExperimentConfig) -> None:
    n = next(Features()(iter(iter_samples(tones)), _context(tones))).features["mel"].shape[-1]
    spec = {"name": "batch", "size": 2, "frames": 20, "eval_frames": None}
    assert _batches(tones, spec, train=True)[0].features["mel"].shape == (2, 32, 20)
    assert _batches(tones, spec)[0].features["mel"].shape == (2, 32, n)
    assert _batches(tones, {**spec, "eval_frames": 30})[0].features["mel"].shape == (2, 32, 30)


def test_training_shards_mix_transformations_and_change_every_epoch(tones: ExperimentConfig) -> None:
    ctx = _context(tones, train=True, producers=2)

    def transformations(shard_ctx: Context) -> set[str]:
        return {s.id.rsplit("#", 1)[1] for s in Source()(None, shard_ctx)}

    # tones has 2 transformations and 2 shards: `index mod shards` gave each shard one transformation only
    assert transformations(ctx.with_(producer=0)) == transformations(ctx.with_(producer=1)) == {"0", "1"}
    every = sorted(s.id for s in Source()(None, _context(tones)))
    for epoch in (0, 1):
        shards = [[s.id for s in Source()(None, ctx.with_(producer=k, epoch=epoch))] for k in range(2)]
        assert sorted(shards[0] + shards[1]) == every and abs(len(shards[0]) - len(shards[1])) <= 1
    first = [s.id for s in Source()(None, ctx.with_(producer=0, epoch=0))]
    assert first != [s.id for s in Source()(None, ctx.with_(producer=0, epoch=1))]
    assert first == [s.id for s in Source()(None, ctx.with_(producer=0, epoch=0))]
