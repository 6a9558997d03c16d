"""The trainer's distributed mode: one learner of ``N``, trained under a framework, its samples from the global cursor.

:class:`~labswarm.train.trainer.Trainer` takes a :class:`DistributedTraining` (``distributed=``); without one
it trains as a single process, on the path it always had. With one, the trainer:

1. joins the process group (synchronous frameworks: ``allreduce``, ``model_averaging``, ``sandblaster``; the
   lockstep below needs it) and calls ``framework.attach(model, optimizer, context)`` once, training through
   the module it returns;
2. reads the training split's features once (evaluation mode of the pipeline: dataset order, centred crops, no
   shuffle) into memory, indexed by sorted sample id, the same order on every learner;
3. each epoch is a pass of the global cursor (:mod:`labswarm.learners.cursor`) over those samples, cut into
   chunks of the pipeline's per-learner batch size: a learner claims a chunk, takes one optimizer step on it,
   marks it done. Synchronous frameworks claim in **lockstep** (one fresh chunk per learner per step, then an
   all-reduce of "who has a chunk"): every learner takes the same number of steps, which their collectives
   need; in the pass's last step a learner without a chunk takes a step of zero loss on one sample (it joins
   the collective, trains nothing). Asynchronous ones claim on their own and take over an expired lease of a
   dead learner. Either way each training sample is trained exactly once per pass across the learners; each
   learner logs its chunks to ``chunks.jsonl`` in its run folder (pass, chunk, sample ids).
4. validates on **rank 0 only**, on its own replica (after the framework's sync for ``allreduce`` and
   ``sandblaster``, where the replicas are equal; the learner's replica for the others). Other ranks' epoch
   records have no ``val_*``. While rank 0 validates the others may wait in the next collective: validation
   must take less than the collective timeout (``LABSWARM_COLLECTIVE_TIMEOUT_S``, 30 s by default).
5. checkpoints the framework's state and (rank 0) the cursor's, and calls ``framework.finish()`` at the end;
   rank 0 writes the model file. Each rank keeps its metrics and checkpoint in ``<run dir>/rank-<r>/``.

Not supported here: a halt in the middle of an epoch (``should_stop`` is honoured in single-process mode only)
and random crops re-drawn per epoch (the features are read once).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from labswarm.learners.context import LearnerContext
from labswarm.learners.cursor import GlobalCursor
from labswarm.learners.frameworks.base import Framework
from labswarm.pipeline.pipeline import Pipeline
from labswarm.pipeline.prefetch import PipelineError

#: Seconds a learner waits for a chunk held by a live lease (asynchronous frameworks) before failing.
CLAIM_TIMEOUT_S = 300.0


class DistributedTraining:
    """One learner's part of a distributed training run.

    Args:
        framework: the framework spec (``{name: ..., **params}``, the manifest's ``framework``).
        context: the learner's rank, peers and addresses (default: :meth:`LearnerContext.from_env`).
        lease_s: the cursor's lease per chunk, in s (default 30: far longer than one step).

    Raises:
        ConfigError: an unknown framework or bad parameters, or a malformed environment.
    """

    def __init__(self, framework: Mapping[str, Any], context: LearnerContext | None = None,
                 lease_s: float = 30.0) -> None:
        self.framework = Framework.from_spec(framework)
        self.context = context if context is not None else LearnerContext.from_env()
        self.lease_s = lease_s
        self.cursor: GlobalCursor | None = None
        self.started = time.perf_counter()
        self._x: Any = None
        self._y: Any = None
        self._ids: list[str] = []
        self._joined = False

    @property
    def rank(self) -> int:
        """This learner's rank."""
        return self.context.rank

    @property
    def lockstep(self) -> bool:
        """Learners step together (synchronous frameworks)."""
        return self.framework.synchronous

    def attach(self, trainer: Any, torch: Any, model: Any, optimizer: Any, train: Pipeline) -> Any:
        """Join the group, attach the framework, read the training features and open the cursor.

        Returns:
            The module to train through.

        Raises:
            PipelineError: no training sample could be read.
            torch.distributed.DistError: the peers did not join within the timeout.
        """
        self.started = time.perf_counter()
        if self.lockstep and self.context.world_size > 1:
            self.context.init_process_group("gloo")
            self._joined = True
        module = self.framework.attach(model, optimizer, self.context)
        self._load(trainer, train)
        chunk = next((b.config.size for b in train.blocks if b.name == "batch"), 32)  # the per-learner batch
        self.cursor = GlobalCursor(self.context.store(), len(self._ids), chunk,
                                   owner=f"{self.rank}:{self.context.attempt}:{os.getpid()}", lease_s=self.lease_s,
                                   seed=trainer.experiment.seed)
        return module

    def _load(self, trainer: Any, train: Pipeline) -> None:
        """The training split's features in memory: ``x`` float32 ``(n, bins, frames)`` (shorter clips padded
        with their own minimum), ``y`` int64 ``(n,)``, rows in sorted sample-id order."""
        rows: dict[str, tuple[np.ndarray, int]] = {}
        reader = Pipeline(trainer.experiment, split="train", train=False, blocks=train.blocks)
        with reader.epoch(0) as batches:
            for batch in batches:
                for i, sample_id in enumerate(batch.ids):
                    rows[sample_id] = (batch.features[trainer.input][i], int(batch.labels[i]))
        if not rows:
            raise PipelineError("the training split delivered no sample: see the log for the reasons")
        self._ids = sorted(rows)
        frames = max(rows[i][0].shape[-1] for i in self._ids)
        self._x = np.stack([np.pad(a, ((0, 0), (0, frames - a.shape[-1])), constant_values=a.min())
                            for a, _ in (rows[i] for i in self._ids)]).astype(np.float32)
        self._y = np.array([rows[i][1] for i in self._ids], dtype=np.int64)

    def train_epoch(self, trainer: Any, torch: Any, module: Any, optimizer: Any, epoch: int,
                    device: Any) -> dict[str, Any]:
        """One pass of the cursor; the epoch's metrics record (the single-process keys, ``samples`` this
        learner's, plus ``rank``, ``world_size``, ``chunks``, ``elapsed_s`` since :meth:`attach`, ``comm``:
        the framework's cumulative :meth:`CommStats.as_dict`)."""
        import torch.distributed as dist

        assert self.cursor is not None, "attach() first"
        module.train()
        loss_sum, correct, seen, steps, chunks = 0.0, 0, 0, 0, 0
        t0 = time.perf_counter()
        with open(trainer.run_dir / "chunks.jsonl", "a", encoding="utf-8") as log:
            while True:
                if self.lockstep:
                    chunk = self.cursor.claim_fresh(epoch)
                    if self._joined:
                        flag = torch.tensor([0 if chunk is None else 1])
                        dist.all_reduce(flag)
                        if int(flag) == 0:
                            break
                    elif chunk is None:
                        break
                else:
                    chunk = self.cursor.claim(epoch, timeout_s=CLAIM_TIMEOUT_S)
                    if chunk is None:
                        break
                index = chunk.samples if chunk is not None else np.zeros(1, dtype=np.int64)
                x = torch.from_numpy(self._x[index]).to(device)
                y = torch.from_numpy(self._y[index]).to(device)
                optimizer.zero_grad(set_to_none=True)
                logits = module(x)
                loss = torch.nn.functional.cross_entropy(logits, y)
                (loss if chunk is not None else loss * 0.0).backward()  # a lockstep filler trains nothing
                optimizer.step()
                steps += 1
                if chunk is None or not self.cursor.done(chunk):
                    continue  # a lost lease: the chunk's new holder trains it
                value = float(loss.detach())
                loss_sum += value * len(index)
                correct += int((logits.argmax(1) == y).sum())
                seen += len(index)
                chunks += 1
                log.write(json.dumps({"pass": epoch, "chunk": chunk.index,
                                      "ids": [self._ids[i] for i in index.tolist()]}) + "\n")
                for hook in trainer.hooks:
                    hook.after_step(trainer, epoch, steps, value)
        seconds = time.perf_counter() - t0
        return {
            "epoch": epoch + 1, "epochs": trainer.training.epochs, "samples": seen,
            "train_loss": loss_sum / max(seen, 1), "train_accuracy": correct / max(seen, 1),
            "samples_per_s": seen / seconds if seconds else 0.0, "data_wait_s": 0.0, "data_wait_share": 0.0,
            "epoch_s": seconds, "respawns": 0, "failed_samples": 0, "rank": self.rank,
            "world_size": self.context.world_size, "chunks": chunks, "steps": steps,
            "elapsed_s": time.perf_counter() - self.started, "comm": self.framework.stats.as_dict(),
        }

    def state_dict(self) -> dict[str, Any]:
        """The framework's state and, on rank 0, the cursor's (the coordinator writes it back into a new store
        with :meth:`~labswarm.learners.launch.JobCoordinator.restore_cursor` before a restarted attempt)."""
        out: dict[str, Any] = {"rank": self.rank, "framework": self.framework.state_dict()}
        if self.rank == 0 and self.cursor is not None:
            out["cursor"] = self.cursor.state_dict()
        return out

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore the framework's state from a checkpoint's :meth:`state_dict` (after :meth:`attach`)."""
        self.framework.load_state_dict(state["framework"])

    def finish(self) -> None:
        """Training ended: the framework's last sync, then its hook and the process group are released."""
        import torch.distributed as dist

        self.framework.finish()
        self.framework.close()
        if self._joined and dist.is_initialized():
            dist.destroy_process_group()
            self._joined = False
