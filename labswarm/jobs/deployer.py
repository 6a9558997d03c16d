"""Deploying jobs' attempts: the queue's schedule (by priority then submission, while the learners fit in
``job_slots`` and their GPUs in the free ones: QUEUED → PENDING) and the start of each attempt's learners from
the last committed checkpoint (the third step of the lifecycle's pass, see :mod:`labswarm.jobs.lifecycle`).
"""

from __future__ import annotations

import logging
import shutil
import subprocess
from typing import TYPE_CHECKING

from sqlalchemy import select
from sqlalchemy.orm import Session

from labswarm.errors import DeployError, StorageError
from labswarm.jobs import events, layout
from labswarm.jobs.credentials import new_attempt_token
from labswarm.jobs.models import AttemptRow, JobRow, LearnerRow, naive_utcnow
from labswarm.jobs.processes import LearnerLaunch, LearnerLauncher
from labswarm.jobs.states import HOLDS_SLOTS, JobState
from labswarm.settings import Settings

if TYPE_CHECKING:
    from labswarm.jobs.service import JobService

log = logging.getLogger(__name__)

_S = JobState


class Deployer:
    """The lifecycle's schedule and deploys (a part of :class:`~labswarm.jobs.lifecycle.JobLifecycle`, which
    provides ``service``, ``settings``, ``learners``, ``host`` and ``_gpus``)."""

    service: JobService
    settings: Settings
    learners: LearnerLauncher
    host: str
    _gpus: list[str] | None

    def _schedule(self, db: Session) -> None:
        if self.service.manager_url is None:
            return  # not served yet: learners would have no one to report to
        used = sum(db.scalars(select(JobRow.learners).where(JobRow.status.in_([s.value for s in HOLDS_SLOTS]))))
        queued = db.scalars(select(JobRow).where(JobRow.status == _S.QUEUED.value)
                            .order_by(JobRow.priority.desc(), JobRow.submitted_at, JobRow.id))
        for job in list(queued):
            if used + job.learners > self.settings.job_slots or self._free_gpus(db, job) is None:
                break  # strict order: a job that does not fit holds the ones behind it
            events.transition(db, job, _S.PENDING, reason="deploying")
            job.not_before = None
            used += job.learners
            self._deploy(db, job)

    def _gpu_total(self) -> list[str]:
        if self._gpus is None:
            if self.settings.job_gpus is not None:
                self._gpus = [str(i) for i in range(self.settings.job_gpus)]
            else:
                self._gpus = _detect_gpus()
        return self._gpus

    def _free_gpus(self, db: Session, job: JobRow) -> list[str] | None:
        """The GPUs the job's learners would get (``[]`` without GPUs), ``None`` when not enough are free. A swarm
        places GPUs itself (generic resources): they are counted here only against ``job_gpus`` when it is set."""
        wanted = int(job.manifest.get("resources", {}).get("gpus", 0)) * job.learners
        if not wanted or (not self.learners.local_gpus and self.settings.job_gpus is None):
            return []
        busy = {g for row in db.scalars(select(LearnerRow.gpus).where(LearnerRow.ended_at.is_(None))) if row
                for g in row.split(",")}
        free = [g for g in self._gpu_total() if g not in busy]
        return free[:wanted] if len(free) >= wanted else None

    def _deploy(self, db: Session, job: JobRow) -> None:
        """Start the next attempt's learners from the last committed checkpoint through the launcher
        (:mod:`labswarm.jobs.processes`), each with the attempt's own API token (:mod:`labswarm.jobs.credentials`:
        only its digest is stored). A learner that cannot be started is ended at once as a deploy failure."""
        url = self.service.manager_url
        if url is None:
            return
        now = naive_utcnow()
        try:
            pointer = layout.latest_checkpoint(self.service.storage(job))
        except StorageError as exc:
            log.warning("job %s: cannot read its checkpoint pointer (%s): the last one known is used", job.id, exc)
            pointer = job.checkpoint
        job.attempt += 1
        job.not_before = None
        number = job.attempt
        token, digest = new_attempt_token()
        db.add(AttemptRow(job_id=job.id, number=number, started_at=now, checkpoint_in=pointer, token_sha256=digest))
        gpus = self._free_gpus(db, job) or []
        per = int(job.manifest.get("resources", {}).get("gpus", 0))
        base = self.service.home / job.id / f"attempt-{number}"
        started: list[int] = []
        services: list[str] = []
        for rank in range(job.learners):
            workdir = base / f"rank-{rank}"
            mine = ",".join(gpus[rank * per:(rank + 1) * per]) if per else None
            spec = {"job_id": job.id, "attempt": number, "rank": rank, "world_size": job.learners,
                    "manifest": job.manifest, "manager_url": url, "results_store": job.manifest["results_store"],
                    "checkpoint": pointer, "workdir": str(workdir.resolve())}
            launch = LearnerLaunch(job.id, number, rank, spec, base / f"learner-{rank}.json",
                                   base / f"learner-{rank}.out", token,
                                   gpus=(mine or "") if self.learners.local_gpus and self._gpu_total() else None,
                                   resources=dict(job.manifest.get("resources") or {}))
            row = LearnerRow(job_id=job.id, attempt=number, rank=rank, host=self.host, workdir=str(workdir),
                             gpus=mine, started_at=now, received=-1, halt_sent=False)
            try:
                handle = self.learners.start(launch)
                row.pid, row.pid_created, row.service_id = handle.pid, handle.pid_created, handle.service_id
                started.extend([handle.pid] if handle.pid is not None else [])
                services.extend([handle.service_id] if handle.service_id else [])
            except (OSError, DeployError) as exc:  # the platform's fault (S105), within its restart budget
                log.error("job %s: cannot start learner %d: %s", job.id, rank, exc)
                row.ended_at, row.killed = now, "deploy"
                events.append(db, job, "log", {"line": f"cannot start learner {rank}: {exc}", "rank": rank,
                                               "source": "launcher"}, attempt=number)
            db.add(row)
        where = {"services": services} if services else {"pids": started, "host": self.host}
        events.append(db, job, "attempt", {"attempt": number, "event": "started", "checkpoint": pointer, **where},
                      attempt=number)
        db.commit()  # the pids (service ids), at once: a manager that dies now finds them
        log.info("job %s: attempt %d deployed (%s) from %s", job.id, number, services or started,
                 pointer["key"] if pointer else "scratch")


def _detect_gpus() -> list[str]:
    """The GPUs ``nvidia-smi -L`` lists (their indices); none without it."""
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [str(i) for i, line in enumerate(line for line in out.splitlines() if line.startswith("GPU "))]
