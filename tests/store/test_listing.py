"""A remote store's keys from one listing (labswarm/store/listing.py): a worker's FeaturesBlock on s3 (moto's
server) asks no HEAD per key, before computing nor after; a local store is asked per key as before."""

from __future__ import annotations

from pathlib import Path

from helpers import experiment_dict
from jobs.conftest import S3Endpoint

from labswarm.config.experiment import parse_experiment
from labswarm.pipeline.features import FeaturesBlock
from labswarm.sample import iter_samples
from labswarm.storage.cache import CachedStorage


def _requests(block: FeaturesBlock) -> dict[str, int]:
    """Counts of the block's S3 requests by operation name, from now on (boto3's event hooks on its client)."""
    counts: dict[str, int] = {}
    storage = block.store.storage
    remote = storage.remote if isinstance(storage, CachedStorage) else storage
    remote._s3.meta.events.register(  # type: ignore[attr-defined]
        "before-call.s3", lambda model, **_: counts.__setitem__(model.name, counts.get(model.name, 0) + 1))
    return counts


def test_workers_on_s3_list_the_store_once_instead_of_a_head_per_key(tone_dataset: Path, tmp_path: Path,
                                                                     s3_endpoint: S3Endpoint) -> None:
    data = experiment_dict(tone_dataset, tmp_path / "cache")
    data["store"]["remote"] = s3_endpoint.spec(prefix="features")
    config = parse_experiment(data)
    samples = list(iter_samples(config))[:4]
    worker = FeaturesBlock(config)
    counts = _requests(worker)
    results = [worker.process(s) for s in samples]
    assert [r.status for r in results] == ["computed"] * len(samples)
    # one listing, a put per array, no HEAD
    assert counts == {"ListObjectsV2": 1, "PutObject": 2 * len(samples)}, counts
    assert all(worker.is_cached(s) for s in samples) and worker.present.listings == 1  # its own puts are known
    # another worker (a fresh process) finds every sample cached from one listing
    other = FeaturesBlock(config)
    counts = _requests(other)
    assert [other.process(s).status for s in samples] == ["cached"] * len(samples)
    assert counts == {"ListObjectsV2": 1}, counts
    # an array written after the listing reads as missing, except to a strict question (one HEAD)
    late = FeaturesBlock(config)
    late.present.contains("0" * 40)  # its listing, before the arrays below exist
    fresh = list(iter_samples(config))[4]
    assert worker.process(fresh).status == "computed"
    counts = _requests(late)
    assert not late.is_cached(fresh) and counts == {}
    assert late.is_cached(fresh, strict=True) and counts == {"HeadObject": 2}, counts
    # a key removed after the listing reads as present until the listing is renewed (ttl); then recomputed
    other.store.delete(results[0].keys["mel"])
    assert other.is_cached(samples[0])
    other.present.ttl_s = 0.0
    assert other.process(samples[0]).status == "computed" and other.store.contains(results[0].keys["mel"])


def test_a_local_store_is_asked_per_key(tone_dataset: Path, tmp_path: Path) -> None:
    block = FeaturesBlock(parse_experiment(experiment_dict(tone_dataset, tmp_path / "store")))
    sample = next(iter(iter_samples(block.config)))
    assert not block.present.listed and block.process(sample).status == "computed"
    block.store.delete(block.keys(sample)["mel"])  # seen at once: no listing to renew
    assert not block.is_cached(sample) and block.present.listings == 0
