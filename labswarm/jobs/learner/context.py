"""What a learner's parts share (the trainer's job hooks, :mod:`labswarm.jobs.learner.hooks`; the ``command``
framework, :mod:`labswarm.jobs.learner.command`; the process itself, :mod:`labswarm.jobs.learner.entry`): the
learner's spec as the lifecycle wrote it, and its context (manifest, results store, working folder, reporter, halt
event) with the two things every part does with the results store: commit a checkpoint, upload the log.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from labswarm.config.manifest import JobManifest, parse_manifest
from labswarm.deploy.learners import CHUNKS_FILE, TOKEN_ENV
from labswarm.errors import ConfigError, format_loc
from labswarm.jobs.learner.reporter import JobReporter
from labswarm.jobs.spec import layout
from labswarm.storage.base import MissingObject, Storage


class LearnerSpec(BaseModel):
    """Everything one learner needs, written by the lifecycle manager as JSON.

    Attributes:
        job_id: the job.
        attempt: the attempt number, from 1 (a restart or a resume is a new one).
        rank: this learner's rank in ``[0, world_size)``.
        world_size: the attempt's learners (1 for now).
        master_addr: the rendezvous host of distributed learners (``MASTER_ADDR``); ``None`` for one learner.
        master_port: the rendezvous port (``MASTER_PORT``).
        manifest: the resolved manifest (:meth:`JobManifest.resolved`: the experiment inline, the training
            settings merged).
        manager_url: where to report.
        results_store: the results store's spec (its ``jobs/<job_id>`` folder is the job's).
        checkpoint: the committed checkpoint pointer to start from (:func:`labswarm.jobs.spec.layout.latest_checkpoint`
            at deploy time); ``None``: from scratch.
        workdir: this learner's local working folder (created).
        chunk_log: where a distributed learner keeps its chunk record (:mod:`labswarm.train.distributed.record`);
            default ``<workdir>/chunks.jsonl``. A swarm learner's is on the shared data volume, so that it outlives
            the container (:func:`labswarm.deploy.swarm_learners.chunk_record_path`).
        heartbeat_s: the longest time between two reports, in seconds.
        report_interval_s: seconds between reports while events wait.
        progress_s: the shortest time between two ``progress`` events, in seconds (each epoch's end sends one
            too); default 1.0 (:class:`~labswarm.jobs.learner.reporter.JobReporter`).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    job_id: str = Field(pattern=r"^[a-z0-9][a-z0-9-]{0,63}$")
    attempt: int = Field(ge=1)
    rank: int = Field(0, ge=0)
    world_size: int = Field(1, ge=1)
    master_addr: str | None = None
    master_port: int | None = Field(None, ge=1, le=65535)
    manifest: dict[str, Any]
    manager_url: str
    results_store: dict[str, Any]
    checkpoint: dict[str, Any] | None = None
    workdir: Path
    chunk_log: Path | None = None
    heartbeat_s: float = Field(1.0, gt=0)
    report_interval_s: float = Field(0.2, gt=0)
    progress_s: float = Field(1.0, gt=0)

    @model_validator(mode="after")
    def _rank(self) -> LearnerSpec:
        if self.rank >= self.world_size:
            raise ValueError(f"rank {self.rank} is not below world_size {self.world_size}")
        return self

    def parsed_manifest(self) -> JobManifest:
        """The manifest, validated.

        Raises:
            ConfigError: it does not validate.
        """
        return parse_manifest(self.manifest, source="learner spec")


def load_spec(path: str | Path) -> LearnerSpec:
    """Read a spec file.

    Raises:
        ConfigError: unreadable, not JSON, or invalid (each field named).
    """
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        return LearnerSpec.model_validate(data)
    except OSError as exc:
        raise ConfigError([("", f"cannot read {path}: {exc.strerror or exc}")], source=str(path)) from None
    except ValueError as exc:
        errors = ([(format_loc(e["loc"]), e["msg"]) for e in exc.errors()] if isinstance(exc, ValidationError)
                  else [("", f"not JSON: {exc}")])
        raise ConfigError(errors, source=str(path)) from None


class LearnerContext:
    """One learner's spec, manifest, the job's results store, its working folder, reporter, and the halt event
    set by SIGTERM or by the manager.

    Args:
        spec: the learner's spec.
        token: the API token; default ``LABSWARM_API_TOKEN`` (:data:`~labswarm.deploy.learners.TOKEN_ENV`).
    """

    def __init__(self, spec: LearnerSpec, token: str | None = None) -> None:
        self.spec = spec
        self.manifest = spec.parsed_manifest()
        self.storage: Storage = layout.job_storage(spec.results_store, spec.job_id)
        self.workdir = spec.workdir
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.log_path = self.workdir / f"learner-{spec.rank}.log"
        self.chunks_path: Path | None = None  # a distributed learner's chunk log (labswarm.train.distributed.training)
        self.halt = threading.Event()
        token = token if token is not None else os.environ.get(TOKEN_ENV)
        self.reporter = JobReporter(spec.manager_url, job_id=spec.job_id, attempt=spec.attempt, rank=spec.rank,
                                    token=token, halt=self.halt, interval=spec.report_interval_s,
                                    heartbeat_s=spec.heartbeat_s, progress_s=spec.progress_s)

    def commit(self, key: str, epochs_done: int, step: int | None, kind: str = "file") -> dict[str, Any]:
        """Write the pointer to the checkpoint ``key`` (already stored, with the metrics), report it, and delete
        this attempt's checkpoints it replaces."""
        pointer = layout.commit_checkpoint(self.storage, key, attempt=self.spec.attempt, epochs_done=epochs_done,
                                           step=step, kind=kind)
        self.reporter.event("checkpoint", pointer)
        prefix = layout.attempt_prefix(self.spec.attempt)
        for old in self.storage.list(prefix):
            if old != key and not old.startswith(key + "/") and not layout.is_rank_copy(old):
                self.storage.delete(old)
        return pointer

    def open_chunk_record(self) -> Path:
        """Where this distributed learner keeps its chunk record: the spec's ``chunk_log``, else
        ``<workdir>/chunks.jsonl``; kept as :attr:`chunks_path` (:meth:`upload_log` stores it). A learner that finds
        no record there (a fresh working folder: a learner replaced in a new container or on another node) first
        fetches the one its rank stored in this attempt, so that its own uploads, which replace that object, keep
        its predecessor's lines.

        Raises:
            StorageError: the results store failed (a record never stored is not an error).
        """
        path = self.spec.chunk_log or self.workdir / CHUNKS_FILE
        if not path.is_file():
            with contextlib.suppress(MissingObject):
                self.storage.get_file(layout.chunks_key(self.spec.attempt, self.spec.rank), path)
        self.chunks_path = path
        return path

    def upload_log(self) -> None:
        """Store this learner's log file as ``logs/attempt-<n>/learner-<rank>.log`` (and a distributed learner's
        chunk log as ``logs/attempt-<n>/chunks-<rank>.jsonl``)."""
        if self.log_path.is_file():
            self.storage.put_file(layout.log_key(self.spec.attempt, self.spec.rank), self.log_path)
        if self.chunks_path is not None and self.chunks_path.is_file():
            self.storage.put_file(layout.chunks_key(self.spec.attempt, self.spec.rank), self.chunks_path)
