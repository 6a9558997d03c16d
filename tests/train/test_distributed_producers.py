"""A distributed learner's pipelines start their producers from a fork server, never by forking the learner
(labswarm/train/distributed/producers.py): the learner runs other threads, and a child forked from it may deadlock
on a lock one of them held (seen: a validation producer still inside fork() 30 s later, a healthy 2-learner job
restarted). Real producer processes, the three-class set."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import psutil
import pytest
from train.three_classes import training_experiment, write_three_classes

from labswarm.config.experiment import parse_experiment
from labswarm.pipeline.base import Block
from labswarm.pipeline.pipeline import Pipeline
from labswarm.pipeline.prefetch import Prefetcher
from labswarm.train.distributed.context import LearnerContext
from labswarm.train.distributed.producers import unforked
from labswarm.train.distributed.training import DistributedTraining
from labswarm.train.trainer import Trainer


def test_only_a_forking_prefetch_block_changes() -> None:
    forked = Block.from_spec({"name": "prefetch", "producers": 2, "depth": 3})
    changed = unforked(forked, {"labswarm.pipeline.blocks.batch"})
    assert changed.config.start_method == "forkserver"
    assert (changed.config.producers, changed.config.depth) == (2, 3)  # the rest as given
    spawned = Block.from_spec({"name": "prefetch", "start_method": "spawn"})
    assert unforked(spawned) is spawned
    batch = Block.from_spec({"name": "batch", "size": 4})
    assert unforked(batch) is batch


def test_the_fork_server_hands_its_producers_loaded_plugin_registries() -> None:
    """A producer forked from the learner inherits its loaded registries; one from the fork server finds them loaded
    too (labswarm/pipeline/warm.py, preloaded), instead of reading every package's entry points at each epoch's
    start (~0.2 s a producer). A fresh interpreter: a fork server already running in this one keeps its preload."""
    probe = subprocess.run([sys.executable, str(Path(__file__).with_name("forkserver_probe.py"))],
                           capture_output=True, text=True, timeout=300)
    assert probe.returncode == 0, probe.stderr
    assert json.loads(probe.stdout) == {"BLOCKS": True, "TRANSFORMATIONS": True, "EXTRACTORS": True,
                                        "STORAGES": True}


@pytest.mark.slow
def test_the_validation_producers_of_a_learner_with_other_threads_are_not_its_children(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A learner of 2 (nothing joined: the pipelines need no peer) builds the trainer's pipelines; its validation
    epoch delivers every batch while another thread of this process holds a lock, from producers whose parent is
    the fork server, not this process. The single-process trainer's producers are still forked (its children).
    Each producer's parent is read as it is started: a small shard's producers can finish before the first batch
    is read on a loaded machine (they were looked for while alive during the epoch, and none was, once in CI)."""
    parents: set[int] = set()
    recording = threading.Event()  # set during the learner's validation epoch only
    spawn = Prefetcher._spawn

    def spawned(self: Prefetcher, slot: Any) -> None:
        spawn(self, slot)
        if recording.is_set():
            with contextlib.suppress(psutil.NoSuchProcess):  # done and reaped already: nothing to read
                parents.add(psutil.Process(slot.process.pid).ppid())

    monkeypatch.setattr(Prefetcher, "_spawn", spawned)
    experiment = parse_experiment(training_experiment(write_three_classes(tmp_path / "data"), tmp_path / "store"))
    learner = DistributedTraining({"name": "allreduce"}, LearnerContext(rank=0, world_size=2))
    _, validation = Trainer(experiment, tmp_path / "home", distributed=learner)._pipelines((0, 2))
    assert validation.prefetch.start_method == "forkserver"
    held, release = threading.Lock(), threading.Event()

    def hold() -> None:
        with held:
            release.wait(60)

    holder = threading.Thread(target=hold, daemon=True)
    holder.start()
    try:
        samples = 0
        recording.set()
        with validation.epoch(0) as batches:
            for batch in batches:
                samples += len(batch)
        recording.clear()
    finally:
        release.set()
        holder.join(10)
    in_process = Pipeline(experiment, split="validation", train=False, rank=0, world=2, blocks=validation.blocks)
    with in_process.epoch(0) as batches:
        assert samples == sum(len(batch) for batch in batches) > 0  # rank 0's shard of the split, all of it
    assert parents and os.getpid() not in parents, parents
    _, alone = Trainer(experiment, tmp_path / "home-alone")._pipelines()
    assert alone.prefetch.start_method == "fork"
