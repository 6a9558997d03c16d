"""The hooks of the trainer's one training loop: where its steps come from and how a learner shares its work.

:class:`~labswarm.train.trainer.Trainer` has one loop (one optimizer step per batch, the running sums, the
:class:`~labswarm.train.trainer.TrainerHooks`, the checkpoints). What differs between training alone and training
as one learner of several is handed to it as a :class:`LoopHooks` (torchft's ``LocalSGD`` shape: the framework
hooks onto the one trainer, it does not fork it):

- :class:`LoopHooks` itself is the single process: the experiment's pipeline (train split, shuffled, prefetched)
  gives the batches, this process validates the whole split, writes the model, and has no state to checkpoint.
- :class:`~labswarm.train.distributed.training.DistributedTraining` is one learner of ``N``: the global cursor's
  chunks, the framework's collectives, the wait for the peers, the shared validation.

Per epoch the trainer runs (every hook is a method call, nothing is allocated per step by the loop)::

    stop = hooks.stops_between_epochs and <a TrainerHooks asks to stop>
    with hooks.epoch(torch, epoch, device, partial) as steps:
        while (batch := steps.before_step(stop)) is not None:      # None: the epoch ended, or halted
            x, y = batch
            ... zero_grad, forward, (loss * 0.0 if steps.filler else loss).backward(), optimizer.step() ...
            if steps.after_step():                                   # the step counts (running sums, hooks)
                ...
            stop = <a TrainerHooks asks to stop>
    if steps.halted: checkpoint steps.halt() (mid-epoch), else record = {...}; steps.after_epoch(record)
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from labswarm.pipeline.base import Block
from labswarm.pipeline.pipeline import Pipeline
from labswarm.pipeline.prefetch import PipelineError

log = logging.getLogger(__name__)


class EpochSteps:
    """One epoch's steps as the trainer's loop takes them (module docstring); subclasses fill in the steps.

    Attributes:
        sums: the epoch's running sums, continued from a mid-epoch checkpoint's: ``loss_sum`` (nats, summed over
            samples), ``correct``, ``seen`` (samples), ``steps`` (optimizer steps), ``seconds`` (the epoch's
            training time), plus the source's own (the mid-epoch checkpoint holds them all).
        started: :func:`time.perf_counter` when the epoch's training time starts (a source may move it on).
        filler: the current step trains nothing (the trainer backpropagates a zero loss): a lockstep learner
            without a chunk joining its peers' collectives.
        halted: :meth:`before_step` ended the epoch because a stop was asked (a halt): no record, a mid-epoch
            checkpoint instead.
    """

    filler = False

    def __init__(self, epoch: int, sums: dict[str, Any]) -> None:
        self.epoch = epoch
        self.sums = sums
        self.started = time.perf_counter()
        self.halted = False

    def before_step(self, stop: bool) -> tuple[Any, Any] | None:
        """The next step's inputs on the trainer's device, or ``None`` when the epoch ends (``stop``: a
        :class:`~labswarm.train.trainer.TrainerHooks` asked to stop, then :attr:`halted` is set).

        Returns:
            ``(x, y)``: float32 tensor ``(batch, n_bins, frames)`` and int64 tensor ``(batch,)`` of class indices.
        """
        raise NotImplementedError

    def after_step(self) -> bool:
        """The optimizer step ended; ``True`` when it counts (its samples join the running sums and the
        trainer's hooks see it)."""
        return True

    def after_epoch(self, record: dict[str, Any]) -> None:
        """The epoch ended (not halted): add the source's figures to its metrics ``record``, in place."""

    def halt(self) -> dict[str, Any]:
        """The epoch was halted: the running sums to keep in the mid-epoch checkpoint."""
        log.info("stopped in epoch %d after step %d", self.epoch + 1, self.sums["steps"])
        return self.sums


class _PipelineSteps(EpochSteps):
    """A pass of the pipeline's training split: every non-empty batch one step."""

    def __init__(self, torch: Any, epoch: int, output: str, device: Any, partial: Mapping[str, Any] | None) -> None:
        sums = {"loss_sum": 0.0, "correct": 0, "seen": 0, "failed": 0, "steps": 0, "seconds": 0.0, "waited": 0.0,
                "respawns": 0}
        sums.update({k: v for k, v in (partial or {}).items() if k in sums})
        super().__init__(epoch, sums)
        self.torch, self.output, self.device = torch, output, device
        self.batches: Iterator[Any] = iter(())

    def before_step(self, stop: bool) -> tuple[Any, Any] | None:
        if stop:
            self.halted = True
            return None
        for batch in self.batches:
            self.sums["failed"] += len(batch.failed)
            if len(batch):
                return (self.torch.from_numpy(batch.features[self.output]).to(self.device),
                        self.torch.from_numpy(batch.labels).to(self.device))
        return None

    def after_epoch(self, record: dict[str, Any]) -> None:
        """Raises:
            PipelineError: the epoch delivered no training sample.
        """
        if not self.sums["seen"]:
            raise PipelineError(f"epoch {self.epoch + 1} delivered no training sample ({self.sums['failed']} "
                                "failed): see the log for the reasons")
        record.update(respawns=self.sums["respawns"], failed_samples=self.sums["failed"])


class LoopHooks:
    """The trainer's loop hooks of a single process (module docstring); subclass for another way to train.

    :meth:`attach` is called once, after the model, optimizer and checkpoint are in place; :meth:`epoch` once per
    epoch; the validation hooks after each epoch; :meth:`finish` when the last epoch is done.
    """

    #: This process trains as one learner of several (the trainer refuses settings the learners would have to agree
    #: on: early stopping, freeze).
    several = False
    #: A stop asked between two epochs (during validation or the checkpoint) stops the next epoch before its first
    #: step (the mid-epoch path, at step 0); ``False``: after its first step.
    stops_between_epochs = False

    def __init__(self) -> None:
        self._train: Pipeline | None = None
        self._output = ""

    def pipeline_block(self, block: Block[Any]) -> Block[Any]:
        """A block of the experiment's pipeline as this loop's pipelines run it (the trainer builds both of its
        pipelines from what this returns); here unchanged."""
        return block

    @property
    def rank(self) -> int:
        """This process's rank among the learners: rank 0 reports the validation and writes the model."""
        return 0

    @property
    def validation_shard(self) -> tuple[int, int]:
        """``(rank, world)``: the shard of the validation split this process validates (the pipeline's
        sharding); ``(0, 1)``: the whole split."""
        return 0, 1

    @property
    def validates(self) -> bool:
        """This process validates after each epoch (its shard: :attr:`validation_shard`)."""
        return True

    def run_folder(self, run_dir: Path) -> Path:
        """The folder of this process's metrics and checkpoint in the run folder ``run_dir``."""
        return run_dir

    def agree(self, state: dict[str, Any] | None) -> dict[str, Any] | None:
        """The checkpoint this process resumes from, as its peers agree on it (called before :meth:`attach`, on
        every start): ``state`` is its own (``None``: none, a fresh start); here kept."""
        return state

    def attach(self, torch: Any, model: Any, optimizer: Any, train: Pipeline, output: str, run_dir: Path) -> Any:
        """Training starts: ``model`` and ``optimizer`` built (and restored from a checkpoint), ``train`` the
        training pipeline, ``output`` the model's input (a feature output name), ``run_dir`` this process's folder.

        Returns:
            The module to train through (here ``model`` itself).
        """
        self._train, self._output = train, output
        return model

    @contextmanager
    def epoch(self, torch: Any, epoch: int, device: Any,
              partial: Mapping[str, Any] | None = None) -> Iterator[EpochSteps]:
        """The steps of ``epoch`` (from 0), continuing ``partial``'s running sums (a mid-epoch checkpoint's);
        the epoch's resources (the pipeline's producers) are released on leaving.

        Raises:
            PipelineError: a producer failed.
        """
        assert self._train is not None, "attach() first"
        steps = _PipelineSteps(torch, epoch, self._output, device, partial)
        with self._train.epoch(epoch) as batches:
            steps.batches = iter(batches)
            yield steps
            steps.sums["waited"] += batches.waited
            steps.sums["respawns"] += batches.respawns

    def validation_start(self, torch: Any, model: Any) -> None:
        """Before this process validates ``model``."""

    def reduce_validation(self, torch: Any, matrix: np.ndarray, loss_sum: float) -> tuple[np.ndarray, float]:
        """This process's validation sums, the confusion matrix ``(n_classes, n_classes)`` (int64 counts, rows the
        true class) and the cross-entropy sum (nats), turned into the whole split's (here: they are)."""
        return matrix, loss_sum

    def state_dict(self) -> dict[str, Any] | None:
        """This mode's state for the checkpoint (its ``distributed`` entry); ``None``: nothing to keep."""
        return None

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore a checkpoint's :meth:`state_dict` (after :meth:`attach`)."""

    def finish(self) -> None:
        """The last epoch is done (before rank 0 writes the model)."""
