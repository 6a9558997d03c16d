"""The read side of the training-jobs service: one job as shown, the list, attempts, events, log pages,
metrics, the trained model and the bundle. Nothing here changes a job.
"""

from __future__ import annotations

import builtins
import shutil
import tempfile
from collections.abc import Callable
from contextlib import AbstractContextManager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from labswarm.errors import DatasetError, NotFound, StorageError
from labswarm.jobs.lifecycle.fairshare import queue_order
from labswarm.jobs.lifecycle.lifecycle import JobLifecycle
from labswarm.jobs.records import events
from labswarm.jobs.records.models import AttemptRow, JobEventRow, JobRow, LearnerRow, naive_utcnow
from labswarm.jobs.spec import layout
from labswarm.jobs.spec.errors import ErrorCode
from labswarm.jobs.spec.states import JobState
from labswarm.settings import Settings
from labswarm.storage.base import MissingObject, Storage
from labswarm.train.provenance import of_job


def job_fingerprint(manifest: dict[str, Any], experiment: Any) -> str | None:
    """The fingerprint of a job (:attr:`labswarm.train.provenance.Provenance.key`) of resolved ``manifest`` and
    ``experiment``; ``None`` when its data cannot be fingerprinted (such a job is never reused)."""
    try:
        return of_job(manifest, experiment).key
    except (DatasetError, OSError):
        return None


class JobQueries:
    """The job service's reads (a part of :class:`~labswarm.jobs.service.service.JobService`, which provides ``db``)."""

    db: Callable[[], AbstractContextManager[Session]]
    settings: Settings
    lifecycle: JobLifecycle

    def get(self, db: Session, job_id: str, owner: str | None = None) -> JobRow:
        """The job's row.

        Args:
            db: the database session.
            job_id: the job.
            owner: when given, the job must be this user's (``None``: an admin, any job).

        Raises:
            NotFound: no such job, or (``owner`` given) another user's: the same answer, so a user learns nothing
                of the others' jobs.
        """
        job = db.get(JobRow, job_id)
        if job is None or (owner is not None and job.owner != owner):
            raise NotFound(f"no job {job_id!r}")
        return job

    def describe(self, job_id: str, owner: str | None = None) -> dict[str, Any]:
        """Everything about one job: status, reason, error, timestamps per phase, restarts, checkpoint, queue
        position, attempts, the learners' progress, and the log tail of a failed job.

        Raises:
            NotFound: no such job, or (``owner`` given) another user's.
        """
        with self.db() as db:
            job = self.get(db, job_id, owner)
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
             limit: int = 50, owner: str | None = None) -> dict[str, Any]:
        """A page of jobs, newest first: ``{jobs, total, offset, limit}``; only ``owner``'s when given."""
        with self.db() as db:
            query = select(JobRow)
            if owner is not None:
                query = query.where(JobRow.owner == owner)
            if status:
                query = query.where(JobRow.status.in_(status))
            if name:
                query = query.where(JobRow.name == name)
            total = db.scalar(select(func.count()).select_from(query.subquery()))
            rows = db.scalars(query.order_by(JobRow.submitted_at.desc(), JobRow.id).offset(offset).limit(limit))
            return {"jobs": [self._summary(db, job) for job in rows], "total": total, "offset": offset,
                    "limit": limit}

    def reusable(self, fingerprint: str, owner: str) -> JobRow | None:
        """The newest completed job of ``owner`` whose fingerprint is ``fingerprint`` and whose model is still in
        its results store (:meth:`JobService.create` with ``reuse``); ``None``: none."""
        with self.db() as db:
            rows = db.scalars(select(JobRow).where(JobRow.fingerprint == fingerprint, JobRow.owner == owner,
                                                   JobRow.status == JobState.COMPLETED.value)
                              .order_by(JobRow.submitted_at.desc()).limit(5))
            for job in rows:
                try:
                    if self.storage(job).exists(layout.MODEL_KEY):
                        return job
                except StorageError:  # its store is gone: not reusable
                    continue
        return None

    def _summary(self, db: Session, job: JobRow) -> dict[str, Any]:
        code = ErrorCode(job.error_code) if job.error_code else None
        return {"id": job.id, "name": job.name, "status": job.status, "reason": job.reason,
                "error_code": job.error_code, "owner": job.owner, "error": code.text if code else None,
                "fault": code.fault.value if code else None, "experiment": job.experiment,
                "priority": job.priority, "learners": job.learners, "attempt": job.attempt,
                "restarts": {"user": job.restarts_user, "platform": job.restarts_platform},
                "checkpoint": job.checkpoint, "timestamps": job.timestamps,
                "submitted_at": events.iso(job.submitted_at), "updated_at": events.iso(job.updated_at),
                "queue_position": self._queue_position(db, job)}

    def _queue_position(self, db: Session, job: JobRow) -> int | None:
        """1 for the next queued job to start, in the scheduler's fair-share order between users as if each job
        fit (:func:`~labswarm.jobs.lifecycle.fairshare.queue_order`, computed once per database session);
        ``None`` when the job is not queued."""
        if job.status != JobState.QUEUED.value:
            return None
        if "queue_order" not in db.info:
            order = queue_order(db, self.lifecycle.deployer.policies.weight, self.settings.fair_share_half_life,
                                naive_utcnow())
            db.info["queue_order"] = {queued.id: i for i, queued in enumerate(order, 1)}
        return db.info["queue_order"].get(job.id)

    def attempts(self, job_id: str, db: Session | None = None, owner: str | None = None
                 ) -> builtins.list[dict[str, Any]]:  # builtins: `list` here is the method above
        """The job's attempts, first first: number, start, end, exit code, error code, reason, checkpoint in and
        out, where each learner ran (host, pid, GPUs), and ``learner_restarts``: the learners of an asynchronous
        framework restarted alone within the attempt (rank, why, the dead process's pid and exit code, time).

        Raises:
            NotFound: no such job, or (``owner`` given) another user's.
        """
        if db is None:
            with self.db() as opened:
                return self.attempts(job_id, opened, owner)
        self.get(db, job_id, owner)
        learners: dict[int, list[dict[str, Any]]] = {}
        for lr in db.scalars(select(LearnerRow).where(LearnerRow.job_id == job_id).order_by(LearnerRow.rank)):
            learners.setdefault(lr.attempt, []).append(
                {"rank": lr.rank, "host": lr.host, "pid": lr.pid, "gpus": lr.gpus, "exit_code": lr.exit_code,
                 "killed": lr.killed, "workdir": lr.workdir})
        restarts: dict[int, list[dict[str, Any]]] = {}
        for event in db.scalars(select(JobEventRow).where(JobEventRow.job_id == job_id, JobEventRow.kind == "attempt")
                                .order_by(JobEventRow.seq)):
            if event.payload.get("event") == "learner_restarted":
                restarts.setdefault(int(event.payload["attempt"]), []).append(
                    {**{k: v for k, v in event.payload.items() if k not in ("attempt", "event")},
                     "time": events.iso(event.time)})
        rows = db.scalars(select(AttemptRow).where(AttemptRow.job_id == job_id).order_by(AttemptRow.number))
        return [{"number": a.number, "started_at": events.iso(a.started_at), "ended_at": events.iso(a.ended_at),
                 "exit_code": a.exit_code,
                 "error_code": a.error_code, "reason": a.reason, "checkpoint_in": a.checkpoint_in,
                 "checkpoint_out": a.checkpoint_out, "learners": learners.get(a.number, []),
                 "learner_restarts": restarts.get(a.number, [])} for a in rows]

    def events(self, job_id: str, after: int = 0, limit: int = 500, owner: str | None = None
               ) -> tuple[builtins.list[JobEventRow], bool]:
        """The job's events with a sequence number above ``after``, in order, and whether the job is terminal.

        Raises:
            NotFound: no such job, or (``owner`` given) another user's.
        """
        with self.db() as db:
            job = self.get(db, job_id, owner)
            rows = list(db.scalars(select(JobEventRow).where(JobEventRow.job_id == job_id, JobEventRow.seq > after)
                                   .order_by(JobEventRow.seq).limit(limit)))
            return rows, job.status in (JobState.COMPLETED.value, JobState.FAILED.value)

    def logs(self, job_id: str, *, since: datetime | None = None, pos: int = 0,
             pagesize: int = 100, owner: str | None = None) -> dict[str, Any]:
        """A page of the job's log lines: those after sequence number ``pos`` (and at or after ``since``):
        ``{lines: [{seq, time, attempt, rank, line}], next_pos}``; pass ``next_pos`` as ``pos`` for the next page.

        Raises:
            NotFound: no such job, or (``owner`` given) another user's.
        """
        with self.db() as db:
            self.get(db, job_id, owner)
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

    def metrics(self, job_id: str, owner: str | None = None) -> builtins.list[dict[str, Any]]:
        """The job's metrics records in the order they were reported, each epoch once.

        Raises:
            NotFound: no such job, or (``owner`` given) another user's.
        """
        with self.db() as db:
            self.get(db, job_id, owner)
            rows = db.scalars(select(JobEventRow).where(JobEventRow.job_id == job_id, JobEventRow.kind == "metric")
                              .order_by(JobEventRow.seq))
            return [{**r.payload, "attempt": r.attempt} for r in rows]

    def storage(self, job: JobRow) -> Storage:
        """The job's folder of its results store."""
        return layout.job_storage(job.manifest["results_store"], job.id)

    def model_file(self, job_id: str, owner: str | None = None) -> Path:
        """The trained model downloaded into a temporary file (the caller deletes it).

        Raises:
            NotFound: no such job (or, ``owner`` given, another user's), or it has no model (yet).
            StorageError: the results store failed.
        """
        with self.db() as db:
            job = self.get(db, job_id, owner)
        target = Path(tempfile.mkdtemp(prefix="labswarm-model-")) / f"{job.name}-{job.id}.pt"
        try:
            return self.storage(job).get_file(layout.MODEL_KEY, target)
        except MissingObject:
            shutil.rmtree(target.parent, ignore_errors=True)
            raise NotFound(f"job {job_id} has no trained model (status {job.status})") from None

    def bundle_file(self, job_id: str, owner: str | None = None) -> Path:
        """The job's bundle (:mod:`labswarm.jobs.service.bundle`) in a temporary file (the caller deletes its folder).

        Raises:
            NotFound: no such job, or (``owner`` given) another user's.
            StorageError: the results store failed.
        """
        from labswarm.jobs.service.bundle import write_bundle

        job = self.describe(job_id, owner)
        with self.db() as db:
            row = self.get(db, job_id)
        target = Path(tempfile.mkdtemp(prefix="labswarm-bundle-")) / f"{job['name']}-{job_id}.zip"
        try:
            return write_bundle(job, self.metrics(job_id), self.storage(row), target)
        except BaseException:
            shutil.rmtree(target.parent, ignore_errors=True)
            raise
