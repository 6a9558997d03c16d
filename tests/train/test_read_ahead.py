"""A streaming learner's read-ahead (labswarm/train/distributed/steps.py): the chunk of the next step claimed and
read during this one, on a real job store (TCPStore) shared with a peer's cursor; the crops are the in-memory
mode's, each chunk is trained once, and a halt gives the chunk held ahead back."""

from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path

from helpers import require
from three_classes import LEARNER_PIPELINE, training_experiment

from labswarm.config.experiment import parse_experiment
from labswarm.pipeline.pipeline import Pipeline

torch = require("torch")  # skips here, fails in CI (tests/helpers.py)

from torch.distributed import TCPStore  # noqa: E402

from labswarm.train.distributed.context import LearnerContext  # noqa: E402
from labswarm.train.distributed.cursor import GlobalCursor  # noqa: E402
from labswarm.train.distributed.data import TrainingSamples  # noqa: E402
from labswarm.train.distributed.record import ChunkRecord  # noqa: E402
from labswarm.train.distributed.steps import CursorSteps  # noqa: E402
from labswarm.train.distributed.training import DistributedTraining  # noqa: E402


def test_a_streaming_learner_reads_the_next_chunk_ahead_and_gives_it_back_at_a_halt(three_classes: Path,
                                                                                    tmp_path: Path) -> None:
    config = parse_experiment(training_experiment(three_classes, tmp_path / "store", pipeline=LEARNER_PIPELINE,
                                                  training={"epochs": 1, "keep_bytes": 0}))
    assert config.training is not None and config.training.keep_bytes == 0
    kept = TrainingSamples(config, Pipeline(config, split="train"), "mel")
    streamed = TrainingSamples(config, Pipeline(config, split="train"), "mel",
                               keep_bytes=config.training.keep_bytes)
    assert streamed.load() == kept.load() == list(range(36)) and streamed.streaming
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=5))
    learner = DistributedTraining({"name": "allreduce"}, LearnerContext(rank=0, world_size=2))
    learner.cursor, learner.samples = GlobalCursor(store, 36, 4, owner="0:1:1"), streamed  # 9 chunks of 4
    peer = GlobalCursor(store, 36, 4, owner="1:1:2")
    steps = CursorSteps(learner, torch, 1, "cpu", None)
    assert steps.reader is not None  # streaming: it reads ahead
    trained: list[int] = []
    with ChunkRecord(tmp_path / "chunks.jsonl", "0:1:1") as steps.trained:
        for _ in range(3):
            batch = steps.before_step(False)
            assert batch is not None and steps.chunk is not None
            assert torch.equal(batch[0], kept.batch(1, steps.index.tolist())[0])  # the in-memory crops
            assert steps.after_step()
            trained.append(steps.chunk.index)
            leases = [v for v in learner.cursor.state_dict()["passes"][1] if v.startswith("L|0:1:1")]
            assert len(leases) == 1  # the next step's chunk, claimed ahead while this one trained
            theirs = peer.claim_fresh(1)  # the peer claims between this learner's steps
            assert theirs is not None and peer.done(theirs)
        assert steps.before_step(True) is None and steps.halted  # a halt: the chunk held ahead goes back
    steps.close()
    passes = learner.cursor.state_dict()["passes"][1]
    assert not [v for v in passes if v.startswith("L|")]
    assert sorted(i for i, v in enumerate(passes) if v == "D|0:1:1") == sorted(trained)
    assert passes.count("D|1:1:2") == 3 and passes.count("") == 3  # every other chunk free for the resume


def test_an_asynchronous_learner_renews_the_chunk_read_ahead_and_gives_it_back_when_it_stops(
        three_classes: Path, tmp_path: Path) -> None:
    config = parse_experiment(training_experiment(three_classes, tmp_path / "store", pipeline=LEARNER_PIPELINE))
    streamed = TrainingSamples(config, Pipeline(config, split="train"), "mel", keep_bytes=0)
    streamed.load()
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=5))
    learner = DistributedTraining({"name": "distributed_hogwild"}, LearnerContext(rank=0, world_size=2))
    assert not learner.lockstep
    learner.cursor, learner.samples = GlobalCursor(store, 36, 4, owner="0:1:1", lease_s=1.0), streamed
    steps = CursorSteps(learner, torch, 0, "cpu", None)
    with ChunkRecord(tmp_path / "chunks.jsonl", "0:1:1") as steps.trained:
        assert steps.before_step(False) is not None and steps.after_step()
        held = steps.reader.take() if steps.reader is not None else None  # claimed ahead with a 1 s lease
        assert held is not None and float(held.lease.rsplit("|", 1)[1]) < time.time() + 60
        learner.cursor.lease_s = 3600.0  # a renewal from now on holds an hour: visible against the 1 s claim
        assert steps.before_step(False) is not None and steps.chunk is not None and steps.chunk.index == held.index
        deadline = float(steps.chunk.lease.rsplit("|", 1)[1])  # renewed when the step took it: a full lease
        assert deadline > time.time() + 3000
        assert learner.cursor.chunk_states(0)[held.index] == steps.chunk.lease  # the store holds the renewal
        assert steps.after_step()
        assert steps.before_step(True) is None and steps.halted
    steps.close()
    passes = learner.cursor.state_dict()["passes"][0]
    assert passes.count("D|0:1:1") == 2 and passes.count("") == 7  # the chunk read ahead is free again
