from __future__ import annotations

import json
from collections import Counter

from labswarm.config.experiment import ExperimentConfig
from labswarm.pipeline import Pipeline, Prefetcher
from labswarm.pipeline.blocks import Batch
from labswarm.sample import iter_samples

SECTION = [
    {"name": "source"},
    {"name": "shuffle", "buffer": 100},
    {"name": "features", "outputs": ["mel"]},
    {"name": "batch", "size": 3, "frames": 30},
    {"name": "prefetch", "producers": 2, "depth": 2},
]


def _experiment(tones: ExperimentConfig, pipeline: list[dict] = SECTION) -> ExperimentConfig:
    return ExperimentConfig.model_validate({**tones.model_dump(mode="json"), "pipeline": pipeline})


def _ids(batches: Prefetcher) -> list[str]:
    with batches:
        return [i for batch in batches for i in batch.ids]


def test_runs_the_experiment_s_pipeline_section(tones: ExperimentConfig) -> None:
    config = _experiment(tones)
    pipeline = Pipeline(config, split="all")
    assert pipeline.classes == ("high", "low") and pipeline.context.train is False
    assert pipeline.prefetch.producers == 2 and [b.name for b in pipeline.blocks] == [
        "source", "shuffle", "features", "batch"]
    assert pipeline.specs() == [b.model_dump(mode="json") for b in config.pipeline]
    assert Pipeline(config, split="all", blocks=pipeline.specs()).specs() == pipeline.specs()
    with pipeline.epoch(0) as batches:
        got = list(batches)
    assert all(isinstance(b, Batch) and set(b.features) == {"mel"} for b in got)
    assert got[0].features["mel"].shape == (3, 32, 30)
    assert Counter(i for b in got for i in b.ids) == Counter(s.id for s in iter_samples(config))


def test_splits_by_source_and_shuffles_training_only(tones: ExperimentConfig) -> None:
    config = _experiment(tones)
    train = Pipeline(config, split="train", validation=0.25)
    validation = Pipeline(config, split="validation", validation=0.25)
    assert train.context.train and not validation.context.train
    sources = {s.id: s.source for s in iter_samples(config)}
    train_ids, validation_ids = _ids(train.epoch(0)), _ids(validation.epoch(0))
    assert {sources[i] for i in train_ids}.isdisjoint({sources[i] for i in validation_ids})
    assert len({sources[i] for i in validation_ids}) == 2  # one of the 4 sources of each of the 2 labels
    assert sorted(train_ids + validation_ids) == sorted(sources)
    again, other = _ids(train.epoch(0)), _ids(train.epoch(1))
    assert again == train_ids and sorted(other) == sorted(train_ids) and other != train_ids
    assert _ids(validation.epoch(1)) == validation_ids  # evaluation: the same order every epoch


def test_an_epoch_resumes_from_its_state(tones: ExperimentConfig) -> None:
    pipeline = Pipeline(_experiment(tones), split="train", validation=0.0)
    whole = _ids(pipeline.epoch(2))
    with pipeline.epoch(2) as batches:
        head = [i for _ in range(2) for i in next(batches).ids]
        state = batches.state_dict()
    assert head + _ids(pipeline.epoch(2, state)) == whole


def test_without_a_prefetch_block_the_chain_runs_in_process(tones: ExperimentConfig) -> None:
    section = SECTION[:-1]
    pipeline = Pipeline(_experiment(tones, section), split="all")
    assert pipeline.prefetch.producers == 0
    batches = pipeline.epoch(0)
    assert batches.in_process
    assert _ids(batches) == [s.id for s in iter_samples(tones)]  # evaluation mode: dataset order
    assert [s["name"] for s in pipeline.specs()] == ["source", "shuffle", "features", "batch", "prefetch"]
    assert pipeline.specs()[-1]["producers"] == 0


def test_state_dict_and_load_state_dict_resume_an_epoch_in_a_new_pipeline(tones: ExperimentConfig) -> None:
    blocks = [{"name": "source"}, {"name": "shuffle"}, {"name": "features"}, {"name": "batch", "size": 2},
              {"name": "prefetch", "producers": 2}]
    first = Pipeline(tones, split="all", train=True, blocks=blocks)
    whole = _ids(first.epoch(1))
    assert first.state_dict()["prefetch"]["delivered"] == [4, 4]  # 16 samples, 8 batches, 2 producers
    with first.epoch(1) as batches:
        head = [i for _, batch in zip(range(3), batches, strict=False) for i in batch.ids]
    state = json.loads(json.dumps(first.state_dict()))  # as a checkpoint would store it
    second = Pipeline(tones, split="all", train=True, blocks=blocks)
    second.load_state_dict(state)
    assert head + _ids(second.epoch(1)) == whole
    assert _ids(second.epoch(1)) == whole  # the state was used once
