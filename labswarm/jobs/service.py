"""The training-jobs service, independent of HTTP: submit, inspect, halt, resume and delete jobs; take the
learners' reports; read a job's events, logs, metrics and model.

The manager hosts it beside the session service (it uses that service's database and experiment registry). Its
:class:`~labswarm.jobs.lifecycle.JobLifecycle` thread runs the queue, deploys learners, watches them and
restarts them. Every change of a job happens under one lock and in one transaction with the event that tells it.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import uuid
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import func, or_, select
from sqlalchemy.orm import Session

from labswarm.config import ExperimentConfig
from labswarm.datasets.folder import read_clips
from labswarm.errors import ConfigError, Conflict, DatasetError, NotFound, StorageError
from labswarm.jobs import events, layout
from labswarm.jobs.errors import ErrorCode
from labswarm.jobs.lifecycle import JobLifecycle
from labswarm.jobs.manifest import JobManifest, LabswarmFramework, parse_manifest
from labswarm.jobs.models import AttemptRow, JobEventRow, JobRow, LearnerRow, naive_utcnow
from labswarm.jobs.states import HOLDS_SLOTS, JobState
from labswarm.jobs.storage.base import MissingObject, Storage
from labswarm.paths import check_manifest_paths
from labswarm.sessions.service import SessionService


class JobService:
    """Owns the training jobs: their rows and events, the lifecycle thread and the learner processes.

    Args:
        sessions: the session service whose database and experiment registry the jobs use; the URL at which
            learners reach the manager is the one the serving process advertises to it.
    """

    def __init__(self, sessions: SessionService) -> None:
        import labswarm.jobs.models  # noqa: F401  (the tables on the shared Base)

        self.sessions = sessions
        self.settings = sessions.settings
        self.db = sessions.db
        self.home = self.settings.home / "jobs"
        self.lock = threading.RLock()
        self.lifecycle = JobLifecycle(self)

    @property
    def manager_url(self) -> str | None:
        """The manager's URL as learners on this machine reach it; ``None`` while it is not served."""
        return self.sessions.launchers.host.manager_url

    def start(self) -> None:
        """Start the lifecycle thread: it re-attaches to the learners a previous manager left running."""
        self.lifecycle.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the lifecycle thread; learners keep running (a restarted manager re-attaches to them)."""
        self.lifecycle.stop(timeout)

    # submit
    def validate(self, data: Mapping[str, Any] | str) -> tuple[JobManifest, ExperimentConfig]:
        """Check a manifest, the experiment it trains and its stores, without creating anything.

        Returns:
            The manifest and the experiment (registered or inline).

        Raises:
            ConfigError: every problem with the path of its field: the manifest, an unregistered experiment,
                training settings, an unreadable dataset, an unreachable store.
        """
        manifest = parse_manifest(data, source="manifest")
        check_manifest_paths(manifest, self.sessions.registry.roots)  # before any file is opened or created
        if isinstance(manifest.experiment, ExperimentConfig):
            experiment = manifest.experiment
        else:
            try:
                experiment = self.sessions.registry.config(manifest.experiment)
            except NotFound:
                raise ConfigError([("experiment", f"no registered experiment {manifest.experiment!r}: register "
                                                  "it, or give it inline")]) from None
        manifest.training_config(experiment)
        problems = []
        if isinstance(manifest.framework, LabswarmFramework):
            try:
                read_clips(experiment.dataset.root, experiment.dataset.labels_path)
            except DatasetError as exc:
                problems.append(("experiment.dataset", str(exc)))
        for field in ("results_store", "data_store"):
            spec = getattr(manifest, field)
            if spec is not None:
                try:
                    Storage.from_spec(spec).reachable()
                except StorageError as exc:
                    problems.append((field, str(exc)))
        if problems:
            raise ConfigError(problems)
        return manifest, experiment

    def create(self, data: Mapping[str, Any] | str) -> JobRow:
        """Validate and queue a job (an inline experiment is registered first).

        Raises:
            ConfigError: see :meth:`validate`.
        """
        manifest, experiment = self.validate(data)
        if isinstance(manifest.experiment, ExperimentConfig):
            self.sessions.registry.register(experiment.model_dump(mode="json"))
        now = naive_utcnow()
        job = JobRow(id=uuid.uuid4().hex[:12], name=manifest.name, status=JobState.QUEUED.value,
                     priority=manifest.priority, experiment=experiment.name, manifest=manifest.resolved(experiment),
                     learners=manifest.learners, timestamps={"queued": events.iso(now)}, submitted_at=now,
                     updated_at=now, next_seq=1, attempt=0, restarts_user=0, restarts_platform=0)
        with self.lock, self.db() as db:
            db.add(job)
            db.flush()  # the job's row before its first event (no relationship tells the order)
            events.append(db, job, "status", {"status": "queued", "previous": None, "reason": "submitted"})
            db.commit()
        self.lifecycle.wake()
        return job

    # read
    def get(self, db: Session, job_id: str) -> JobRow:
        """The job's row.

        Raises:
            NotFound: no such job.
        """
        job = db.get(JobRow, job_id)
        if job is None:
            raise NotFound(f"no job {job_id!r}")
        return job

    def describe(self, job_id: str) -> dict[str, Any]:
        """Everything about one job: status, reason, error, timestamps per phase, restarts, checkpoint, queue
        position, attempts, the learners' progress, and the log tail of a failed job.

        Raises:
            NotFound: no such job.
        """
        with self.db() as db:
            job = self.get(db, job_id)
            out = self._summary(db, job)
            out["manifest"] = job.manifest
            out["attempts"] = self.attempts(job_id, db=db)
            learners = db.scalars(select(LearnerRow).where(LearnerRow.job_id == job_id,
                                                           LearnerRow.attempt == job.attempt))
            out["progress"] = {str(lr.rank): lr.progress for lr in learners if lr.progress}
            if job.status == JobState.FAILED.value:
                out["log_tail"] = events.log_tail(db, job_id)
            return out

    def list(self, *, status: list[str] | None = None, name: str | None = None, offset: int = 0,
             limit: int = 50) -> dict[str, Any]:
        """A page of jobs, newest first: ``{jobs, total, offset, limit}``."""
        with self.db() as db:
            query = select(JobRow)
            if status:
                query = query.where(JobRow.status.in_(status))
            if name:
                query = query.where(JobRow.name == name)
            total = db.scalar(select(func.count()).select_from(query.subquery()))
            rows = db.scalars(query.order_by(JobRow.submitted_at.desc(), JobRow.id).offset(offset).limit(limit))
            return {"jobs": [self._summary(db, job) for job in rows], "total": total, "offset": offset,
                    "limit": limit}

    def _summary(self, db: Session, job: JobRow) -> dict[str, Any]:
        code = ErrorCode(job.error_code) if job.error_code else None
        return {"id": job.id, "name": job.name, "status": job.status, "reason": job.reason,
                "error_code": job.error_code, "error": code.text if code else None,
                "fault": code.fault.value if code else None, "experiment": job.experiment,
                "priority": job.priority, "learners": job.learners, "attempt": job.attempt,
                "restarts": {"user": job.restarts_user, "platform": job.restarts_platform},
                "checkpoint": job.checkpoint, "timestamps": job.timestamps,
                "submitted_at": events.iso(job.submitted_at), "updated_at": events.iso(job.updated_at),
                "queue_position": self._queue_position(db, job)}

    def _queue_position(self, db: Session, job: JobRow) -> int | None:
        """1 for the next queued job to start; ``None`` when the job is not queued."""
        if job.status != JobState.QUEUED.value:
            return None
        ahead = db.scalar(select(func.count()).select_from(JobRow).where(
            JobRow.status == JobState.QUEUED.value,
            or_(JobRow.priority > job.priority,
                (JobRow.priority == job.priority) & (JobRow.submitted_at < job.submitted_at))))
        return int(ahead or 0) + 1

    def attempts(self, job_id: str, db: Session | None = None) -> list[dict[str, Any]]:
        """The job's attempts, first first: number, start, end, exit code, error code, reason, checkpoint in and
        out, and where each learner ran (host, pid, GPUs).

        Raises:
            NotFound: no such job.
        """
        if db is None:
            with self.db() as db:
                return self.attempts(job_id, db)
        self.get(db, job_id)
        learners: dict[int, list[dict[str, Any]]] = {}
        for lr in db.scalars(select(LearnerRow).where(LearnerRow.job_id == job_id).order_by(LearnerRow.rank)):
            learners.setdefault(lr.attempt, []).append(
                {"rank": lr.rank, "host": lr.host, "pid": lr.pid, "gpus": lr.gpus, "exit_code": lr.exit_code,
                 "killed": lr.killed, "workdir": lr.workdir})
        rows = db.scalars(select(AttemptRow).where(AttemptRow.job_id == job_id).order_by(AttemptRow.number))
        return [{"number": a.number, "started_at": events.iso(a.started_at), "ended_at": events.iso(a.ended_at),
                 "exit_code": a.exit_code,
                 "error_code": a.error_code, "reason": a.reason, "checkpoint_in": a.checkpoint_in,
                 "checkpoint_out": a.checkpoint_out, "learners": learners.get(a.number, [])} for a in rows]

    def events(self, job_id: str, after: int = 0, limit: int = 500) -> tuple[list[JobEventRow], bool]:
        """The job's events with a sequence number above ``after``, in order, and whether the job is terminal.

        Raises:
            NotFound: no such job.
        """
        with self.db() as db:
            job = self.get(db, job_id)
            rows = list(db.scalars(select(JobEventRow).where(JobEventRow.job_id == job_id, JobEventRow.seq > after)
                                   .order_by(JobEventRow.seq).limit(limit)))
            return rows, job.status in (JobState.COMPLETED.value, JobState.FAILED.value)

    def logs(self, job_id: str, *, since: datetime | None = None, pos: int = 0,
             pagesize: int = 100) -> dict[str, Any]:
        """A page of the job's log lines: those after sequence number ``pos`` (and at or after ``since``):
        ``{lines: [{seq, time, attempt, rank, line}], next_pos}``; pass ``next_pos`` as ``pos`` for the next page.

        Raises:
            NotFound: no such job.
        """
        with self.db() as db:
            self.get(db, job_id)
            query = select(JobEventRow).where(JobEventRow.job_id == job_id, JobEventRow.kind == "log",
                                              JobEventRow.seq > pos)
            if since is not None:  # stored as naive UTC
                if since.tzinfo is not None:
                    since = since.astimezone(UTC).replace(tzinfo=None)
                query = query.where(JobEventRow.time >= since)
            rows = list(db.scalars(query.order_by(JobEventRow.seq).limit(pagesize)))
            return {"lines": [{"seq": r.seq, "time": events.iso(r.time), "attempt": r.attempt,
                               "rank": r.payload.get("rank"), "line": r.payload.get("line", "")} for r in rows],
                    "next_pos": rows[-1].seq if rows else pos}

    def metrics(self, job_id: str) -> list[dict[str, Any]]:
        """The job's metrics records in the order they were reported, each epoch once.

        Raises:
            NotFound: no such job.
        """
        with self.db() as db:
            self.get(db, job_id)
            rows = db.scalars(select(JobEventRow).where(JobEventRow.job_id == job_id, JobEventRow.kind == "metric")
                              .order_by(JobEventRow.seq))
            return [{**r.payload, "attempt": r.attempt} for r in rows]

    def storage(self, job: JobRow) -> Storage:
        """The job's folder of its results store."""
        return layout.job_storage(job.manifest["results_store"], job.id)

    def model_file(self, job_id: str) -> Path:
        """The trained model downloaded into a temporary file (the caller deletes it).

        Raises:
            NotFound: no such job, or it has no model (yet).
            StorageError: the results store failed.
        """
        with self.db() as db:
            job = self.get(db, job_id)
        target = Path(tempfile.mkdtemp(prefix="labswarm-model-")) / f"{job.name}-{job.id}.pt"
        try:
            return self.storage(job).get_file(layout.MODEL_KEY, target)
        except MissingObject:
            shutil.rmtree(target.parent, ignore_errors=True)
            raise NotFound(f"job {job_id} has no trained model (status {job.status})") from None

    def bundle_file(self, job_id: str) -> Path:
        """The job's bundle (:mod:`labswarm.jobs.bundle`) in a temporary file (the caller deletes its folder).

        Raises:
            NotFound: no such job.
            StorageError: the results store failed.
        """
        from labswarm.jobs.bundle import write_bundle

        job = self.describe(job_id)
        with self.db() as db:
            row = self.get(db, job_id)
        target = Path(tempfile.mkdtemp(prefix="labswarm-bundle-")) / f"{job['name']}-{job_id}.zip"
        try:
            return write_bundle(job, self.metrics(job_id), self.storage(row), target)
        except BaseException:
            shutil.rmtree(target.parent, ignore_errors=True)
            raise

    # control
    def halt(self, job_id: str) -> dict[str, Any]:
        """Halt a job: a queued one at once, a deployed one cooperatively (its learners checkpoint and exit;
        killed after ``job_halt_grace``). Halting a halting or halted job changes nothing.

        Raises:
            NotFound: no such job.
            InvalidTransition: the job is storing, completed or failed.
        """
        with self.lock, self.db() as db:
            job = self.get(db, job_id)
            if job.status in (JobState.HALTING.value, JobState.HALTED.value):
                return self._summary(db, job)
            if job.status == JobState.QUEUED.value:
                events.transition(db, job, JobState.HALTED, reason="halted before it started")
            else:
                events.transition(db, job, JobState.HALTING, reason="halt requested")
                job.halt_at = naive_utcnow()
            db.commit()
            out = self._summary(db, job)
        self.lifecycle.wake()
        return out

    def resume(self, job_id: str) -> dict[str, Any]:
        """Queue a halted job again; its next attempt starts from its last checkpoint.

        Raises:
            NotFound: no such job.
            InvalidTransition: the job is not halted.
        """
        with self.lock, self.db() as db:
            job = self.get(db, job_id)
            events.transition(db, job, JobState.QUEUED, reason="resumed",
                              detail={"checkpoint": job.checkpoint})
            job.halt_at = None
            job.not_before = None
            db.commit()
            out = self._summary(db, job)
        self.lifecycle.wake()
        return out

    def delete(self, job_id: str) -> None:
        """Stop the job's learners (killed: their results are deleted anyway), then delete what the job owns:
        its folder of the results store, its local working folders, its rows. The user's data is left alone.

        Raises:
            NotFound: no such job.
            StorageError: the results store refused the deletion (the job is kept, to delete again).
        """
        with self.lock:
            with self.db() as db:
                job = self.get(db, job_id)
                live = list(db.scalars(select(LearnerRow).where(LearnerRow.job_id == job_id,
                                                               LearnerRow.ended_at.is_(None))))
                job.halt_at = naive_utcnow()
                for learner in live:
                    learner.killed = "delete"
                db.commit()
            self.lifecycle.kill_and_wait(live)
            self.storage(job).delete()
            shutil.rmtree(self.home / job_id, ignore_errors=True)
            with self.db() as db:
                for model in (JobEventRow, LearnerRow, AttemptRow):
                    db.query(model).filter(model.job_id == job_id).delete()
                db.query(JobRow).filter(JobRow.id == job_id).delete()
                db.commit()

    # the learners' side
    def report(self, job_id: str, attempt: int, body: Mapping[str, Any]) -> dict[str, Any]:
        """Take one report of a learner (see :mod:`labswarm.jobs.reporter`): store its new events once, note its
        heartbeat and progress, move the job to RUNNING at its first report and to STORING when it stores.

        Returns:
            ``{"received": n, "halt": bool}``.

        Raises:
            NotFound: no such job.
            Conflict: the attempt is not the job's current one, or the learner has ended (it must stop).
        """
        rank = int(body.get("rank", 0))
        with self.lock, self.db() as db:
            job = self.get(db, job_id)
            learner = db.get(LearnerRow, (job_id, attempt, rank))
            if job.attempt != attempt or learner is None or learner.ended_at is not None:
                raise Conflict(f"job {job_id}: attempt {attempt} learner {rank} is not running (the job's attempt is "
                               f"{job.attempt}): it must stop")
            now = naive_utcnow()
            learner.last_seen = now
            if body.get("progress"):
                learner.progress = dict(body["progress"])
            if job.status == JobState.PENDING.value:
                events.transition(db, job, JobState.RUNNING, reason=f"attempt {attempt} running")
            fresh = [e for e in body.get("events", ()) if int(e["n"]) > learner.received]
            known = events.known_keys(db, job_id, {e["key"] for e in fresh if e.get("key")})
            for event in fresh:
                learner.received = int(event["n"])
                key, kind, payload = event.get("key"), event["kind"], dict(event.get("payload") or {})
                if key is not None:
                    if key in known:
                        continue
                    known.add(key)
                if kind == "phase":
                    if payload.get("phase") == "storing" and job.status == JobState.RUNNING.value:
                        events.transition(db, job, JobState.STORING, reason="storing the model")
                    continue
                if kind == "checkpoint":
                    job.checkpoint = payload
                    row = db.get(AttemptRow, (job_id, attempt))
                    if row is not None:
                        row.checkpoint_out = payload
                payload.setdefault("rank", rank)
                at = (datetime.fromtimestamp(float(event["time"]), UTC).replace(tzinfo=None) if event.get("time")
                      else now)
                events.append(db, job, kind, payload, key=key, attempt=attempt, time=at)
            halt = job.halt_at is not None or job.status not in {s.value for s in HOLDS_SLOTS}
            db.commit()
            return {"received": learner.received, "halt": halt}
