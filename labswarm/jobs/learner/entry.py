"""The learner: one training process of a job, ``python -m labswarm.jobs.learner.entry SPEC.json``.

The lifecycle manager writes a :class:`~labswarm.jobs.learner.context.LearnerSpec` (JSON) per learner and starts
this module with the file's path as its argument (or in ``LABSWARM_LEARNER_SPEC``); the API token comes from
``LABSWARM_API_TOKEN``, never from the file. The learner

- captures its own output (file descriptors 1 and 2, so its child processes' too) into
  ``<workdir>/learner-<rank>.log`` and sends each line to the manager
  (:class:`~labswarm.jobs.learner.reporter.JobReporter`),
  with its metrics, phases and heartbeats;
- trains: framework ``labswarm`` runs :class:`~labswarm.train.trainer.Trainer` with hooks that commit each
  checkpoint to the results store (:mod:`labswarm.jobs.spec.layout`), then store the model; framework ``command`` runs
  the user's program (:mod:`labswarm.jobs.learner.command`);
- starts from the checkpoint the spec names (a restart or a resume), else from scratch;
- halts cooperatively on SIGTERM (or a halt the manager answers a report with): the step in progress ends, a
  checkpoint is committed, the log is flushed, and the learner exits with :data:`EXIT_HALTED`. A halt must signal
  the learner's pid only: its process group holds the data-loading processes, which a SIGTERM would kill.

Exit codes: 0 trained (the model is stored), :data:`EXIT_HALTED` halted with a checkpoint, :data:`EXIT_USER` the
experiment or its data is invalid (the user's fault: list it in ``restart.user_exit_codes``, as the default
does), :data:`EXIT_STORAGE` the results store failed, :data:`EXIT_PLATFORM` any other error. A ``command``
learner exits with its program's code (``128 + N`` for a signal N).

Distributed learners (``learners: N`` with a distributed framework): the lifecycle sets each learner's place in
the job in its environment (:mod:`labswarm.train.distributed.context`: ``RANK``, ``WORLD_SIZE``,
``MASTER_ADDR``/``PORT``,
``LABSWARM_ATTEMPT``, ``LABSWARM_PS_ADDRS``) and the learner runs the trainer with
:class:`~labswarm.train.distributed.training.DistributedTraining`. Every rank reports its log, progress and heartbeats
and
checkpoints its own replica (:func:`~labswarm.jobs.spec.layout.rank_checkpoint_key`); rank 0 alone reports the epoch
metrics, commits the checkpoint pointer (its checkpoint carries the global cursor) and stores the model. A halt
takes effect at the next step boundary, where the learners of a synchronous framework agree on it in the
lockstep's all-reduce (:mod:`labswarm.train.distributed.training`), with a mid-epoch checkpoint per rank; one that comes
after an epoch's last step stops the next pass before its first step (the same mid-epoch checkpoint, at step 0).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from labswarm.config.experiment import ExperimentConfig
from labswarm.config.manifest import CommandFramework, DistributedFramework
from labswarm.deploy.learners import EXIT_FILE
from labswarm.deploy.resource_limits import (
    LIMITS_ENV,
    MEMORY_ENV,
    apply_memory_limit,
    lift_memory_limit,
    out_of_memory,
    watch_native_exit,
)
from labswarm.errors import ConfigError, DatasetError, StorageError
from labswarm.jobs.learner.command import run_command
from labswarm.jobs.learner.context import LearnerContext, LearnerSpec, load_spec
from labswarm.jobs.learner.hooks import JobHooks
from labswarm.jobs.learner.parent import fetch_parent
from labswarm.jobs.spec import layout
from labswarm.jobs.spec.errors import EXIT_HALTED, EXIT_MEMORY, EXIT_PLATFORM, EXIT_STORAGE, EXIT_USER
from labswarm.storage.base import MissingObject
from labswarm.train.distributed.single import UnforkedSingleLearner
from labswarm.train.loop import LoopHooks
from labswarm.train.trainer import Trainer

if TYPE_CHECKING:
    from labswarm.train.distributed.training import DistributedTraining

log = logging.getLogger("labswarm.learner")

#: The environment variable naming the spec file when no argument does.
SPEC_ENV = "LABSWARM_LEARNER_SPEC"
#: Seconds a distributed learner's claim on a chunk of the global cursor lasts (one step per chunk): a dead
#: learner's chunks go back to the others after this long.
LEASE_S = 10.0
#: Times a learner looks for the checkpoint to start from when the one it was given was replaced meanwhile.
RESTORE_TRIES = 5

__all__ = ["EXIT_HALTED", "EXIT_PLATFORM", "EXIT_STORAGE", "EXIT_USER", "Learner", "LearnerSpec", "OutputCapture",
           "load_spec", "main"]


class OutputCapture:
    """Redirects file descriptors 1 and 2 into a pipe; a thread appends each line to ``log_path`` and hands it to
    ``on_line``. Child processes inherit the pipe, so their output is captured too.

    The thread must not log (its lines would come back through the pipe): it only writes the file and calls
    ``on_line``.
    """

    def __init__(self, log_path: Path, on_line: Callable[[str], None]) -> None:
        self.log_path = log_path
        self.on_line = on_line
        self._saved: tuple[int, int] | None = None
        self._thread: threading.Thread | None = None
        self._sentinel = f"labswarm-capture-end-{os.getpid()}-{id(self)}\n".encode()

    def start(self) -> None:
        """Start capturing."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        read, write = os.pipe()
        self._saved = (os.dup(1), os.dup(2))
        os.dup2(write, 1)
        os.dup2(write, 2)
        os.close(write)
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(AttributeError, ValueError):
                stream.reconfigure(line_buffering=True)  # type: ignore[union-attr]
        self._thread = threading.Thread(target=self._pump, args=(read,), name="labswarm-output", daemon=True)
        self._thread.start()

    def _pump(self, fd: int) -> None:
        with open(fd, "rb") as source, open(self.log_path, "ab") as sink:
            for raw in source:
                if raw == self._sentinel:
                    return
                sink.write(raw)
                sink.flush()
                self.on_line(raw.decode("utf-8", "replace").rstrip("\r\n"))

    def stop(self, timeout: float = 5.0) -> None:
        """Stop capturing (the descriptors are restored) and wait, up to ``timeout`` seconds, for the lines already
        written to be handed on. A sentinel line written last marks the end: child processes that still hold the
        pipe (multiprocessing's resource tracker lives until the interpreter exits) cannot delay it."""
        if self._saved is None:
            return
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(ValueError, OSError):
                stream.flush()
        with contextlib.suppress(OSError):
            os.write(1, self._sentinel)
        os.dup2(self._saved[0], 1)
        os.dup2(self._saved[1], 2)
        for fd in self._saved:
            os.close(fd)
        self._saved = None
        if self._thread is not None:
            self._thread.join(timeout)


class Learner(LearnerContext):
    """One learner process's parts: spec, manifest, the job's results store, reporter, output capture, and the
    halt event set by SIGTERM or by the manager.

    Args:
        spec: the learner's spec.
        token: the API token; default ``LABSWARM_API_TOKEN``.
    """

    def __init__(self, spec: LearnerSpec, token: str | None = None) -> None:
        super().__init__(spec, token)
        self.capture = OutputCapture(self.log_path, self.reporter.log)

    def run(self) -> int:
        """Capture the output, train, store, report; returns the exit code (see the module docstring)."""
        self.capture.start()
        _log_to_stderr()
        self.reporter.start()
        log.info("learner %d/%d of job %s, attempt %d, pid %d, %s", self.spec.rank, self.spec.world_size,
                 self.spec.job_id, self.spec.attempt, os.getpid(),
                 f"from checkpoint {self.spec.checkpoint['key']}" if self.spec.checkpoint else "from scratch")
        if os.environ.get(LIMITS_ENV):  # how the launcher enforces resources (labswarm.deploy.local_learners)
            log.info("resources enforced by %s", os.environ[LIMITS_ENV])
        try:
            if apply_memory_limit() is not None:  # resources.memory_mb, once the modules are imported
                watch_native_exit(self._native_exit)  # libgomp's exit(1) when a thread's stack does not fit
            code = self._train()
        except (ConfigError, DatasetError) as exc:
            log.error("the experiment cannot be trained: %s", exc)
            # the learner's data does not fit its memory limit (train/distributed/data.py): the over-memory C107
            memory = isinstance(exc, ConfigError) and any(path == "resources.memory_mb" for path, _ in exc.errors)
            code = EXIT_MEMORY if memory else EXIT_USER
        except StorageError as exc:
            log.error("results store: %s", exc)
            code = EXIT_STORAGE
        except Exception as exc:
            if out_of_memory(exc):
                lift_memory_limit()  # room to log, report and exit
                log.error("the learner went over its memory limit (resources.memory_mb: %s MiB): %s",
                          os.environ.get(MEMORY_ENV), exc)
                code = EXIT_MEMORY
            else:
                log.exception("the learner failed")
                code = EXIT_PLATFORM
        return self._finish(code)

    def _finish(self, code: int) -> int:
        """Log ``code``, stop capturing, store the log, close the reporter; returns ``code``."""
        log.info("learner exits with code %d", code)
        self.capture.stop()
        with contextlib.suppress(StorageError):
            self.upload_log()
        self.reporter.close()
        return code

    def _native_exit(self, message: str) -> int:
        """A native library ended the process with the address space full (see
        :func:`~labswarm.deploy.resource_limits.watch_native_exit`): the over-memory exit, C107."""
        log.error("the learner went over its memory limit (resources.memory_mb: %s MiB): %s",
                  os.environ.get(MEMORY_ENV), message)
        with contextlib.suppress(OSError):
            (self.workdir / EXIT_FILE).write_text(json.dumps({"code": EXIT_MEMORY}))
        return self._finish(EXIT_MEMORY)

    def _train(self) -> int:
        if isinstance(self.manifest.framework, CommandFramework):
            return run_command(self)
        return self._train_labswarm()

    def _train_labswarm(self) -> int:
        experiment = self.manifest.experiment
        if not isinstance(experiment, ExperimentConfig):
            raise ConfigError([("experiment", "the learner needs the experiment inline (a resolved manifest)")])
        training = fetch_parent(self.manifest.training_config(), self.workdir)  # init_from {job: ID}: its model
        config = experiment.model_copy(update={"training": training})
        distributed = None
        # one learner: the training split read as `labswarm train` and the distributed learners read it (in memory
        # or streamed from the store: labswarm.train.distributed.single), the validation's producers from a fork
        # server (this process runs the reporter's and output threads: a child forked from it could deadlock on a
        # lock one of them held)
        loop: LoopHooks = UnforkedSingleLearner()
        if isinstance(self.manifest.framework, DistributedFramework):
            from labswarm.train.distributed.training import DistributedTraining

            # its place in the job from the environment the lifecycle set (labswarm.train.distributed.context)
            # its chunk record outside the trainer's run folder (a fresh start wipes that): in the working folder,
            # or a swarm learner's on the shared volume; a killed process's lines stay for its successor, or for
            # the manager to store, and a fresh folder starts from the rank's stored record
            distributed = DistributedTraining(self.manifest.framework.model_dump(mode="json"), lease_s=LEASE_S,
                                              chunk_log=self.open_chunk_record())
            loop = distributed
        trainer = Trainer(config, self.workdir / "home", hooks=[JobHooks(self)], distributed=loop)
        resume = self._restore(trainer, distributed)
        result = trainer.fit(resume=resume)
        if result.stopped:
            log.info("halted in epoch %d with a checkpoint", len(result.metrics) + 1)
            return EXIT_HALTED
        if self.spec.rank == 0:
            self.reporter.event("phase", {"phase": "storing"})
            self.storage.put_file(layout.MODEL_KEY, result.model_path)
            log.info("model stored in %s", self.storage.describe(layout.MODEL_KEY))
        return 0

    def _restore(self, trainer: Trainer, distributed: DistributedTraining | None) -> bool:
        """Download the spec's checkpoint and the metrics up to it; report those metrics again (the manager keeps
        each epoch once). ``True`` when there is one to resume from. ``distributed``: the trainer's loop hooks
        when the job is distributed (an asynchronous rank restores its own newest copy)."""
        from labswarm.train import checkpoint

        pointer = self.spec.checkpoint
        if pointer is None:
            return False
        trainer.checkpoint_path.parent.mkdir(parents=True, exist_ok=True)
        for tries_left in range(RESTORE_TRIES - 1, -1, -1):
            mine = layout.rank_checkpoint_key(pointer["key"], self.spec.rank)
            if self.spec.rank and distributed is not None and not distributed.framework.synchronous:
                # an asynchronous rank (or worker group) stopped at its own step: its newest copy (its totals go on)
                mine = layout.latest_rank_copy(self.storage, self.spec.rank, int(pointer["epoch"])) or mine
            try:  # a distributed job's rank r: its own copy, else rank 0's (the replicas of a sync framework agree)
                self.storage.get_file(mine, trainer.checkpoint_path)
                log.info("restored from %s", mine)
                break
            except MissingObject:
                pass
            try:
                self.storage.get_file(pointer["key"], trainer.checkpoint_path)
                break
            except MissingObject:
                # a learner restarted alone while its peers train: rank 0 committed a newer checkpoint and
                # deleted the one the spec names since the restart was decided; take the newest
                newer = layout.latest_checkpoint(self.storage)
                if not tries_left or newer is None or newer["key"] == pointer["key"]:
                    raise
                pointer = newer
        if self.spec.rank != 0:
            return True  # rank 0 alone keeps and reports the job's metrics
        with contextlib.suppress(MissingObject):
            self.storage.get_file(layout.METRICS_KEY, trainer.metrics_path)
        for record in checkpoint.read_metrics(trainer.metrics_path):
            if int(record.get("epoch", 0)) <= int(pointer["epoch"]):
                self.reporter.metric(record, key=f"epoch:{record['epoch']}")
        return True


def _log_to_stderr() -> None:
    """Logging records to stderr (captured), one line each."""
    root = logging.getLogger()
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    for chatty in ("httpx", "httpcore"):  # one line per report would be reported again: an endless echo
        logging.getLogger(chatty).setLevel(logging.WARNING)


def main(argv: list[str] | None = None) -> int:
    """Entry point: ``python -m labswarm.jobs.learner.entry [SPEC.json]``; returns the exit code."""
    argv = sys.argv[1:] if argv is None else argv
    path = argv[0] if argv else os.environ.get(SPEC_ENV)
    if not path:
        print(f"usage: python -m labswarm.jobs.learner.entry SPEC.json (or {SPEC_ENV})", file=sys.stderr)
        return EXIT_PLATFORM
    try:
        learner = Learner(load_spec(path))
    except (ConfigError, StorageError) as exc:
        print(f"invalid learner spec: {exc}", file=sys.stderr)
        return EXIT_PLATFORM
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: learner.halt.set())
    code = learner.run()
    with contextlib.suppress(OSError):  # for a manager that is not this process's parent (it restarted)
        (learner.workdir / EXIT_FILE).write_text(json.dumps({"code": code}))
    return code


if __name__ == "__main__":
    status = main()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    # everything is stored and reported: skip the interpreter's finalization (2-3 s of torch and thread teardown
    # measured here, during which the job would wait); the manager cleans up the process group
    os._exit(status)
