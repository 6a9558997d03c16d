"""What follows the end of a job's attempt: completion, halt, a restart within the restart policy's budgets,
or failure; and the garbage collection of a job that ends (the second step of the lifecycle's pass, see
:mod:`labswarm.jobs.lifecycle.lifecycle`).

An attempt has ended once every learner of it has ended. Exit 0 → STORING → COMPLETED (the model is in the
results store); a halt → HALTED with its checkpoint; a fault (:func:`~labswarm.jobs.spec.errors.classify_exit`) within
its restart budget (user or platform) → PENDING, deployed again after the backoff as a new attempt from the last
committed checkpoint; beyond it → FAILED with the error code and the log tail. A job that ends COMPLETED or
FAILED releases its slots, and its local working folders are removed. An ended attempt's own token
(:mod:`labswarm.jobs.records.credentials`) is revoked.

Distributed jobs (:func:`~labswarm.train.distributed.launch.restart_scope`): under a synchronous framework a learner's
death ends the attempt (its live peers are killed at once rather than left to fail their next collective after
the collective timeout) and every learner restarts from the last checkpoint as a new attempt; under an
asynchronous one the dead learner alone is started again in the same attempt
(:meth:`AttemptOutcomes._restart_learners`), each such restart counted in the restart budgets.
"""

from __future__ import annotations

import logging
import shutil
import signal
from datetime import timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from labswarm.config.manifest import RestartPolicy
from labswarm.deploy.learners import LearnerLauncher
from labswarm.errors import StorageError
from labswarm.jobs.lifecycle.cluster import JobCluster
from labswarm.jobs.lifecycle.deployer import Deployer
from labswarm.jobs.lifecycle.runtime import JobRuntime
from labswarm.jobs.records import events
from labswarm.jobs.records.models import AttemptRow, JobRow, LearnerRow, naive_utcnow
from labswarm.jobs.spec import layout
from labswarm.jobs.spec.errors import EXIT_HALTED, ErrorCode, ExitVerdict, Fault, classify_exit
from labswarm.jobs.spec.states import HOLDS_SLOTS, JobState
from labswarm.train.distributed.launch import restart_scope

log = logging.getLogger(__name__)

_S = JobState


def restart_policy(job: JobRow) -> RestartPolicy:
    """The restart policy of ``job``, parsed from its stored manifest's ``restart`` section (validated when the job
    was submitted or changed): the one place the lifecycle reads it, once per decision, so that the verdict on an
    attempt's exit codes, the user-fault test and the budgets all see the same policy."""
    return RestartPolicy.model_validate(job.manifest["restart"])


def take_restart(job: JobRow, policy: RestartPolicy, fault: Fault, *, allowed: bool = True) -> str | None:
    """Count one restart of ``job`` against the budget of ``fault``'s kind (``policy.max_restarts_user`` or
    ``max_restarts_platform``), unless that budget is spent or ``allowed`` is false (a restart ruled out for
    another reason): the one place the lifecycle decides whether a restart budget is spent.

    Returns:
        ``None`` when the restart is counted (``job.restarts_user`` or ``restarts_platform`` one more); otherwise,
        nothing counted, the budget's state for the failure reason, e.g. ``"user restarts used: 3 of 3"``.
    """
    user = fault is Fault.USER
    used, budget = ((job.restarts_user, policy.max_restarts_user) if user
                    else (job.restarts_platform, policy.max_restarts_platform))
    if used >= budget or not allowed:
        return f"{fault.value} restarts used: {used} of {budget}"
    if user:
        job.restarts_user += 1
    else:
        job.restarts_platform += 1
    return None


class AttemptOutcomes:
    """The lifecycle's decisions at the end of an attempt (a part of
    :class:`~labswarm.jobs.lifecycle.lifecycle.JobLifecycle`).

    Args:
        runtime: the jobs' database, lock, settings, local folder and results stores.
        learners: the launcher of the learners.
        clusters: the distributed jobs' coordinators and shards, by job id (shared with the lifecycle).
        tokens: the token of each live attempt, by (job id, attempt) (shared with the lifecycle).
        deployer: what deploys a job's next attempt, or restarts one learner.
    """

    def __init__(self, runtime: JobRuntime, learners: LearnerLauncher, clusters: dict[str, JobCluster],
                 tokens: dict[tuple[str, int], str], deployer: Deployer) -> None:
        self.runtime = runtime
        self.learners = learners
        self.clusters = clusters
        self.tokens = tokens
        self.deployer = deployer

    def advance(self, db: Session) -> None:
        """Decide what follows each ended attempt of the jobs that hold slots (see the module docstring), and
        deploy the pending jobs whose backoff is over."""
        now = naive_utcnow()
        active = [s.value for s in HOLDS_SLOTS]
        for job in list(db.scalars(select(JobRow).where(JobRow.status.in_(active)))):
            learners = list(db.scalars(select(LearnerRow).where(LearnerRow.job_id == job.id,
                                                                LearnerRow.attempt == job.attempt)))
            if job.learners > 1 and job.status != _S.HALTING.value:
                self._restart_learners(db, job, learners)
            if any(lr.ended_at is None for lr in learners):
                continue
            attempt = db.get(AttemptRow, (job.id, job.attempt)) if job.attempt else None
            if attempt is not None and attempt.ended_at is None:
                self._ended(db, job, attempt, learners)
            if job.status == _S.HALTING.value:  # halted while waiting for a restart: nothing to stop
                events.transition(db, job, _S.HALTED, reason="halted", detail={"checkpoint": job.checkpoint})
                job.halt_at = None
            elif job.status == _S.PENDING.value and (job.not_before is None or now >= job.not_before):
                self.deployer.deploy(db, job)

    def _ended(self, db: Session, job: JobRow, attempt: AttemptRow, learners: list[LearnerRow]) -> None:
        """Decide what follows the end of ``attempt`` (every learner of it has ended); its token is revoked."""
        attempt.ended_at = naive_utcnow()
        attempt.token_sha256 = None
        self.tokens.pop((job.id, attempt.number), None)
        cluster = self.clusters.get(job.id)
        if cluster is not None:  # the next attempt gets a fresh coordinator and its shards back from their checkpoints
            cluster.close()
        try:
            pointer = layout.latest_checkpoint(self.runtime.storage(job))
        except StorageError as exc:
            log.warning("job %s: cannot read its checkpoint pointer: %s", job.id, exc)
            pointer = job.checkpoint
        if pointer is not None:
            job.checkpoint = pointer
            if pointer.get("attempt") == attempt.number:
                attempt.checkpoint_out = pointer
        policy = restart_policy(job)
        codes = [lr.exit_code for lr in learners]
        bad = next((c for c in codes if c != 0), 0)
        # a learner's own user-fault exit (a C1xx refusal, a user exit code) is the attempt's cause: its peers'
        # failures (a collective broken by its exit, a peer killed for it) follow from it, and whichever rank
        # came first must not make a user's fault a platform restart (under load rank 0's broken collective
        # was first in rank order and the job was restarted twice before the refusal counted)
        bad = next((c for c in codes if c not in (0, None) and _user_fault(policy, c)), bad)
        attempt.exit_code = bad
        verdict = _verdict(policy, learners, bad)
        if verdict is None:  # every learner exited 0 (a halt it did not see included): the job completes
            attempt.reason = "completed"
            self._attempt_event(db, job, attempt)
            self._store(db, job)
        elif job.status == _S.HALTING.value:
            # stopped as asked: exited as halted, killed after the grace, or by the SIGTERM itself
            halted = (pointer is not None or bad in (EXIT_HALTED, -signal.SIGTERM, 128 + signal.SIGTERM)
                      or any(lr.killed == "halt" for lr in learners))
            attempt.reason = "halted" if halted else verdict.detail
            attempt.error_code = None if halted else verdict.code.value
            self._attempt_event(db, job, attempt)
            if halted:
                events.transition(db, job, _S.HALTED, reason="halted" + (f" with checkpoint {pointer['key']}"
                                                                         if pointer else " (no checkpoint)"),
                                  detail={"checkpoint": pointer})
            else:
                self._fail(db, job, attempt, verdict)
            job.halt_at = None
        else:
            attempt.reason, attempt.error_code = verdict.detail, verdict.code.value
            self._attempt_event(db, job, attempt)
            self._restart_or_fail(db, job, attempt, verdict, pointer, policy)

    def _restart_learners(self, db: Session, job: JobRow, learners: list[LearnerRow]) -> None:
        """An asynchronous framework's dead learners (:func:`~labswarm.train.distributed.launch.restart_scope` says
        ``learner``) start again alone, in the same attempt, within the restart budgets: each from its own last
        checkpoint (it pulls the current parameters from the shards, and the global cursor hands it what is left
        of the pass). Each restart is an ``attempt`` event ``learner_restarted`` (the attempts list shows them).
        A learner that exited 0, was killed for a delete or could not be deployed is left to the attempt's end."""
        if restart_scope(job.manifest["framework"]) != "learner":  # synchronous: the attempt ends with it
            if any(lr.ended_at is not None and lr.exit_code != 0 for lr in learners):
                for peer in learners:
                    if peer.ended_at is None and peer.killed is None:
                        log.info("job %s: learner %d stopped: a peer died (the attempt restarts)", job.id, peer.rank)
                        peer.killed = "peer"
                        self.learners.kill(peer)
            return
        policy = restart_policy(job)
        for learner in learners:
            if learner.ended_at is None or learner.exit_code == 0 or learner.killed in ("delete", "deploy", "halt"):
                continue
            verdict = _verdict(policy, [learner], learner.exit_code)
            if verdict is None:
                continue
            if take_restart(job, policy, verdict.fault, allowed=(job.id, job.attempt) in self.tokens) is not None:
                continue  # the attempt ends with it (a restarted manager has not the attempt's token: a new one)
            try:
                pointer = layout.latest_checkpoint(self.runtime.storage(job))
            except StorageError:
                pointer = job.checkpoint
            old = {"pid": learner.pid, "exit_code": learner.exit_code, "killed": learner.killed}
            self.deployer.restart_learner(db, job, learner, pointer)
            log.info("job %s: learner %d restarted alone (%s) from %s", job.id, learner.rank, verdict.detail,
                     pointer["key"] if pointer else "scratch")
            events.append(db, job, "attempt", {"attempt": job.attempt, "event": "learner_restarted",
                                               "rank": learner.rank, "error_code": verdict.code.value,
                                               "reason": verdict.detail, "previous": old, "pid": learner.pid,
                                               "checkpoint": pointer}, attempt=job.attempt)

    def _attempt_event(self, db: Session, job: JobRow, attempt: AttemptRow) -> None:
        events.append(db, job, "attempt", {"attempt": attempt.number, "event": "ended", "exit_code": attempt.exit_code,
                                           "error_code": attempt.error_code, "reason": attempt.reason,
                                           "checkpoint": attempt.checkpoint_out}, attempt=attempt.number)

    def _store(self, db: Session, job: JobRow) -> None:
        if job.status == _S.PENDING.value:
            events.transition(db, job, _S.RUNNING, reason=f"attempt {job.attempt} running")
        if job.status in (_S.RUNNING.value, _S.HALTING.value):
            events.transition(db, job, _S.STORING, reason="storing the results")
        job.halt_at = None
        if job.manifest["framework"]["name"] != "command":  # our trainer (one learner or distributed)
            try:
                stored = self.runtime.storage(job).exists(layout.MODEL_KEY)
                why = "the learner ended without storing the model"
            except StorageError as exc:
                stored, why = False, str(exc)
            if not stored:
                events.transition(db, job, _S.FAILED, reason=why, error_code=ErrorCode.STORAGE_FAILED)
                self._collect(job)
                return
        events.transition(db, job, _S.COMPLETED, reason="completed",
                          detail={"model": layout.MODEL_KEY if job.manifest["framework"]["name"] != "command"
                                  else None})
        self._collect(job)

    def _restart_or_fail(self, db: Session, job: JobRow, attempt: AttemptRow, verdict: ExitVerdict,
                         pointer: dict[str, Any] | None, policy: RestartPolicy) -> None:
        spent = take_restart(job, policy, verdict.fault, allowed=job.status != _S.STORING.value)
        if spent is not None:
            self._fail(db, job, attempt, verdict, budget=spent)
            return
        restarts = job.restarts_user + job.restarts_platform
        delay = policy.backoff(restarts)
        job.not_before = naive_utcnow() + timedelta(seconds=delay)
        reason = (f"restart {restarts} after {verdict.code.value} ({verdict.detail}) in {delay:.1f} s, from "
                  + (f"checkpoint {pointer['key']}" if pointer else "scratch"))
        log.info("job %s: %s", job.id, reason)
        if job.status == _S.RUNNING.value:
            events.transition(db, job, _S.PENDING, reason=reason, error_code=verdict.code)
        else:  # PENDING: it never reported; the state stays, the attempt event told why
            job.reason = reason

    def _fail(self, db: Session, job: JobRow, attempt: AttemptRow, verdict: ExitVerdict, budget: str = "") -> None:
        reason = f"{verdict.code.text}: {verdict.detail}" + (f" ({budget})" if budget else "")
        events.transition(db, job, _S.FAILED, reason=reason, error_code=verdict.code,
                          detail={"exit_code": attempt.exit_code,
                                  "log_tail": events.log_tail(db, job.id, attempt.number)})
        self._collect(job)

    def _collect(self, job: JobRow) -> None:
        """A terminal job's local working folders go (copies of its checkpoints and model: the results store has
        them); the spec and raw output files of each learner stay, small, for a post-mortem. A distributed job's
        shards and coordinator are closed."""
        cluster = self.clusters.pop(job.id, None)
        if cluster is not None:
            cluster.close()
        for workdir in (self.runtime.home / job.id).glob("attempt-*/rank-*"):
            shutil.rmtree(workdir, ignore_errors=True)
        self.learners.collect(job.id)  # what its learners left elsewhere (a swarm's chunk records)


def _user_fault(policy: RestartPolicy, code: int) -> bool:
    """Whether exit ``code`` alone is the user's fault (:func:`classify_exit` with ``policy``'s user exit codes)."""
    verdict = classify_exit(code, killed_by_platform=False, user_exit_codes=policy.user_exit_codes)
    return verdict is not None and verdict.fault == Fault.USER


def _verdict(policy: RestartPolicy, learners: list[LearnerRow], code: int | None) -> ExitVerdict | None:
    """What the exit ``code`` of ``learners`` (an attempt's, or one learner's) says: a deploy failure if one could
    not be started, else :func:`classify_exit` (killed for hanging: the platform's; ``policy``'s user exit codes);
    ``None``: a clean exit."""
    if any(lr.killed == "deploy" for lr in learners):
        return ExitVerdict(ErrorCode.DEPLOY_FAILED, "the learner could not be started")
    return classify_exit(code, killed_by_platform=any(lr.killed == "hung" for lr in learners),
                         user_exit_codes=policy.user_exit_codes)
