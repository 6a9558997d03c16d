"""The trainer's distributed mode: one learner of ``N``, trained under a framework, its samples from the global cursor.

:class:`DistributedTraining` is a :class:`~labswarm.train.loop.LoopHooks`: the caller hands it to the one
:class:`~labswarm.train.trainer.Trainer` (``distributed=``), whose loop then takes its steps from it (without one
the trainer trains as a single process, through the default hooks). With it, the trainer:

1. joins the process group (synchronous frameworks: ``allreduce``, ``model_averaging``, ``sandblaster``; the
   lockstep below needs it) and calls ``framework.attach(model, optimizer, context)`` once, training through
   the module it returns;
2. reads the training split's full-length features once into memory (:mod:`labswarm.train.distributed.data`),
   up to ``training.keep_bytes``, beyond which it streams them from the store, each step's chunk claimed and read
   one step ahead (:mod:`labswarm.train.distributed.steps`), and trains on random crops re-drawn every epoch,
   each sample's positioned by (training seed, epoch, sample index) exactly as
   :class:`~labswarm.pipeline.torch_data.StoreDataset` with ``random_crop`` positions it (it is that class), so
   a sample's crop does not depend on which learner trains it; samples indexed in dataset order, the same on every
   learner;
3. each epoch is a pass of the global cursor (:mod:`labswarm.train.distributed.cursor`) over those samples, cut into
   chunks of a learner's batch (the pipeline's batch size, divided by the learners under a synchronous
   framework's ``batch: global``: :meth:`Framework.learner_batch`; a checkpoint's cursor of another chunk size
   is refused on resume, naming ``framework.batch``): a learner claims a chunk, takes one optimizer step on it,
   marks it done. Synchronous frameworks claim in **lockstep** (one fresh chunk per learner per step, then an
   all-reduce of "who has a chunk"): every learner takes the same number of steps, which their collectives
   need; in the pass's last step a learner without a chunk takes a step of zero loss on one sample (it joins
   the collective, trains nothing). Asynchronous ones claim on their own and take over an expired lease of a
   dead learner. Worker groups (a framework's ``group_size`` > 1, issue 23) step in lockstep inside their group
   only, each group its own process group (:meth:`LearnerContext.join_group`): the groups never wait for each
   other, and once the fresh chunks are out a group takes over an expired lease or its dead predecessors'
   (:meth:`GlobalCursor.claim_orphan`); a group restarts alone, its members from the newest of their own copies
   (:meth:`DistributedTraining.agree`: one position for the whole group). Either way
   each training sample is trained exactly once per pass across the learners; each learner records its chunks
   (pass, chunk, its process, sample ids) in ``chunks-rank-<r>.jsonl`` beside its run folder, or where its owner
   says (``chunk_log``), each line written before the chunk is marked done and kept across kills and restarts
   (:mod:`labswarm.train.distributed.record`);
4. honours a hook's ``should_stop`` (a halt) at a step boundary, as the single-process trainer does. In
   lockstep the "stop requested" flags ride in the same all-reduce as "who has a chunk" (no extra collective):
   if any learner asked, all stop at the same step, and each gives back (:meth:`GlobalCursor.release`) the
   chunk it claimed for that step. An asynchronous learner stops on its own after its step, before claiming
   the next chunk, and marks itself stopped in the job's store. The trainer then writes each rank's mid-epoch
   checkpoint (its running sums, step count, framework state and communication totals: :meth:`comm`) and rank
   0's holds the cursor's state with the stopped pass's claimed-but-untrained chunks free (asynchronous: read
   once every learner has stopped or finished, up to ``lease_s``); done chunks stay done. A halt asked between
   two passes (during validation) stops the next pass before its first step: the same path, at step 0, so
   rank 0 never reads the cursor while an asynchronous peer still marks chunks of the next pass. Resumed
   (``fit(resume=True)``, the cursor restored into the coordinator, each rank from its own checkpoint: an
   asynchronous rank's stops at its own step, so a job finds it by :func:`labswarm.jobs.spec.layout.latest_rank_copy`),
   the pass continues: the free chunks are trained, each sample of that pass exactly once across the halt, and each
   rank's running totals go on (``tests/train/test_distributed.py``, ``tests/jobs/test_async_halt_job.py``);
5. validates: where the replicas are equal after every step (``allreduce``, ``sandblaster``:
   ``Framework.equal_replicas``) every learner validates a disjoint shard of the validation split (the pipeline's
   ``rank``/``world`` sharding) with rank 0's parameters and batch-norm statistics (broadcast first: each rank's
   running statistics saw its own last batch), and the confusion matrix and loss sum are all-reduced
   (:meth:`DistributedTraining.reduce_validation`): the figures of the whole split, in about ``1/N`` of the time,
   no learner idle. Otherwise **rank 0 only** validates, on its own replica (the others' differ between syncs),
   while the peers of its process group wait for its mark in the job's store (it has begun the next pass, or
   finished training: :mod:`labswarm.train.distributed.rank0_wait`), not in their next collective, so a validation
   longer than the collective timeout (``timeout_s``) no longer fails them. Either way only rank 0's epoch
   records hold ``val_*``.
6. checkpoints the framework's state and (rank 0) the cursor's, and calls ``framework.finish()`` at the end;
   rank 0 writes the model file. Each rank keeps its metrics and checkpoint in ``<run dir>/rank-<r>/``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np

from labswarm.errors import ConfigError
from labswarm.pipeline.pipeline import Pipeline
from labswarm.train.distributed import lr_scaling, rank0_wait, record
from labswarm.train.distributed.agree import agree_on_resume
from labswarm.train.distributed.context import LearnerContext
from labswarm.train.distributed.cursor import Chunk, GlobalCursor
from labswarm.train.distributed.data import TrainingSamples
from labswarm.train.distributed.frameworks.base import CommStats, Framework
from labswarm.train.distributed.producers import UnforkedLoop
from labswarm.train.distributed.record import ChunkRecord
from labswarm.train.distributed.steps import CursorSteps
from labswarm.train.loop import EpochSteps

log = logging.getLogger(__name__)

#: Seconds a learner waits for a chunk held by a live lease (asynchronous frameworks) before failing.
CLAIM_TIMEOUT_S = 300.0
#: Store prefix of the marks of learners that stopped (a halt): ``<prefix>/<attempt>/<rank>``.
HALTED = "labswarm/halted"


class DistributedTraining(UnforkedLoop):
    """One learner's part of a distributed training run: the trainer's loop hooks (module docstring).

    Args:
        framework: the framework spec (``{name: ..., **params}``, the manifest's ``framework``).
        context: the learner's rank, peers and addresses (default: :meth:`LearnerContext.from_env`).
        lease_s: the cursor's lease per chunk, in s (default 30: far longer than one step).
        chunk_log: this learner's chunk record (default ``<run dir>/../chunks-rank-<r>.jsonl``: beside the run
            folder, which a fresh start wipes; :mod:`labswarm.train.distributed.record`).

    Raises:
        ConfigError: an unknown framework or bad parameters, or a malformed environment.
    """

    several = True
    #: A halt asked during the last pass's validation or checkpoint stops the next pass before its first step.
    stops_between_epochs = True

    def __init__(self, framework: Mapping[str, Any], context: LearnerContext | None = None,
                 lease_s: float = 30.0, chunk_log: Path | None = None) -> None:
        super().__init__()
        self.framework = Framework.from_spec(framework)
        self.context = context if context is not None else LearnerContext.from_env()
        self.lease_s = lease_s
        self.cursor: GlobalCursor | None = None
        self.started = time.perf_counter()
        self.samples: TrainingSamples | None = None
        self._halted: int | None = None  # the pass a halt stopped this learner in
        self._comm_before = CommStats()  # this rank's communication before the checkpoint it resumed from
        self._joined = False
        self._chunks_path: Path | None = chunk_log  # this rank's chunk record (attach sets the default)

    @property
    def rank(self) -> int:
        """This learner's rank."""
        return self.context.rank

    @property
    def lockstep(self) -> bool:
        """Learners step together: all of them (synchronous frameworks), or those of one worker group (the
        framework's ``group_size`` > 1: the groups asynchronously, each in its own process group)."""
        return self.framework.synchronous or self.framework.group_size > 1

    @property
    def shared_validation(self) -> bool:
        """Every learner validates a shard of the validation split (module docstring, point 5): the framework's
        replicas are equal and the learners share a process group (the one :meth:`attach` joins)."""
        return self.lockstep and self.context.world_size > 1 and self.framework.equal_replicas

    @property
    def validation_shard(self) -> tuple[int, int]:
        """``(rank, world)`` under a shared validation, else the whole split (only rank 0 validates)."""
        return (self.rank, self.context.world_size) if self.shared_validation else (0, 1)

    @property
    def validates(self) -> bool:
        """Every rank under a shared validation, else rank 0 alone (module docstring, point 5)."""
        return self.shared_validation or self.rank == 0

    def run_folder(self, run_dir: Path) -> Path:
        """``<run dir>/rank-<r>``."""
        return run_dir / f"rank-{self.rank}"

    def validation_start(self, torch: Any, model: Any) -> None:
        """Before a shared validation: rank 0's parameters and buffers (batch-norm statistics) onto every rank;
        nothing when rank 0 validates alone.

        Raises:
            torch.distributed.DistError: a peer failed or hung (the collective timeout).
        """
        import torch.distributed as dist

        if not self.shared_validation:
            return
        with torch.no_grad():
            for tensor in model.state_dict().values():
                dist.broadcast(tensor, 0)

    def reduce_validation(self, torch: Any, matrix: np.ndarray, loss_sum: float) -> tuple[np.ndarray, float]:
        """A shared validation's sums over every rank: the confusion matrices ``(n_classes, n_classes)`` (int64
        counts; summed in float64, exact below 2**53) and the cross-entropy sums (nats); unchanged when rank 0
        validates alone.

        Raises:
            torch.distributed.DistError: a peer failed or hung (the collective timeout).
        """
        import torch.distributed as dist

        if not self.shared_validation:
            return matrix, loss_sum
        sums = torch.tensor([*matrix.ravel().tolist(), loss_sum], dtype=torch.float64)
        dist.all_reduce(sums)
        total = sums.numpy()
        return np.rint(total[:-1]).astype(np.int64).reshape(matrix.shape), float(total[-1])

    def _join(self) -> None:
        """Join this learner's process group once: all learners (synchronous frameworks), or its worker group
        alone (issue 23 item 3); none asynchronously."""
        if self._joined or not self.lockstep or self.context.world_size == 1:
            return
        if self.framework.synchronous:
            self.context.init_process_group("gloo")
        else:
            self.context.join_group(self.framework.group_size, "gloo")
        self._joined = True

    def agree(self, state: dict[str, Any] | None) -> dict[str, Any] | None:
        """In lockstep, the members of this learner's process group (joined here) resume from one position, the
        newest member's checkpoint (:func:`~labswarm.train.distributed.agree.agree_on_resume`); otherwise
        ``state``, this learner's own.

        Raises:
            torch.distributed.DistError: a member failed or did not join within the collective timeout.
        """
        self._join()
        return agree_on_resume(state, self.rank) if self._joined else state

    def attach(self, torch: Any, model: Any, optimizer: Any, train: Pipeline, output: str, run_dir: Path) -> Any:
        """Join the group (unless :meth:`agree` did), attach the framework, read the training features (of
        ``output``, the model's input) and open the cursor; this rank's chunks are recorded in :meth:`chunk_log`.

        Returns:
            The module to train through.

        Raises:
            PipelineError: no training sample could be read.
            torch.distributed.DistError: the peers did not join within the timeout.
        """
        self.started = time.perf_counter()
        self.start_fork_server()  # the validation's producers' fork server (if any) starts while the peers join
        self._join()
        module = self.framework.attach(model, optimizer, self.context)
        experiment = train.context.experiment
        settings = experiment.training
        size = next((b.config.size for b in train.blocks if b.name == "batch"), 32)  # the experiment's batch
        chunk = self.framework.learner_batch(size, self.context.world_size)  # ``batch: global``: size / N
        self.samples = TrainingSamples(experiment, train, output,
                                       keep_bytes=settings.keep_bytes if settings is not None else None)
        self.samples.batch_size = chunk  # what a step reads (the memory check of two batches)
        n = len(self.samples.load())
        log.info("rank %d: %d training samples, %.0f MB of features in memory%s; batches of %d", self.rank, n,
                 self.samples.nbytes / 1e6, " (streamed from the store)" if self.samples.streaming else "", chunk)
        self.cursor = GlobalCursor(self.context.store(), n, chunk,
                                   owner=record.owner(self.rank, self.context.attempt), lease_s=self.lease_s,
                                   seed=experiment.training_seed)
        self._chunks_path = self.chunk_log(run_dir)
        self.lr_scaling = lr_scaling.install(self.framework, optimizer, self.context.world_size,  # issue 23
                                             lr_scaling.steps_per_pass(n, chunk, self.context.world_size))
        return module

    def chunk_log(self, run_dir: Path) -> Path:
        """This rank's chunk record: the ``chunk_log`` given, else ``chunks-rank-<r>.jsonl`` beside ``run_dir``
        (the trainer's fresh start wipes the run folder; the record of a killed predecessor must stay)."""
        return self._chunks_path if self._chunks_path is not None else run_dir.parent / f"chunks-rank-{self.rank}.jsonl"

    @contextmanager
    def epoch(self, torch: Any, epoch: int, device: Any,
              partial: Mapping[str, Any] | None = None) -> Iterator[EpochSteps]:
        """One pass of the cursor, or what is left of it after a halt (``partial``: the stopped epoch's sums from
        the checkpoint; this rank's own continue the epoch's figures, another rank's are not used).

        Its steps' :meth:`~labswarm.train.loop.EpochSteps.after_epoch` adds to the epoch's record (``samples`` is
        this learner's) ``rank``, ``world_size``, ``chunks``, ``steps``, ``elapsed_s`` since :meth:`attach`,
        ``comm`` (the framework's cumulative :meth:`CommStats.as_dict`) and ``peer_wait_s``: in lockstep, the
        seconds this learner waited in the epoch's first collective for its peers to begin the epoch, i.e. for
        rank 0's validation and checkpoint of the epoch before; ``epoch_s`` and ``samples_per_s`` start after it,
        as the single-process trainer's leave validation out. A halt (a hook's ``should_stop``) ends the pass at
        a step boundary (module docstring, point 4).

        Raises:
            CursorError: the cursor's store failed, or no chunk came free in time (asynchronous frameworks).
            torch.distributed.DistError: a peer failed or hung in a collective (synchronous frameworks).
        """
        assert self.cursor is not None and self._chunks_path is not None, "attach() first"
        steps = CursorSteps(self, torch, epoch, device, partial)  # steps.py: a streaming learner reads ahead
        try:
            with ChunkRecord(self._chunks_path, self.cursor.owner) as steps.trained:
                yield steps
        finally:
            steps.close()

    def comm(self) -> CommStats:
        """This rank's communication over the whole run: the framework's :class:`CommStats` of this process added
        to those of the checkpoints it resumed from (bytes, syncs, every push's staleness)."""
        now, before = self.framework.stats, self._comm_before
        return CommStats(bytes_sent=before.bytes_sent + now.bytes_sent, syncs=before.syncs + now.syncs,
                         staleness=[*before.staleness, *now.staleness], divergence=now.divergence)

    def _claim(self, torch: Any, epoch: int, stop: bool, ahead: Chunk | None = None) -> tuple[Chunk | None, str]:
        """The next step's chunk and what to do: ``"train"`` (a ``None`` chunk: a lockstep filler), ``"end"``
        (the pass is done) or ``"halt"`` (``stop``: this learner's hooks asked; in lockstep any learner's, folded
        into the all-reduce of "who has a chunk", so all stop at the same step; a chunk claimed for it goes
        back). ``ahead``: the chunk claimed for this step during the last one (steps.py), else it is claimed now."""
        import torch.distributed as dist

        assert self.cursor is not None
        if not self.lockstep:
            if stop:
                if ahead is not None:
                    self.cursor.release(ahead)
                return None, "halt"  # before claiming: nothing held
            chunk = ahead if ahead is not None else self.cursor.claim(epoch, timeout_s=CLAIM_TIMEOUT_S)
            return chunk, "train" if chunk is not None else "end"
        chunk = ahead if ahead is not None else None if stop else self.cursor.claim_fresh(epoch)
        if chunk is None and not stop and not self.framework.synchronous:  # worker groups: a dead one's chunks
            chunk = self.cursor.claim_orphan(epoch, f"{self.rank}:")
        has, stops = chunk is not None, int(stop)
        if self._joined:
            flags = torch.tensor([int(has), stops])
            dist.all_reduce(flags)
            has, stops = int(flags[0]) > 0, int(flags[1])
        if stops:
            if chunk is not None:
                self.cursor.release(chunk)
            return None, "halt"
        return chunk, "train" if has else "end"

    def _halt(self, epoch: int, sums: Mapping[str, Any]) -> None:
        """This learner stopped in pass ``epoch``: noted for :meth:`state_dict` and, in the job's store, for
        rank 0 (``labswarm/halted/<attempt>/<rank>``)."""
        assert self.cursor is not None
        self._halted = epoch
        log.info("rank %d stopped in epoch %d after step %d", self.rank, epoch + 1, sums["steps"])
        self.cursor.store.set(f"{HALTED}/{self.context.attempt}/{self.rank}", str(epoch))

    def _cursor_state(self) -> dict[str, Any]:
        """The cursor's state for rank 0's checkpoint. In lockstep every learner is past its last ``done`` when
        rank 0 reads it (the all-reduce of "who has a chunk" that ended the pass, or stopped it), so every lease
        in it is a chunk claimed for a step the checkpoint does not hold: free, in every pass. After a halt that
        is the stopped pass's (each learner released its own; this covers the race with that); at an epoch's end
        it is a peer's first chunk of the next pass, claimed before it waits in that pass's first collective while
        rank 0 validates: kept as a lease, ``claim_fresh`` (which never takes a lease over) would skip it after a
        restart from this checkpoint and its samples would go untrained in that pass. Asynchronous learners stop on
        their own: wait (up to ``lease_s``) until each has stopped, so that no chunk is marked done after the
        state is read (it would be trained again after the resume); a dead one's lease stays and expires."""
        assert self.cursor is not None
        if self._halted is not None and not self.framework.synchronous and self.context.world_size > 1:
            keys = [f"{HALTED}/{self.context.attempt}/{r}" for r in range(self.context.world_size)]
            try:
                self.cursor.store.wait(keys, timedelta(seconds=self.lease_s))
            except Exception as exc:  # DistStoreError: a peer still training or dead
                log.warning("not every learner stopped within %.0f s (%s): the cursor's state is read anyway",
                            self.lease_s, exc)
        state = self.cursor.state_dict()
        if self.framework.synchronous:
            state["passes"] = {p: ["" if v.startswith("L|") else v for v in values]
                               for p, values in state["passes"].items()}
        return state

    def state_dict(self) -> dict[str, Any]:
        """The framework's state and, on rank 0, the cursor's (the coordinator writes it back into a new store
        with :meth:`~labswarm.train.distributed.launch.JobCoordinator.restore_cursor` before a restarted attempt)."""
        comm = self.comm()
        out: dict[str, Any] = {"rank": self.rank, "framework": self.framework.state_dict(),
                               "comm": {"bytes_sent": comm.bytes_sent, "syncs": comm.syncs,
                                        "staleness": comm.staleness}}
        if self.rank == 0 and self.cursor is not None:
            out["cursor"] = self._cursor_state()
        return out

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore the framework's state and this rank's running communication totals from a checkpoint's
        :meth:`state_dict` (after :meth:`attach`). Another rank's checkpoint (``rank`` differs: an asynchronous
        rank without its own copy) gives no totals: this rank's start from zero.

        Raises:
            ConfigError: the checkpoint's cursor has another chunk size than this learner's batch.
        """
        cursor = state.get("cursor")
        if cursor is not None and self.cursor is not None and int(cursor["chunk_size"]) != self.cursor.chunk_size:
            raise ConfigError([("framework.batch", (
                f"the checkpoint's cursor cut the passes into chunks of {cursor['chunk_size']} samples, this run's "
                f"learners step on {self.cursor.chunk_size}: resume with the batch setting it was trained with "
                "(batch: per_learner for a job started before batch: global was the default)"))])
        self.framework.load_state_dict(state["framework"])
        comm = state.get("comm")
        if comm is not None and state.get("rank") == self.rank:
            self._comm_before = CommStats(bytes_sent=int(comm["bytes_sent"]), syncs=int(comm["syncs"]),
                                          staleness=[int(v) for v in comm["staleness"]])

    def finish(self) -> None:
        """Training ended: this rank is marked finished in the job's store (a halting rank 0 waits for every
        peer to stop or finish before it reads the cursor), then the framework's last sync, then its hook and the
        process group (synchronous frameworks; a worker group's lives to the process's exit) are released."""
        import torch.distributed as dist

        if self.cursor is not None and self.context.world_size > 1:  # it marks no more chunks: a halting rank 0
            self.cursor.store.set(f"{HALTED}/{self.context.attempt}/{self.rank}", "end")  # need not wait for it
            rank0_wait.begun(self, "end")  # rank 0's last validation is done: its peers' last sync may start
            rank0_wait.wait(self, "end")
        self.framework.finish()
        self.framework.close()
        if self._joined and dist.is_initialized() and self.framework.synchronous:
            dist.destroy_process_group()
        # A worker group's process group is left to the process's exit: its last collective is the framework's
        # finish (downpour's broadcast), and gloo's worker thread then frees that work's tensors, which needs the
        # interpreter lock; destroyed at once (DDP's reducer dropping the last reference, under the lock), the group
        # joins that thread: a deadlock, seen as members that never exited (~ProcessGroupGloo in std::thread::join,
        # the worker in TensorImpl::decref_pyobject, py-spy --native, torch 2.13)
        self._joined = False

