"""Deploying jobs' attempts: the queue's schedule (in weighted fair-share order between users,
:mod:`labswarm.jobs.lifecycle.fairshare`, under their quotas, while the learners fit in ``job_slots`` and their GPUs
in the free ones: QUEUED → PENDING) and the start of each attempt's learners from
the last committed checkpoint (the third step of the lifecycle's pass, see :mod:`labswarm.jobs.lifecycle.lifecycle`).

A distributed job (``learners: N`` with a distributed framework) first gets its coordinator and parameter-server
shards (:mod:`labswarm.jobs.lifecycle.cluster`; on a swarm the shards are services, through the launcher's
``shard_runner``: :mod:`labswarm.deploy.swarm_shards`), then its learners, through the same launcher as one
learner (a process or a service each); each learner's environment is its place in the job
(:func:`~labswarm.train.distributed.launch.plan_attempt`). A learner of an asynchronous framework that died is started
again alone, in the same attempt, with the attempt's token and the environment its peers got (kept in memory:
after a manager restart the attempt is restarted whole instead).
"""

from __future__ import annotations

import logging
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from labswarm.auth.overrides import PolicyStore
from labswarm.auth.quotas import Policies, QuotaExceeded
from labswarm.config.manifest import parse_manifest
from labswarm.deploy.learners import LearnerLaunch, LearnerLauncher
from labswarm.errors import ConfigError, DeployError, StorageError
from labswarm.jobs.lifecycle import fairshare
from labswarm.jobs.lifecycle.cluster import JobCluster
from labswarm.jobs.lifecycle.fairshare import FairQueue
from labswarm.jobs.lifecycle.runtime import JobRuntime
from labswarm.jobs.records import events
from labswarm.jobs.records.credentials import new_attempt_token
from labswarm.jobs.records.models import AttemptRow, JobRow, LearnerRow, naive_utcnow
from labswarm.jobs.spec import layout
from labswarm.jobs.spec.errors import ErrorCode
from labswarm.jobs.spec.states import JobState

log = logging.getLogger(__name__)

_S = JobState
#: How the reason of a job held back by its owner's quota starts.
WAITING_QUOTA = "waiting: "


class Deployer:
    """The lifecycle's schedule and deploys (a part of :class:`~labswarm.jobs.lifecycle.lifecycle.JobLifecycle`).

    Args:
        runtime: the jobs' database, lock, settings, local folder, the manager's URL and results stores.
        learners: the launcher of the learners.
        clusters: the distributed jobs' coordinators and shards, by job id (shared with the lifecycle).
        tokens: the token of each live attempt, by (job id, attempt) (shared with the lifecycle).
    """

    def __init__(self, runtime: JobRuntime, learners: LearnerLauncher, clusters: dict[str, JobCluster],
                 tokens: dict[tuple[str, int], str]) -> None:
        self.runtime = runtime
        self.settings = runtime.settings
        self.learners = learners
        self.clusters = clusters
        self.tokens = tokens
        self.host = socket.gethostname()
        self._gpus: list[str] | None = None
        self._machine_slots = fairshare.machine_slots()
        #: the users' fair-share weights and quotas (labswarm.auth.overrides: settings, tokens file, an admin's)
        self.policies: PolicyStore | Policies = runtime.policies or Policies.from_settings(self.settings)

    @property
    def slots(self) -> int:
        """The learner slots: ``job_slots``, or the machine's CPU cores (:func:`~.fairshare.machine_slots`)."""
        return self.settings.job_slots or self._machine_slots

    def schedule(self, db: Session) -> None:
        """Move queued jobs to PENDING and deploy them in weighted fair-share order between users
        (:mod:`labswarm.jobs.lifecycle.fairshare`), while their learners fit in :attr:`slots` and their GPUs in
        the free ones (strict order: the job chosen holds the others when it does not fit; a job that could never fit,
        :meth:`never_fits`, fails instead, C104). A user at their
        ``running_learners`` or ``gpus`` quota (:mod:`labswarm.auth.quotas`) is passed over; the quota is written
        as the ``reason`` of their queued jobs (cleared when it no longer holds them back)."""
        if self.runtime.manager_url() is None:
            return  # not served yet: learners would have no one to report to
        queued = list(db.scalars(select(JobRow).where(JobRow.status == _S.QUEUED.value)))
        if not queued:
            return
        learners, gpus = fairshare.held(db)
        used = sum(learners.values())
        now = naive_utcnow()
        owners = {job.owner for job in queued}
        fair = FairQueue(queued, learners, fairshare.usage(db, owners, now, self.settings.fair_share_half_life),
                         self.policies.weight)
        blocked: dict[str, str] = {}
        while (job := fair.peek()) is not None:
            if never := self.never_fits(job):  # queued before job_slots or a quota shrank: it would hold the head
                fair.take(job)
                fair.held[job.owner] -= job.learners
                events.transition(db, job, _S.FAILED, reason=str(ConfigError(never)),
                                  error_code=ErrorCode.INVALID_MANIFEST)
                continue
            reason = self._over_quota(job, fair.held, gpus)
            if reason is not None:
                blocked[job.owner] = reason
                fair.drop(job.owner)
                continue
            if used + job.learners > self.slots or self._free_gpus(db, job) is None:
                break  # strict order: a job that does not fit holds the ones behind it
            fair.take(job)
            events.transition(db, job, _S.PENDING, reason="deploying")
            job.not_before = None
            used += job.learners
            gpus[job.owner] = gpus.get(job.owner, 0) + fairshare.job_gpus(job.learners, job.manifest)
            self.deploy(db, job)
        for job in queued:
            if job.status == _S.QUEUED.value:
                self._waiting_reason(job, blocked.get(job.owner))

    def admit(self, db: Session, owner: str, job: JobRow | None = None) -> None:
        """Check that ``owner`` may queue one more job under their ``queued_jobs`` quota (a submission; the
        caller holds the jobs' lock, so two submissions of one user are counted one after the other), and that
        ``job`` (when given) could ever start (:meth:`never_fits`).

        Raises:
            ConfigError: ``job`` could never start (HTTP 422, the field and the quota or setting named).
            QuotaExceeded: the user has as many jobs queued as their quota allows (HTTP 429, the quota named).
        """
        if job is not None and (never := self.never_fits(job)):
            raise ConfigError(never)
        policy = self.policies.of(owner)
        if policy.queued_jobs is None:
            return
        queued = db.scalar(select(func.count()).select_from(JobRow)
                           .where(JobRow.owner == owner, JobRow.status == _S.QUEUED.value))
        policy.check(owner, "queued_jobs", int(queued or 0))

    def never_fits(self, job: JobRow) -> list[tuple[str, str]]:
        """Why ``job`` could never start, as ``(field, reason)`` pairs (empty: it may, once slots are free): more
        learners than its owner's ``running_learners`` quota or than the learner slots (:attr:`slots`), more GPUs
        (``resources.gpus`` x learners) than its owner's ``gpus`` quota. Such a job would wait in the queue
        forever, and past the slots it would hold the queue's head for every user. (More GPUs than the manager
        has is not refused here: tests and users queue such jobs on purpose to hold them.)"""
        policy, owner, n = self.policies.of(job.owner), job.owner, job.learners
        gpus = fairshare.job_gpus(n, job.manifest)
        why = []
        if policy.running_learners is not None and n > policy.running_learners:
            why.append(("learners", f"{n} learners, more than the running_learners quota of {owner} "
                                    f"({policy.running_learners}): the job could never start "
                                    "(LABSWARM_QUOTA_RUNNING_LEARNERS, or 'quotas: {running_learners: N}' in the "
                                    "tokens file)"))
        if n > self.slots:
            why.append(("learners", f"{n} learners, more than this manager's {self.slots} learner slots "
                                    "(job_slots, default the CPU cores): the job could never start"))
        if policy.gpus is not None and gpus > policy.gpus:
            why.append(("resources.gpus", f"{gpus} GPUs ({n} learners x resources.gpus), more than the gpus quota "
                                          f"of {owner} ({policy.gpus}): the job could never start "
                                          "(LABSWARM_QUOTA_GPUS, or 'quotas: {gpus: N}' in the tokens file)"))
        return why

    def _over_quota(self, job: JobRow, learners: dict[str, int], gpus: dict[str, int]) -> str | None:
        """Why ``job`` may not start now under its owner's quotas (the :class:`QuotaExceeded` message), or
        ``None``."""
        policy = self.policies.of(job.owner)
        try:
            policy.check(job.owner, "running_learners", learners.get(job.owner, 0), job.learners)
            policy.check(job.owner, "gpus", gpus.get(job.owner, 0), fairshare.job_gpus(job.learners, job.manifest))
        except QuotaExceeded as exc:
            return f"{WAITING_QUOTA}{exc}"
        return None

    @staticmethod
    def _waiting_reason(job: JobRow, quota: str | None) -> None:
        """Write ``quota`` (why the job's owner is held back) as the queued job's reason, or clear a quota reason
        that no longer holds (the job waits for slots); the reason changes without a transition or an event."""
        if quota is not None and job.reason != quota:
            job.reason = quota
        elif quota is None and (job.reason or "").startswith(WAITING_QUOTA):
            job.reason = "waiting for learner slots"

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

    def deploy(self, db: Session, job: JobRow) -> None:
        """Start the next attempt's learners from the last committed checkpoint through the launcher
        (:mod:`labswarm.deploy.learners`), each with the attempt's own API token
        (:mod:`labswarm.jobs.records.credentials`: only its digest is stored). A learner that cannot be started is
        ended at once as a deploy failure."""
        url = self.runtime.manager_url()
        if url is None:
            return
        now = naive_utcnow()
        try:
            pointer = layout.latest_checkpoint(self.runtime.storage(job))
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
        base = self.runtime.home / job.id / f"attempt-{number}"
        started: list[int] = []
        services: list[str] = []
        envs, failed = self._cluster_attempt(db, job, number, pointer)
        self.tokens[(job.id, number)] = token
        for rank in range(job.learners):
            mine = ",".join(gpus[rank * per:(rank + 1) * per]) if per else None
            row = LearnerRow(job_id=job.id, attempt=number, rank=rank, host=self.host,
                             workdir=str(base / f"rank-{rank}"), gpus=mine, started_at=now, received=-1,
                             halt_sent=False)
            self._launch(db, job, row, pointer, token, envs[rank], failed)
            started.extend([row.pid] if row.pid is not None else [])
            services.extend([row.service_id] if row.service_id else [])
            db.add(row)
        where = {"services": services} if services else {"pids": started, "host": self.host}
        cluster = self.clusters.get(job.id)
        if cluster is not None:
            where.update(cluster.where())
        events.append(db, job, "attempt", {"attempt": number, "event": "started", "checkpoint": pointer, **where},
                      attempt=number)
        db.commit()  # the pids (service ids), at once: a manager that dies now finds them
        log.info("job %s: attempt %d deployed (%s) from %s", job.id, number, services or started,
                 pointer["key"] if pointer else "scratch")

    def _launch(self, db: Session, job: JobRow, row: LearnerRow, pointer: dict[str, Any] | None, token: str,
                env: dict[str, str], failed: DeployError | None = None) -> None:
        """Start the learner of ``row`` (its attempt, rank, working folder and GPUs) through the launcher and fill
        in its handle; one that cannot be started is ended at once as a deploy failure (S105)."""
        url = self.runtime.manager_url() or ""
        base = self.runtime.home / job.id / f"attempt-{row.attempt}"
        spec = {"job_id": job.id, "attempt": row.attempt, "rank": row.rank, "world_size": job.learners,
                "manifest": job.manifest, "manager_url": url, "results_store": job.manifest["results_store"],
                "checkpoint": pointer, "workdir": str(Path(row.workdir).resolve())}
        launch = LearnerLaunch(job.id, row.attempt, row.rank, spec, base / f"learner-{row.rank}.json",
                               base / f"learner-{row.rank}.out", token,
                               gpus=(row.gpus or "") if self.learners.local_gpus and self._gpu_total() else None,
                               resources=dict(job.manifest.get("resources") or {}), env=env)
        try:
            if failed is not None:
                raise failed
            handle = self.learners.start(launch)
            row.pid, row.pid_created, row.service_id = handle.pid, handle.pid_created, handle.service_id
        except (OSError, DeployError) as exc:  # the platform's fault (S105), within its restart budget
            log.error("job %s: cannot start learner %d: %s", job.id, row.rank, exc)
            row.ended_at, row.killed = naive_utcnow(), "deploy"
            events.append(db, job, "log", {"line": f"cannot start learner {row.rank}: {exc}", "rank": row.rank,
                                           "source": "launcher"}, attempt=row.attempt)

    def restart_learner(self, db: Session, job: JobRow, row: LearnerRow, pointer: dict[str, Any] | None) -> None:
        """Start the dead learner of ``row`` again, alone, in the same attempt (an asynchronous framework, see
        :meth:`~labswarm.jobs.lifecycle.outcomes.AttemptOutcomes._restart_learners`), from ``pointer``, with the
        attempt's token and its place in the job; its row is reset (a new process, a new report sequence)."""
        cluster = self.clusters.get(job.id)
        env: dict[str, str] = {}
        if cluster is not None and cluster.port is not None:
            env = dict(cluster.envs.get(row.rank, {}))  # the attempt's plan for this rank, as its peers got it
        row.pid = row.pid_created = row.service_id = None
        row.ended_at = row.exit_code = row.killed = row.last_seen = row.progress = None
        row.started_at, row.received, row.halt_sent = naive_utcnow(), -1, False
        self._launch(db, job, row, pointer, self.tokens[(job.id, row.attempt)], env)

    def _cluster_attempt(self, db: Session, job: JobRow, number: int, pointer: dict[str, Any] | None
                         ) -> tuple[list[dict[str, str]], DeployError | None]:
        """A distributed job's coordinator and shards for attempt ``number`` (:mod:`labswarm.jobs.lifecycle.cluster`),
        the
        cursor of the checkpoint it starts from restored; returns each rank's environment and the deploy error
        that fails every learner of the attempt (``None``: deployed). A job of one learner has none."""
        if job.learners < 2:
            return [{}], None
        cluster = self.clusters.get(job.id)
        if cluster is None:
            manifest = parse_manifest(job.manifest, source=f"job {job.id}")
            shard_runner = getattr(self.learners, "shard_runner", None)  # a swarm's services; else local processes
            try:
                runner = shard_runner(job.id) if shard_runner is not None else None
            except (ValueError, DeployError) as exc:
                return [{} for _ in range(job.learners)], DeployError(f"parameter servers / coordinator: {exc}")
            cluster = JobCluster(job.id, self.runtime.home / job.id, job.manifest["framework"], job.learners,
                                 manifest.shards, runner=runner)
            self.clusters[job.id] = cluster
        try:
            plans = cluster.new_attempt(number, self._cursor(job, pointer))
        except (DeployError, ConfigError, OSError) as exc:
            cluster.stop_shards()
            return [{} for _ in range(job.learners)], DeployError(f"parameter servers / coordinator: {exc}")
        return [plan.env for plan in sorted(plans, key=lambda p: p.index)], None

    def _cursor(self, job: JobRow, pointer: dict[str, Any] | None) -> dict[str, Any] | None:
        """The global cursor's state in rank 0's checkpoint ``pointer`` names (``None``: none, or unreadable)."""
        if pointer is None or pointer.get("kind", "file") != "file":
            return None
        from labswarm.train import checkpoint

        with tempfile.TemporaryDirectory() as tmp:
            try:
                path = Path(tmp) / "checkpoint.pt"
                self.runtime.storage(job).get_file(pointer["key"], path)
                state = checkpoint.load(path)
            except Exception as exc:  # no cursor: the passes after the checkpoint start clean anyway
                log.warning("job %s: no cursor from checkpoint %s: %s", job.id, pointer["key"], exc)
                return None
        return (state.get("distributed") or {}).get("cursor")


def _detect_gpus() -> list[str]:
    """The GPUs ``nvidia-smi -L`` lists (their indices); none without it."""
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [str(i) for i, line in enumerate(line for line in out.splitlines() if line.startswith("GPU "))]
