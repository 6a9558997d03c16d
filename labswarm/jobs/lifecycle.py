"""The lifecycle manager of training jobs: the queue, the deploys, the watchdog, the restarts.

One thread does a pass every :data:`TICK` seconds (sooner when woken), under the job service's lock:

1. **watch** every learner that has not ended: a live one that has not reported for ``job_heartbeat_timeout``
   (``job_start_timeout`` before its first report) is hung: killed, and its attempt handled like a crash; a halt
   sends SIGTERM to it once and kills it after ``job_halt_grace``. A learner found dead gets its exit code, its
   process group is cleaned up, and the output it printed outside its own capture is added to the job's log;
2. **advance** each job whose attempt has ended: exit 0 → STORING → COMPLETED (the model is in the results store);
   a halt → HALTED with its checkpoint; a fault (:func:`~labswarm.jobs.errors.classify_exit`) within its restart
   budget (user or platform) → PENDING, deployed again after the backoff as a new attempt from the last committed
   checkpoint; beyond it → FAILED with the error code and the log tail;
   A job that ends COMPLETED or FAILED releases its slots, and its local working folders are removed;
3. **schedule** queued jobs, by priority then submission, while their learners fit in ``job_slots`` (and their
   GPUs in the free ones): QUEUED → PENDING, deployed.

Nothing lives only in memory: a restarted manager finds the learners in the database (pid and process start
time) and re-attaches to those alive; a dead one's exit code is in its working folder (``exit.json``). A new
attempt is deployed only once every learner of the previous one is known dead, so a learner never runs twice.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from labswarm.errors import StorageError
from labswarm.jobs import events, layout
from labswarm.jobs.errors import EXIT_HALTED, ErrorCode, ExitVerdict, Fault, classify_exit
from labswarm.jobs.manifest import RestartPolicy
from labswarm.jobs.models import AttemptRow, JobRow, LearnerRow, naive_utcnow
from labswarm.jobs.processes import LocalLearners
from labswarm.jobs.states import HOLDS_SLOTS, JobState

if TYPE_CHECKING:
    from labswarm.jobs.service import JobService

log = logging.getLogger(__name__)

#: Seconds between two passes while a job is queued or holds slots (sooner when woken).
TICK = 0.2
#: Seconds between two passes while no job is queued or holds slots (a submit, halt or resume wakes it).
IDLE_TICK = 2.0
#: Lines of a learner's raw output (printed outside its capture) added to the job's log when it ends.
RAW_TAIL = 200

_S = JobState


class JobLifecycle:
    """The thread that moves jobs through their states (see the module docstring).

    Args:
        service: the job service (database, lock, settings, the manager's URL).
    """

    def __init__(self, service: JobService) -> None:
        self.service = service
        self.settings = service.settings
        self.learners = LocalLearners()
        self.host = socket.gethostname()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._started = naive_utcnow()
        self._gpus: list[str] | None = None

    def start(self) -> None:
        """Start the thread (re-attaching to the learners a previous manager left)."""
        self._started = naive_utcnow()
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="labswarm-jobs", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the thread; learners keep running."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def wake(self) -> None:
        """Do a pass now."""
        self._wake.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            busy = True
            try:
                busy = self.tick()
            except Exception:  # one failed pass must not end the thread: the next one retries
                log.exception("job lifecycle: a pass failed")
            self._wake.wait(TICK if busy else IDLE_TICK)
            self._wake.clear()

    def tick(self) -> bool:
        """One pass: watch, advance, schedule. Returns whether any job is queued or holds slots."""
        with self.service.lock, self.service.db() as db:
            self._watch(db)
            db.commit()
            self._advance(db)
            db.commit()
            self._schedule(db)
            db.commit()
            waiting = [_S.QUEUED.value, *(s.value for s in HOLDS_SLOTS)]
            return db.scalar(select(JobRow.id).where(JobRow.status.in_(waiting)).limit(1)) is not None

    # 1. watch
    def _watch(self, db: Session) -> None:
        now = naive_utcnow()
        rows = db.execute(select(LearnerRow, JobRow).join(JobRow, JobRow.id == LearnerRow.job_id)
                          .where(LearnerRow.ended_at.is_(None))).all()
        for learner, job in rows:
            alive, code = (self.learners.poll(learner.pid, learner.pid_created, Path(learner.workdir))
                           if learner.pid is not None else (False, None))
            if alive:
                self._police(learner, job, now)
                continue
            if learner.pid is not None:
                self.learners.kill(learner.pid, learner.pid_created)  # what it left in its group
            learner.ended_at, learner.exit_code = now, code
            log.info("job %s attempt %d learner %d ended: exit code %s", job.id, learner.attempt, learner.rank, code)
            self._raw_output(db, job, learner)

    def _police(self, learner: LearnerRow, job: JobRow, now: datetime) -> None:
        """The watchdog and the halt of one live learner."""
        if learner.killed is not None:
            self.learners.kill(learner.pid, learner.pid_created)  # again: it has not died yet
            return
        limit = self.settings.job_heartbeat_timeout if learner.last_seen else self.settings.job_start_timeout
        since = max(learner.last_seen or learner.started_at, self._started)  # a restarted manager gives time
        if (now - since).total_seconds() > limit:
            log.warning("job %s attempt %d learner %d (pid %d) sent nothing for %.0f s: hung, killed", job.id,
                        learner.attempt, learner.rank, learner.pid, (now - since).total_seconds())
            learner.killed = "hung"
            self.learners.kill(learner.pid, learner.pid_created)
        elif job.halt_at is not None:
            # SIGTERM once it has reported (its handler is installed by then); before, the answer to its first
            # report asks it to halt
            if not learner.halt_sent and learner.last_seen is not None:
                learner.halt_sent = True
                self.learners.terminate(learner.pid, learner.pid_created)
            if (now - job.halt_at).total_seconds() > self.settings.job_halt_grace:
                log.warning("job %s learner %d did not halt within %.0f s: killed", job.id, learner.rank,
                            self.settings.job_halt_grace)
                learner.killed = "halt"
                self.learners.kill(learner.pid, learner.pid_created)

    def _raw_output(self, db: Session, job: JobRow, learner: LearnerRow) -> None:
        """What the learner printed outside its own capture (a crash before it started capturing) into the log."""
        out = Path(learner.workdir).parent / f"learner-{learner.rank}.out"
        try:
            lines = out.read_text(encoding="utf-8", errors="replace").splitlines()[-RAW_TAIL:]
        except OSError:
            return
        for line in lines:
            events.append(db, job, "log", {"line": line, "rank": learner.rank, "source": "launcher"},
                          attempt=learner.attempt)

    def kill_and_wait(self, learners: list[LearnerRow], timeout: float = 15.0) -> None:
        """Kill these learners (process groups) and wait until they are gone (a delete)."""
        deadline = time.monotonic() + timeout
        for learner in learners:
            if learner.pid is None:
                continue
            self.learners.kill(learner.pid, learner.pid_created)
            while self.learners.poll(learner.pid, learner.pid_created, Path(learner.workdir))[0]:
                if time.monotonic() > deadline:
                    log.error("learner pid %d did not die within %.0f s", learner.pid, timeout)
                    break
                time.sleep(0.05)

    # 2. advance
    def _advance(self, db: Session) -> None:
        now = naive_utcnow()
        active = [s.value for s in HOLDS_SLOTS]
        for job in list(db.scalars(select(JobRow).where(JobRow.status.in_(active)))):
            learners = list(db.scalars(select(LearnerRow).where(LearnerRow.job_id == job.id,
                                                                LearnerRow.attempt == job.attempt)))
            if any(lr.ended_at is None for lr in learners):
                continue
            attempt = db.get(AttemptRow, (job.id, job.attempt)) if job.attempt else None
            if attempt is not None and attempt.ended_at is None:
                self._ended(db, job, attempt, learners)
            if job.status == _S.HALTING.value:  # halted while waiting for a restart: nothing to stop
                events.transition(db, job, _S.HALTED, reason="halted", detail={"checkpoint": job.checkpoint})
                job.halt_at = None
            elif job.status == _S.PENDING.value and (job.not_before is None or now >= job.not_before):
                self._deploy(db, job)

    def _ended(self, db: Session, job: JobRow, attempt: AttemptRow, learners: list[LearnerRow]) -> None:
        """Decide what follows the end of ``attempt`` (every learner of it has ended)."""
        attempt.ended_at = naive_utcnow()
        try:
            pointer = layout.latest_checkpoint(self.service.storage(job))
        except StorageError as exc:
            log.warning("job %s: cannot read its checkpoint pointer: %s", job.id, exc)
            pointer = job.checkpoint
        if pointer is not None:
            job.checkpoint = pointer
            if pointer.get("attempt") == attempt.number:
                attempt.checkpoint_out = pointer
        codes = [lr.exit_code for lr in learners]
        bad = next((c for c in codes if c != 0), 0)
        attempt.exit_code = bad
        verdict = self._verdict(job, learners, bad)
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
            self._restart_or_fail(db, job, attempt, verdict, pointer)

    def _verdict(self, job: JobRow, learners: list[LearnerRow], code: int | None) -> ExitVerdict | None:
        if any(lr.killed == "deploy" for lr in learners):
            return ExitVerdict(ErrorCode.DEPLOY_FAILED, "the learner could not be started")
        policy = RestartPolicy.model_validate(job.manifest["restart"])
        return classify_exit(code, killed_by_platform=any(lr.killed == "hung" for lr in learners),
                             user_exit_codes=policy.user_exit_codes)

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
        if job.manifest["framework"]["name"] == "labswarm":
            try:
                stored = self.service.storage(job).exists(layout.MODEL_KEY)
                why = "the learner ended without storing the model"
            except StorageError as exc:
                stored, why = False, str(exc)
            if not stored:
                events.transition(db, job, _S.FAILED, reason=why, error_code=ErrorCode.STORAGE_FAILED)
                self._collect(job)
                return
        events.transition(db, job, _S.COMPLETED, reason="completed",
                          detail={"model": layout.MODEL_KEY if job.manifest["framework"]["name"] == "labswarm"
                                  else None})
        self._collect(job)

    def _restart_or_fail(self, db: Session, job: JobRow, attempt: AttemptRow, verdict: ExitVerdict,
                         pointer: dict[str, Any] | None) -> None:
        policy = RestartPolicy.model_validate(job.manifest["restart"])
        user = verdict.fault is Fault.USER
        used, budget = ((job.restarts_user, policy.max_restarts_user) if user
                        else (job.restarts_platform, policy.max_restarts_platform))
        if used >= budget or job.status == _S.STORING.value:
            self._fail(db, job, attempt, verdict, budget=f"{verdict.fault.value} restarts used: {used} of {budget}")
            return
        if user:
            job.restarts_user += 1
        else:
            job.restarts_platform += 1
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
        them); the spec and raw output files of each learner stay, small, for a post-mortem."""
        for workdir in (self.service.home / job.id).glob("attempt-*/rank-*"):
            shutil.rmtree(workdir, ignore_errors=True)

    # 3. schedule and deploy
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
        """The GPUs the job's learners would get (``[]`` without GPUs), ``None`` when not enough are free."""
        wanted = int(job.manifest.get("resources", {}).get("gpus", 0)) * job.learners
        if not wanted:
            return []
        busy = {g for row in db.scalars(select(LearnerRow.gpus).where(LearnerRow.ended_at.is_(None))) if row
                for g in row.split(",")}
        free = [g for g in self._gpu_total() if g not in busy]
        return free[:wanted] if len(free) >= wanted else None

    def _deploy(self, db: Session, job: JobRow) -> None:
        """Start the next attempt's learners from the last committed checkpoint."""
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
        db.add(AttemptRow(job_id=job.id, number=number, started_at=now, checkpoint_in=pointer))
        gpus = self._free_gpus(db, job) or []
        per = int(job.manifest.get("resources", {}).get("gpus", 0))
        base = self.service.home / job.id / f"attempt-{number}"
        started = []
        for rank in range(job.learners):
            workdir = base / f"rank-{rank}"
            mine = ",".join(gpus[rank * per:(rank + 1) * per]) if per else None
            spec = {"job_id": job.id, "attempt": number, "rank": rank, "world_size": job.learners,
                    "manifest": job.manifest, "manager_url": url, "results_store": job.manifest["results_store"],
                    "checkpoint": pointer, "workdir": str(workdir.resolve())}
            spec_path = base / f"learner-{rank}.json"
            env = dict(os.environ)
            if self._gpu_total():
                env["CUDA_VISIBLE_DEVICES"] = mine or ""
            if self.settings.api_token:
                env["LABSWARM_API_TOKEN"] = self.settings.api_token
            row = LearnerRow(job_id=job.id, attempt=number, rank=rank, host=self.host, workdir=str(workdir),
                             gpus=mine, started_at=now, received=-1, halt_sent=False)
            try:
                spec_path.parent.mkdir(parents=True, exist_ok=True)
                spec_path.write_text(json.dumps(spec))
                row.pid, row.pid_created = self.learners.start(spec_path, base / f"learner-{rank}.out", env)
                started.append(row.pid)
            except OSError as exc:
                log.error("job %s: cannot start learner %d: %s", job.id, rank, exc)
                row.ended_at, row.killed = now, "deploy"
                events.append(db, job, "log", {"line": f"cannot start learner {rank}: {exc}", "rank": rank,
                                               "source": "launcher"}, attempt=number)
            db.add(row)
        events.append(db, job, "attempt", {"attempt": number, "event": "started", "checkpoint": pointer,
                                           "pids": started, "host": self.host}, attempt=number)
        db.commit()  # the pids, at once: a manager that dies now finds them
        log.info("job %s: attempt %d deployed (pids %s) from %s", job.id, number, started,
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
