"""The trainer's hooks in a learner (:class:`JobHooks`): progress within an epoch, checkpoints committed to the
results store, metrics, halt. They hand everything to the learner's :class:`~labswarm.jobs.learner.reporter.JobReporter`
and its storage; the trainer stays free of HTTP.

Progress: after every step the learner's report carries ``{epoch, epochs, step, steps, samples, samples_total,
samples_per_s, loss}`` (epoch from 1; steps and samples of this learner's share of the epoch, their totals from
:func:`epoch_size`; samples/s since the epoch's first step in this attempt; ``loss`` the running mean of the
epoch's batch losses), and at the epoch's end a last one with the epoch's own figures (bar full) comes just before
its metrics record; a distributed learner's also carries its cumulative ``comm`` (``CommStats.as_dict()``), every
rank's (``labswarm compare`` reads them: the metrics are rank 0's only).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from labswarm.config.experiment import ExperimentConfig
from labswarm.errors import ConfigError, DatasetError
from labswarm.jobs.learner.context import LearnerContext
from labswarm.jobs.learner.live import LiveChanges
from labswarm.jobs.spec import layout
from labswarm.train.trainer import Trainer, TrainerHooks

log = logging.getLogger("labswarm.learner")


def epoch_size(experiment: ExperimentConfig, rank: int = 0, world: int = 1) -> tuple[int, int, int]:
    """The size of one training epoch of learner ``rank`` of ``world``, from the experiment's pipeline: the source
    block's training split, sharded as the source shards it (per learner and producer, sizes differing by at most
    one), batched by the batch block.

    Returns:
        ``(samples, steps, batch size)``: the learner's training samples per epoch and its optimizer steps
        (batches; a batch whose every sample failed is no step, so the steps done may fall short).

    Raises:
        StopIteration: the pipeline has no ``source`` or no ``batch`` block.
        ConfigError: a block spec is invalid.
        DatasetError: the labels CSV is unreadable.
    """
    from labswarm.pipeline.blocks.batch import Batcher
    from labswarm.pipeline.blocks.source import Source
    from labswarm.pipeline.pipeline import Pipeline

    pipeline = Pipeline(experiment, split="train")
    source = next(b for b in pipeline.blocks if isinstance(b, Source))
    batcher = next(b for b in pipeline.blocks if isinstance(b, Batcher))
    total = sum(1 for _ in source(None, pipeline.context.with_(train=False)))  # the whole split, one shard
    producers = max(1, pipeline.prefetch.producers)
    shards = world * producers
    sizes = [total // shards + (shard < total % shards) for shard in range(rank * producers, (rank + 1) * producers)]
    size = batcher.config.size
    steps = sum(n // size if batcher.config.drop_last else -(-n // size) for n in sizes)
    return sum(sizes), steps, size


class JobHooks(TrainerHooks):
    """The trainer's hooks in a learner: progress, checkpoints into the results store, metrics, halt."""

    def __init__(self, learner: LearnerContext) -> None:
        self.learner = learner
        self.stepped = False
        self.samples: int | None = None  # this learner's training samples per epoch (None: unknown)
        self.steps: int | None = None  # its optimizer steps per epoch
        self.batch = 0  # samples per batch
        self._epoch = -1
        self._since = 0.0  # monotonic time of the first step counted in this epoch
        self._first_step = 0  # the step before it (a resumed epoch goes on counting)
        self._loss_sum = 0.0
        self._step = 0  # the last step seen
        self._copy: str | None = None  # a rank > 0's last checkpoint copy in the results store
        self.live = LiveChanges(learner)  # PATCH /v1/jobs/{id} training changes (issue 25)

    def before_fit(self, trainer: Trainer, start_epoch: int) -> None:
        try:
            self.samples, self.steps, self.batch = epoch_size(trainer.experiment, self.learner.spec.rank,
                                                              self.learner.spec.world_size)
        except (ConfigError, DatasetError, StopIteration) as exc:  # e.g. no source or batch block
            log.info("the size of an epoch is unknown (%s): progress without totals", exc)
        self.learner.reporter.event("phase", {"phase": "training", "start_epoch": start_epoch,
                                              "epochs": trainer.training.epochs})

    def before_epoch(self, trainer: Trainer, epoch: int, optimizer: Any, schedule: Any) -> None:
        self.live.before_epoch(trainer, epoch, optimizer, schedule)

    def after_step(self, trainer: Trainer, epoch: int, step: int, loss: float) -> None:
        now = time.monotonic()
        if epoch != self._epoch:
            self._epoch, self._since, self._first_step, self._loss_sum = epoch, now, step - 1, 0.0
        self._step = step
        self._loss_sum += loss
        counted = step - self._first_step
        done = min(step * self.batch, self.samples or step * self.batch) if self.batch else None
        rate = counted * self.batch / (now - self._since) if self.batch and now > self._since else None
        self.learner.reporter.progress(
            epoch=epoch + 1, epochs=trainer.training.epochs, step=step, steps=max(self.steps or 0, step) or None,
            samples=done, samples_total=self.samples, samples_per_s=rate, loss=self._loss_sum / counted)
        if not self.stepped:  # the time to first step (bench/jobs.py reads this line's stamp)
            self.stepped = True
            log.info("first step of this attempt: epoch %d, step %d, loss %.4f", epoch + 1, step, loss)

    def should_stop(self, trainer: Trainer) -> bool:
        return self.learner.halt.is_set()

    def after_checkpoint(self, trainer: Trainer, path: Path, epochs_done: int, step: int | None) -> None:
        learner = self.learner
        key = layout.checkpoint_key(learner.spec.attempt, epochs_done, step)
        if learner.spec.rank != 0:  # a distributed job's other ranks: their own copy, no pointer, no metrics
            mine = layout.rank_checkpoint_key(key, learner.spec.rank)
            learner.storage.put_file(mine, path)
            if self._copy is not None and self._copy != mine:
                learner.storage.delete(self._copy)
            self._copy = mine
            learner.upload_log()
            return
        learner.storage.put_file(key, path)
        if trainer.metrics_path.is_file():
            learner.storage.put_file(layout.METRICS_KEY, trainer.metrics_path)
        learner.commit(key, epochs_done, step)
        learner.upload_log()

    def after_epoch(self, trainer: Trainer, record: dict[str, Any]) -> None:
        if int(record["epoch"]) == self._epoch + 1:  # the epoch's last progress, its bar full, before its metrics
            self.learner.reporter.progress(
                final=True, epoch=record["epoch"], epochs=trainer.training.epochs, step=self._step,
                steps=self._step, samples=record.get("samples"), samples_total=record.get("samples"),
                samples_per_s=record.get("samples_per_s"), loss=record.get("train_loss"),
                **({"comm": record["comm"]} if "comm" in record else {}))  # every rank's CommStats (compare)
        if self.learner.spec.rank == 0:  # a distributed job's epoch metrics are rank 0's (it validates)
            self.learner.reporter.metric(record, key=f"epoch:{record['epoch']}")
            if "plateau" in record:  # the watched metric stopped improving (labswarm.train.watch)
                self.learner.reporter.event("plateau", {**record["plateau"], "epoch": record["epoch"]})


