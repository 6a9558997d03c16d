"""The distributed mode's training inputs: the single-process StoreDataset's random crops, features kept in memory."""

from __future__ import annotations

import resource
from pathlib import Path

import numpy as np
import pytest
from helpers import require
from three_classes import LEARNER_PIPELINE, training_experiment

from labswarm.config.experiment import parse_experiment
from labswarm.pipeline.pipeline import Pipeline
from labswarm.storage.cache import CachedStorage
from labswarm.storage.local import LocalStorage, LocalStorageConfig
from labswarm.store.store import FETCH_THREADS, FeatureStore
from labswarm.threads import thread_address_space

torch = require("torch")  # skips here, fails in CI (tests/helpers.py)

from labswarm.pipeline.torch_data import StoreDataset  # noqa: E402 (imports torch)
from labswarm.train.distributed.data import TrainingSamples, _cgroup_headroom  # noqa: E402


def test_a_learners_crops_are_the_single_process_crops_of_the_epoch_whatever_its_chunk(
        three_classes: Path, tmp_path: Path) -> None:
    config = parse_experiment(training_experiment(three_classes, tmp_path / "store", pipeline=LEARNER_PIPELINE))
    samples = TrainingSamples(config, Pipeline(config, split="train"), "mel")
    positions = samples.load()
    reference = StoreDataset(config, "train", "mel", frames=24, random_crop=True)  # what single-process reads
    assert positions == list(range(len(reference))) == list(range(36))
    whole = StoreDataset(config, "train", "mel")[0][0]
    assert whole.shape[-1] > 24  # a real crop: clips are longer than the crop
    assert samples.nbytes == 36 * whole.numel() * 4  # full-length features, kept once
    order = np.random.default_rng(7).permutation(36).tolist()  # any chunking, any learner
    crops = {}
    for epoch in (0, 3):
        reference.set_epoch(epoch)
        for chunk in (order[:5], order[5:17], order[17:]):
            x, y = samples.batch(epoch, chunk)
            assert x.shape == (len(chunk), whole.shape[0], 24) and x.dtype == torch.float32
            for row, j in enumerate(chunk):
                rx, ry = reference[j]
                assert torch.equal(x[row], rx) and int(y[row]) == int(ry), (epoch, j)
        crops[epoch] = samples.batch(epoch, range(36))[0]
    moved = sum(not torch.equal(crops[0][i], crops[3][i]) for i in range(36))
    assert moved > 18  # re-drawn per epoch (a crop of 24 of ~44 frames lands elsewhere most of the time)
    assert samples.ids([0, 5]) == [reference.samples[0].id, reference.samples[5].id]


def test_a_cgroups_headroom_leaves_out_its_inactive_file_cache(tmp_path: Path) -> None:
    """Limit less the working set (usage less inactive file cache), for v2's and v1's file names."""
    v2, v1 = tmp_path / "v2", tmp_path / "v1"
    for folder, files in ((v2, {"memory.max": "1000", "memory.current": "800"}),
                          (v1, {"memory.limit_in_bytes": "1000", "memory.usage_in_bytes": "800"})):
        folder.mkdir()
        for name, value in files.items():
            (folder / name).write_text(value + "\n")
    assert _cgroup_headroom(str(v2)) == 200 and _cgroup_headroom(str(v1)) == 200  # no memory.stat: usage as is
    (v2 / "memory.stat").write_text("anon 400\nfile 400\nactive_file 100\ninactive_file 300\n")
    (v1 / "memory.stat").write_text("cache 400\ninactive_file 999\ntotal_inactive_file 300\n")
    assert _cgroup_headroom(str(v2)) == 500 and _cgroup_headroom(str(v1)) == 500
    assert _cgroup_headroom(None) is None and _cgroup_headroom(str(tmp_path / "none")) is None


def test_under_an_address_space_limit_each_fetch_thread_counts_its_stack_and_arenas(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A learner's fetch threads through a remote store's cache (TrainingSamples._check_batch asks the store's
    fetch_threads): under RLIMIT_AS (set here to a finite soft limit far above any use) the store counts each
    thread's stack and the arena MALLOC_ARENA_MAX allows with what its reads hold, so a room for 3 such threads gives
    3, not the 8 the reads alone fit (what a learner chose before the threads counted); a local folder starts no
    fetch thread: no count; without RLIMIT_AS (a memory cgroup counts resident memory) neither."""
    monkeypatch.setenv("MALLOC_ARENA_MAX", "2")  # the local launcher's, for a limited learner
    array = 4 * 2**20
    remote = FeatureStore(storage=CachedStorage(LocalStorage(LocalStorageConfig(path=tmp_path / "remote")),
                                                tmp_path / "cache"))
    local = FeatureStore(tmp_path / "local")
    room = remote.read_bytes(3, array) + thread_address_space(3)
    reads_alone = max(n for n in range(1, FETCH_THREADS + 1) if remote.read_bytes(n, array) <= room)
    assert reads_alone == FETCH_THREADS  # the reads alone: all 8 fit
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (2**62 if soft == resource.RLIM_INFINITY else soft, hard))
    try:
        assert remote.read_reserve(1, array) == remote.read_bytes(1, array) + thread_address_space(1)
        assert remote.fetch_threads(room, array) == 3
        assert remote.fetch_threads(room - 1, array) == 2
        assert remote.fetch_threads(0, array) == 1  # at least one: whether it fits is _check_batch's
        assert local.fetch_threads(room, array) == FETCH_THREADS and local.read_reserve(1, array) == 0
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
    if soft == resource.RLIM_INFINITY:
        assert remote.fetch_threads(room, array) == FETCH_THREADS
        assert remote.read_reserve(1, array) == remote.read_bytes(1, array)
