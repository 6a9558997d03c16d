"""``labswarm train``'s loop hooks, and a one-learner job's (:class:`UnforkedSingleLearner`; ``labswarm run``
trains through such a job): the single process reads the training split as a distributed learner does.

A learner of a distributed job reads its training inputs through
:class:`~labswarm.train.distributed.data.TrainingSamples`: each sample's full-length features in memory while the
split fits ``training.keep_bytes`` (default 1 GiB, half of what a memory limit leaves), else **streamed** from the
store, each step's chunk memory-mapped and cropped by a reader thread while the step before trains
(:class:`~labswarm.train.distributed.steps.ReadAhead`); crops re-drawn every epoch, sample ``i``'s positioned by
(training seed, epoch, ``i``). :class:`SingleLearner` gives the single-process trainer that same reading, so a
data set larger than the machine's memory trains with memory bounded by one chunk read ahead, whatever its size
(issue 24 item 1, ``tests/train/test_single_learner.py``), and a sample gets the same crops alone as in a job.

Its steps: each epoch is a pass over the split in the global cursor's order (a permutation seeded by (training
seed, epoch), cut into chunks of the pipeline's batch size: :class:`LocalCursor`, the in-process counterpart of
:class:`~labswarm.train.distributed.cursor.GlobalCursor`), one chunk a step. A halt stops at a step boundary; the
mid-epoch checkpoint's ``steps`` tells the resumed pass how many of its chunks were trained (taken in order), and
it trains the others.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from labswarm.pipeline.pipeline import Pipeline
from labswarm.train.distributed.cursor import Chunk
from labswarm.train.distributed.data import TrainingSamples
from labswarm.train.distributed.producers import UnforkedLoop
from labswarm.train.distributed.steps import ReadAhead
from labswarm.train.loop import EpochSteps, LoopHooks

log = logging.getLogger(__name__)


class LocalCursor:
    """One process's pass over ``n_samples`` samples in chunks of ``chunk_size``: the global cursor's order (a
    permutation seeded by ``(seed, pass)``), the chunks handed out in order from ``skip`` on; the methods
    :class:`~labswarm.train.distributed.steps.ReadAhead` calls on a cursor.

    Args:
        n_samples: samples in the split (> 0).
        chunk_size: samples per chunk (> 0).
        seed: the training seed (``ExperimentConfig.training_seed``).
        pass_: the epoch, from 0.
        skip: chunks of the pass trained already (a mid-epoch checkpoint's steps).
    """

    def __init__(self, n_samples: int, chunk_size: int, seed: int, pass_: int, skip: int = 0) -> None:
        order = np.random.default_rng((seed, pass_)).permutation(n_samples)
        self.chunks = [Chunk(pass_, i, order[start:start + chunk_size], "")
                       for i, start in enumerate(range(0, n_samples, chunk_size))][skip:]
        self.chunks.reverse()  # popped from the end: the pass's order

    def claim_fresh(self, pass_: int) -> Chunk | None:
        """The pass's next chunk, ``None`` when none is left."""
        return self.chunks.pop() if self.chunks else None

    def renew(self, chunk: Chunk) -> Chunk:
        """``chunk`` (no lease to renew: nobody else trains it)."""
        return chunk

    def release(self, chunk: Chunk) -> None:
        """Give ``chunk`` back untrained: it is the next one handed out."""
        self.chunks.append(chunk)


class _Steps(EpochSteps):
    """One pass of :class:`LocalCursor`: a chunk a step, the next one read ahead when streaming."""

    def __init__(self, hooks: SingleLearner, torch: Any, epoch: int, device: Any,
                 partial: Mapping[str, Any] | None) -> None:
        sums = {"loss_sum": 0.0, "correct": 0, "seen": 0, "steps": 0, "seconds": 0.0, "waited": 0.0}
        sums.update({k: v for k, v in (partial or {}).items() if k in sums})
        super().__init__(epoch, sums)
        assert hooks.samples is not None
        self.samples, self.torch, self.device = hooks.samples, torch, device
        self.cursor = LocalCursor(len(self.samples.positions), hooks.chunk, hooks.seed, epoch, int(sums["steps"]))
        self.reader = ReadAhead(self.samples, self.cursor, epoch) if self.samples.streaming else None  # type: ignore[arg-type]

    def before_step(self, stop: bool) -> tuple[Any, Any] | None:
        if stop:
            self.halted = True
            return None
        started = time.perf_counter()  # the metrics' data_wait_s: the chunk's crops, read now or awaited
        if self.reader is None:
            chunk = self.cursor.claim_fresh(self.epoch)
            if chunk is None:
                return None
            x, y = self.samples.batch(self.epoch, chunk.samples.tolist())
        else:
            chunk = self.reader.take() or self.cursor.claim_fresh(self.epoch)
            if chunk is None:
                return None
            x, y = self.reader.batch(chunk.samples)
            self.reader.ahead()  # the next step's chunk, read while this one trains
        self.sums["waited"] += time.perf_counter() - started
        return x.to(self.device), y.to(self.device)

    def after_epoch(self, record: dict[str, Any]) -> None:
        record.update(respawns=0, failed_samples=len(self.samples.samples) - len(self.samples.positions))

    def close(self) -> None:
        """The pass ended (or failed): the reader stops, a chunk still held ahead goes back to the cursor."""
        if self.reader is not None:
            self.reader.close()


class SingleLearner(LoopHooks):
    """The single process's loop hooks reading as a distributed learner reads (module docstring).

    Args:
        report: called with one line saying how the split is read (in memory, or streamed), for a console.
    """

    def __init__(self, report: Callable[[str], None] | None = None) -> None:
        super().__init__()
        self.report = report
        self.samples: TrainingSamples | None = None
        self.chunk, self.seed = 32, 0

    def attach(self, torch: Any, model: Any, optimizer: Any, train: Pipeline, output: str, run_dir: Path) -> Any:
        """Read the training split's features (of ``output``) into memory up to ``training.keep_bytes``, or index
        them for streaming beyond.

        Returns:
            ``model``.

        Raises:
            PipelineError: no training sample could be read.
            ConfigError: a memory limit below two batches (:class:`TrainingSamples`).
        """
        super().attach(torch, model, optimizer, train, output, run_dir)
        experiment = train.context.experiment
        settings = experiment.training
        self.samples = TrainingSamples(experiment, train, output,
                                       keep_bytes=settings.keep_bytes if settings is not None else None)
        n = len(self.samples.load())
        self.chunk = next((b.config.size for b in train.blocks if b.name == "batch"), 32)
        self.seed = experiment.training_seed
        line = (f"{n} training samples, streamed from the store (one batch read ahead; their features exceed "
                f"{self.samples.keep_bytes / 1e6:.0f} MB, training.keep_bytes)" if self.samples.streaming
                else f"{n} training samples, {self.samples.nbytes / 1e6:.1f} MB of features in memory")
        log.info("%s", line)
        if self.report is not None:
            self.report(line)
        return model

    @contextmanager
    def epoch(self, torch: Any, epoch: int, device: Any,
              partial: Mapping[str, Any] | None = None) -> Iterator[EpochSteps]:
        """The pass ``epoch`` (from 0), after ``partial``'s steps when resuming it mid-epoch."""
        steps = _Steps(self, torch, epoch, device, partial)
        try:
            yield steps
        finally:
            steps.close()


class UnforkedSingleLearner(SingleLearner, UnforkedLoop):
    """A one-learner job's loop hooks: the training split read as :class:`SingleLearner` reads it (in memory up to
    ``training.keep_bytes``, else streamed with one batch read ahead: no producers), and the validation pipeline's
    producers started from a fork server (:class:`~labswarm.train.distributed.producers.UnforkedLoop`: the job's
    learner process runs its reporter's threads, so it never forks)."""
