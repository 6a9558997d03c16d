"""The training-jobs service, independent of HTTP: submit, inspect, halt, resume and delete jobs; take the
learners' reports; read a job's events, logs, metrics and model.

The manager hosts it beside the session service (it uses that service's database and experiment registry). Its
:class:`~labswarm.jobs.lifecycle.lifecycle.JobLifecycle` thread runs the queue, deploys learners, watches them and
restarts them. Every change of a job happens under one lock and in one transaction with the event that tells it.
"""

from __future__ import annotations

import shutil
import threading
import uuid
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import select

from labswarm.auth.tokens import User
from labswarm.config.experiment import ExperimentConfig
from labswarm.config.manifest import CommandFramework, JobManifest, parse_manifest
from labswarm.config.roots import check_manifest_paths
from labswarm.datasets.folder import read_clips
from labswarm.errors import ConfigError, Conflict, DatasetError, NotFound, StorageError
from labswarm.jobs.lifecycle.lifecycle import JobLifecycle
from labswarm.jobs.lifecycle.runtime import JobRuntime
from labswarm.jobs.records import events
from labswarm.jobs.records.credentials import attempt_user
from labswarm.jobs.records.models import AttemptRow, JobEventRow, JobRow, LearnerRow, naive_utcnow
from labswarm.jobs.service import live
from labswarm.jobs.service.parent import resolve_parent
from labswarm.jobs.service.queries import JobQueries, job_fingerprint
from labswarm.jobs.spec.errors import AdminOnly
from labswarm.jobs.spec.states import HOLDS_SLOTS, JobState
from labswarm.sessions.models import DEFAULT_OWNER
from labswarm.sessions.service import SessionService
from labswarm.storage.base import Storage


class JobService(JobQueries):
    """Owns the training jobs: their rows and events, the lifecycle thread and the learner processes.

    Args:
        sessions: the session service whose database and experiment registry the jobs use; the URL at which
            learners reach the manager is the one the serving process advertises to it.
    """

    def __init__(self, sessions: SessionService) -> None:
        self.sessions = sessions
        self.settings = sessions.settings
        self.db = sessions.db
        self.home = self.settings.home / "jobs"
        self.lock = threading.RLock()
        #: what the lifecycle is handed instead of this service (labswarm.jobs.lifecycle.runtime)
        self.runtime = JobRuntime(settings=self.settings, db=self.db, lock=self.lock, home=self.home,
                                  manager_url=lambda: self.manager_url, policies=sessions.policies)
        self.lifecycle = JobLifecycle(self.runtime)

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

    def attempt_user(self, digest: bytes) -> User | None:
        """The scoped-token hook of the manager's authenticator: the learner whose running attempt's token has
        SHA-256 ``digest``, its scope that attempt's report route (:mod:`labswarm.jobs.records.credentials`)."""
        with self.db() as db:
            return attempt_user(db, digest)

    # submit
    def validate(self, data: Mapping[str, Any] | str, owner: str = DEFAULT_OWNER, *, admin: bool = True
                 ) -> tuple[JobManifest, ExperimentConfig]:
        """Check a manifest, the experiment it trains and its stores, without creating anything.

        Args:
            data: the manifest, YAML text or a mapping.
            owner: the user submitting it; a registered experiment it names must be theirs unless ``admin``.
            admin: whether that user is an admin (only an admin may use the ``command`` framework).

        Returns:
            The manifest and the experiment (registered or inline).

        Raises:
            ConfigError: every problem with the path of its field: the manifest, an unregistered experiment (or
                another user's), training settings, an unreadable dataset, an unreachable store.
            AdminOnly: the ``command`` framework, or a model from a Python file (``model: {code: ...}``), in the
                manifest of a user who is not an admin.
        """
        manifest = parse_manifest(data, source="manifest")
        if isinstance(manifest.framework, CommandFramework) and not admin:
            raise AdminOnly(f"framework.name: 'command' runs an arbitrary program on the manager's machines: only an "
                            f"admin may submit it ({owner} is a user); use the 'labswarm' framework")
        check_manifest_paths(manifest, self.sessions.registry.roots)  # before any file is opened or created
        if isinstance(manifest.experiment, ExperimentConfig):
            experiment = manifest.experiment
        else:
            try:
                row = self.sessions.registry.get(manifest.experiment, None if admin else owner)
                experiment = self.sessions.registry.config(manifest.experiment, row)
            except NotFound:
                raise ConfigError([("experiment", f"no registered experiment {manifest.experiment!r}: register "
                                                  "it, or give it inline")]) from None
        if getattr(experiment.model, "code", None) and not admin:  # {code: FILE.py:Class}: arbitrary code
            raise AdminOnly(f"experiment.model.code: a model from a Python file runs arbitrary code on the manager's "
                            f"machines: only an admin may submit it ({owner} is a user); install the model as a "
                            "package with a 'labswarm.models' entry point instead")
        manifest.training_config(experiment)
        manifest = resolve_parent(self, manifest, experiment, owner, admin)  # issue 25: init_from {job: ID}
        problems = []
        if not isinstance(manifest.framework, CommandFramework):  # our trainer reads the dataset
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

    def create(self, data: Mapping[str, Any] | str, owner: str = DEFAULT_OWNER, *, admin: bool = True,
               reuse: bool = False) -> JobRow:
        """Validate and queue a job of ``owner`` (an inline experiment is registered first, as theirs).

        Args:
            data: the manifest, YAML text or a mapping.
            owner: the user submitting it, recorded as the job's owner; default
                :data:`~labswarm.sessions.models.DEFAULT_OWNER` (the admin's).
            admin: whether that user is an admin.
            reuse: when a completed job of ``owner`` has the same fingerprint (configuration, data and code,
                :mod:`labswarm.train.provenance`) and its model is still in its results store, return that job
                (status ``completed``) instead of queuing a new one.

        Raises:
            ConfigError: see :meth:`validate`.
            AdminOnly: see :meth:`validate`.
            Conflict: an inline experiment's name is another user's.
            QuotaExceeded: the owner's ``queued_jobs`` quota is reached (:mod:`labswarm.auth.quotas`; HTTP 429).
            ConfigError: also a job that could never start: more learners or GPUs than the owner's quota or than
                the manager has (:meth:`~labswarm.jobs.lifecycle.deployer.Deployer.never_fits`; HTTP 422).
        """
        manifest, experiment = self.validate(data, owner, admin=admin)
        resolved = manifest.resolved(experiment)
        fingerprint = job_fingerprint(resolved, experiment)
        if reuse and fingerprint is not None and (done := self.reusable(fingerprint, owner)) is not None:
            return done
        if isinstance(manifest.experiment, ExperimentConfig):
            self.sessions.registry.register(experiment.model_dump(mode="json"), owner, admin=admin)
        now = naive_utcnow()
        job = JobRow(id=uuid.uuid4().hex[:12], name=manifest.name, status=JobState.QUEUED.value,
                     priority=manifest.priority, experiment=experiment.name, manifest=resolved,
                     learners=manifest.learners, timestamps={"queued": events.iso(now)}, submitted_at=now,
                     updated_at=now, next_seq=1, attempt=0, restarts_user=0, restarts_platform=0, owner=owner,
                     fingerprint=fingerprint)
        with self.lock, self.db() as db:
            self.lifecycle.deployer.admit(db, owner, job)  # queued_jobs quota; a job that could never start
            db.add(job)
            db.flush()  # the job's row before its first event (no relationship tells the order)
            events.append(db, job, "status", {"status": "queued", "previous": None, "reason": "submitted"})
            db.commit()
        self.lifecycle.wake()
        return job

    # control
    def halt(self, job_id: str, owner: str | None = None) -> dict[str, Any]:
        """Halt a job: a queued one at once, a deployed one cooperatively (its learners checkpoint and exit;
        killed after ``job_halt_grace``). Halting a halting or halted job changes nothing.

        Raises:
            NotFound: no such job, or (``owner`` given) another user's.
            InvalidTransition: the job is storing, completed or failed.
        """
        with self.lock, self.db() as db:
            job = self.get(db, job_id, owner)
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

    def resume(self, job_id: str, owner: str | None = None) -> dict[str, Any]:
        """Queue a halted job again; its next attempt starts from its last checkpoint.

        Raises:
            NotFound: no such job, or (``owner`` given) another user's.
            InvalidTransition: the job is not halted.
        """
        with self.lock, self.db() as db:
            job = self.get(db, job_id, owner)
            events.transition(db, job, JobState.QUEUED, reason="resumed",
                              detail={"checkpoint": job.checkpoint})
            job.halt_at = None
            job.not_before = None
            db.commit()
            out = self._summary(db, job)
        self.lifecycle.wake()
        return out

    def delete(self, job_id: str, owner: str | None = None) -> None:
        """Stop the job's learners (killed: their results are deleted anyway), then delete what the job owns:
        its folder of the results store, its local working folders, what its learners left outside them (a swarm
        learner's chunk records on the shared volume, which a halted job keeps for its resume), its rows. The
        user's data is left alone.

        Raises:
            NotFound: no such job, or (``owner`` given) another user's.
            StorageError: the results store refused the deletion (the job is kept, to delete again).
        """
        with self.lock:
            with self.db() as db:
                job = self.get(db, job_id, owner)
                live = list(db.scalars(select(LearnerRow).where(LearnerRow.job_id == job_id,
                                                               LearnerRow.ended_at.is_(None))))
                job.halt_at = naive_utcnow()
                for learner in live:
                    learner.killed = "delete"
                db.commit()
            self.lifecycle.kill_and_wait(live, job_id=job_id)
            self.storage(job).delete()
            shutil.rmtree(self.home / job_id, ignore_errors=True)
            self.lifecycle.learners.collect(job_id)  # what its learners left elsewhere (a swarm's chunk records)
            with self.db() as db:
                for model in (JobEventRow, LearnerRow, AttemptRow):
                    db.query(model).filter(model.job_id == job_id).delete()
                db.query(JobRow).filter(JobRow.id == job_id).delete()
                db.commit()

    # the learners' side
    def report(self, job_id: str, attempt: int, body: Mapping[str, Any]) -> dict[str, Any]:
        """Take one report of a learner (see :mod:`labswarm.jobs.learner.reporter`): store its new events once, note its
        heartbeat and progress, move the job to RUNNING at its first report and to STORING when it stores.

        Returns:
            ``{"received": n, "halt": bool, "change": ...}``: ``change`` the training's latest live change, or
            ``None`` (:func:`labswarm.jobs.service.live.latest`).

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
            change = live.latest(db, job)  # issue 25: the training's latest live change
            db.commit()
            return {"received": learner.received, "halt": halt, "change": change}
