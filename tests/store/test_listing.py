"""A remote store's keys from listings of the shards asked about (labswarm/store/listing.py): a worker's
FeaturesBlock on s3 (moto's server) asks no HEAD per key, before computing nor after, and lists only the shards
(``v1/<k0k1>/``) of the keys it asks about, one LIST each, or a small store whole with one LIST of its first page;
the listings held stay under their bound; a local store is asked per key as before."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import experiment_dict
from jobs.conftest import S3Endpoint

from labswarm.config.experiment import parse_experiment
from labswarm.pipeline.features import FeaturesBlock
from labswarm.sample import iter_samples
from labswarm.storage.cache import CachedStorage
from labswarm.store.listing import KeyListing, _Shard, pack


def _requests(block: FeaturesBlock) -> tuple[dict[str, int], list[str]]:
    """Counts of the block's S3 requests by operation name from now on, and the prefixes its listings asked for
    (boto3's event hooks on its client); the listings of the written packs (labswarm/store/written.py: every store
    reads them, one listing per few seconds at most) counted apart, as ``written``."""
    counts: dict[str, int] = {}
    prefixes: list[str] = []

    def count(model: object, params: dict, **_: object) -> None:
        name = getattr(model, "name", "")
        if name == "ListObjectsV2" and params.get("Prefix", "").startswith("features/written/"):
            name = "written"
        else:
            prefixes.extend([params["Prefix"]] if name == "ListObjectsV2" else [])
        counts[name] = counts.get(name, 0) + 1

    storage = block.store.storage
    events = (storage.remote if isinstance(storage, CachedStorage) else storage)._s3.meta.events  # type: ignore[attr-defined]
    events.register("before-parameter-build.s3", count)
    return counts, prefixes


def _apart(counts: dict[str, int]) -> dict[str, int]:
    """``counts`` without the written packs' listings."""
    return {name: n for name, n in counts.items() if name != "written"}


@pytest.mark.slow  # 15.7 s at load ~13, 29 s at ~30 (features computed for 4 samples, twice)
def test_workers_on_s3_list_the_shards_they_ask_about_instead_of_a_head_per_key(
        tone_dataset: Path, tmp_path: Path, s3_endpoint: S3Endpoint) -> None:
    data = experiment_dict(tone_dataset, tmp_path / "cache")
    data["store"]["remote"] = s3_endpoint.spec(prefix="features")
    config = parse_experiment(data)
    samples = list(iter_samples(config))[:4]
    worker = FeaturesBlock(config)
    worker.present.page = 0  # shards only (a store this small is otherwise listed whole by one page: below)
    counts, prefixes = _requests(worker)
    results = [worker.process(s) for s in samples]
    assert [r.status for r in results] == ["computed"] * len(samples), [r.reason for r in results]
    shards = {key[:2] for r in results for key in r.keys.values()}
    # one LIST per shard asked about (of that shard's folder only), a put per array, no HEAD
    assert counts.get("written", 0) >= 1, counts  # the written packs listed too
    assert _apart(counts) == {"ListObjectsV2": len(shards), "PutObject": 2 * len(samples)}, counts
    assert sorted(prefixes) == sorted(f"features/v1/{shard}/" for shard in shards)
    assert all(worker.is_cached(s) for s in samples) and worker.present.listings == len(shards)  # its own puts
    assert sorted(worker.present.shards) == sorted(shards) and worker.present.held == 2 * len(samples)
    # another worker (a fresh process) finds every sample cached from the same shards' listings
    other = FeaturesBlock(config)
    other.present.page = 0
    counts, prefixes = _requests(other)
    assert [other.process(s).status for s in samples] == ["cached"] * len(samples)
    assert _apart(counts) == {"ListObjectsV2": len(shards)} and other.present.held == 2 * len(samples), counts
    # an array written after its shard's listing reads as missing, except to a strict question (one HEAD);
    # a key of a shard not listed yet is found by listing that shard
    fresh = list(iter_samples(config))[4]
    late = FeaturesBlock(config)
    late.present.page = 0
    for key in late.keys(fresh).values():
        late.present.contains(key)  # its shards listed, before the arrays below exist
    assert worker.process(fresh).status == "computed"
    counts, _ = _requests(late)
    assert not late.is_cached(fresh) and _apart(counts) == {}
    assert late.is_cached(fresh, strict=True) and _apart(counts) == {"HeadObject": 2}, counts
    # a key removed after the listing reads as present until the shard is listed again (ttl); then recomputed
    other.store.delete(results[0].keys["mel"])
    assert other.is_cached(samples[0])
    other.present.ttl_s = 0.0
    assert other.process(samples[0]).status == "computed" and other.store.contains(results[0].keys["mel"])
    # a small store (one listing page holds every key) is listed whole by that one request
    whole = FeaturesBlock(config)
    counts, prefixes = _requests(whole)
    assert [whole.process(s).status for s in samples] == ["cached"] * len(samples)
    assert whole.is_cached(fresh)  # computed by the first worker since: in the page
    assert _apart(counts) == {"ListObjectsV2": 1} and prefixes == ["features/v1/"], (counts, prefixes)
    assert len(whole.present.shards) == 256 and whole.present.held == len(whole.store.sizes())
    # bounded: with room for one key, only the shard asked last is held; a shard dropped is listed again
    small = KeyListing(other.store, max_keys=1)
    keys = [key for r in results for key in r.keys.values()]
    assert all(small.contains(key) for key in keys)
    last = keys[-1][:2]
    assert small.shards == [last] and small.held == sum(key[:2] == last for key in keys)
    before = small.listings
    assert small.contains(keys[0]) and small.listings == before + (keys[0][:2] != last)


def test_packed_keys_are_found_exactly() -> None:
    keys = ["ab" + "0" * 38, "ab" + "0" * 36 + "01", "ab" + "f" * 38, "ab12" + "0" * 36]
    packed = pack(keys)
    assert packed.dtype.itemsize == 19 and len(packed) == 4
    shard = _Shard(packed, 0.0)
    assert all(key in shard for key in keys)
    # absent: the same digits but for a trailing zero byte (S19 items read back without trailing NUL bytes)
    assert all(key not in shard for key in ("ab" + "0" * 34 + "0100", "ab13" + "0" * 36, "ab" + "0" * 37 + "2"))


def test_a_local_store_is_asked_per_key(tone_dataset: Path, tmp_path: Path) -> None:
    block = FeaturesBlock(parse_experiment(experiment_dict(tone_dataset, tmp_path / "store")))
    sample = next(iter(iter_samples(block.config)))
    assert not block.present.listed and block.process(sample).status == "computed"
    block.store.delete(block.keys(sample)["mel"])  # seen at once: no listing to renew
    assert not block.is_cached(sample) and block.present.listings == 0
