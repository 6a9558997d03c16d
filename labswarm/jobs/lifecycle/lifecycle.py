"""The lifecycle manager of training jobs: the queue, the deploys, the watchdog, the restarts.

One thread does a pass every :data:`TICK` seconds (sooner when woken: a submit, halt or resume, the exit of a local
learner), under the job service's lock:

1. **watch** every learner that has not ended (here): a live one that has not reported for
   ``job_heartbeat_timeout`` (``job_start_timeout`` before its first report) is hung: killed, and its attempt
   handled like a crash; a halt sends SIGTERM to it once and kills it after ``job_halt_grace``. A learner found
   dead gets its exit code, its process group is cleaned up, and the output it printed outside its own capture is
   added to the job's log;
2. **advance** each job whose attempt has ended (:mod:`~labswarm.jobs.lifecycle.outcomes`): completion, halt, a restart
   within the restart policy's budgets, or failure; a job that ends releases its slots and is garbage-collected;
3. **schedule** queued jobs and **deploy** their attempts (:mod:`~labswarm.jobs.lifecycle.deployer`): QUEUED → PENDING,
   by priority then submission, while their learners fit in ``job_slots`` (and their GPUs in the free ones).

Learners run through a launcher (``LABSWARM_JOB_LAUNCHER``, :mod:`labswarm.deploy.learners`): local processes
or docker swarm services (:mod:`labswarm.deploy.swarm_learners`). Nothing lives only in memory: a restarted manager
finds the learners in the database (pid and process start time, or service id) and re-attaches to those alive; a
dead local one's exit code is in its working folder (``exit.json``), a swarm one's in its task. The first pass
removes the swarm services of the manager's jobs that no running learner names. A new attempt is deployed only
once every learner of the previous one is known dead, so a learner never runs twice.
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from labswarm.deploy.cgroups import cgroup_name
from labswarm.deploy.learners import learner_launcher
from labswarm.errors import StorageError
from labswarm.jobs.lifecycle.cluster import JobCluster
from labswarm.jobs.lifecycle.deployer import Deployer
from labswarm.jobs.lifecycle.outcomes import AttemptOutcomes, restart_policy, take_restart
from labswarm.jobs.lifecycle.runtime import JobRuntime
from labswarm.jobs.records import events
from labswarm.jobs.records.models import JobRow, LearnerRow, naive_utcnow
from labswarm.jobs.spec import layout
from labswarm.jobs.spec.errors import Fault
from labswarm.jobs.spec.states import HOLDS_SLOTS, JobState

log = logging.getLogger(__name__)

#: Seconds between two passes while a job is queued or holds slots (sooner when woken: a submit, halt or resume,
#: a local learner's exit). Each pass queries every active job's learners; at 0.2 s the passes took ~3 % of a core
#: while a 2-learner job ran, and a synchronous job's learners, one core each, lose twice what the manager takes.
TICK = 1.0
#: Seconds between two passes while no job is queued or holds slots (a submit, halt or resume wakes it).
IDLE_TICK = 2.0
#: Lines of a learner's raw output (printed outside its capture) added to the job's log when it ends.
RAW_TAIL = 200

_S = JobState


class JobLifecycle:
    """The thread that moves jobs through their states (see the module docstring): the watchdog here, the
    deploys in its :class:`~labswarm.jobs.lifecycle.deployer.Deployer`, the outcomes of attempts in its
    :class:`~labswarm.jobs.lifecycle.outcomes.AttemptOutcomes`.

    Args:
        runtime: the jobs' database, lock, settings, local folder, the manager's URL and results stores.
    """

    def __init__(self, runtime: JobRuntime) -> None:
        self.runtime = runtime
        self.settings = runtime.settings
        self.learners = learner_launcher(runtime.settings)  # LABSWARM_JOB_LAUNCHER: local processes or swarm
        self.learners.on_exit = self.wake  # a local learner's exit: a pass at once
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._started = naive_utcnow()
        self._swept = False
        #: distributed jobs' coordinators and shards (labswarm.jobs.lifecycle.cluster), by job id
        self.clusters: dict[str, JobCluster] = {}
        #: the token of each live attempt, by (job id, attempt): a learner restarted alone gets it again
        self.tokens: dict[tuple[str, int], str] = {}
        self.deployer = Deployer(runtime, self.learners, self.clusters, self.tokens)
        self.outcomes = AttemptOutcomes(runtime, self.learners, self.clusters, self.tokens, self.deployer)

    def start(self) -> None:
        """Start the thread (re-attaching to the learners a previous manager left)."""
        self._started = naive_utcnow()
        self._swept = False
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="labswarm-jobs", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the thread; learners keep running, but distributed jobs' shards and coordinators (held in this
        process's memory, :mod:`labswarm.jobs.lifecycle.cluster`) are closed: their learners fail and a restarted
        manager
        restarts them as a new attempt."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
        with self.runtime.lock:
            for cluster in self.clusters.values():
                cluster.close()
            self.clusters.clear()

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
        with self.runtime.lock, self.runtime.db() as db:
            if not self._swept:  # a previous manager's learners: adopt those recorded, remove the others
                # the handles of those not ended: a swarm learner's service, a local learner's cgroup name
                live = {sid or cgroup_name(job_id, attempt, rank) for sid, job_id, attempt, rank in db.execute(
                    select(LearnerRow.service_id, LearnerRow.job_id, LearnerRow.attempt, LearnerRow.rank)
                    .where(LearnerRow.ended_at.is_(None)))}
                self.learners.sweep(live, lambda job_id: db.get(JobRow, job_id) is not None)
                self._swept = True
            self._watch(db)
            self._watch_shards(db)
            db.commit()
            self.outcomes.advance(db)
            db.commit()
            self.deployer.schedule(db)
            db.commit()
            waiting = [_S.QUEUED.value, *(s.value for s in HOLDS_SLOTS)]
            return db.scalar(select(JobRow.id).where(JobRow.status.in_(waiting)).limit(1)) is not None

    # 1. watch
    def _watch(self, db: Session) -> None:
        now = naive_utcnow()
        rows = db.execute(select(LearnerRow, JobRow).join(JobRow, JobRow.id == LearnerRow.job_id)
                          .where(LearnerRow.ended_at.is_(None))).all()
        for learner, job in rows:
            status = self.learners.poll(learner)
            if status.alive:
                self._police(learner, job, now)
                continue
            learner.ended_at, learner.exit_code = now, status.exit_code
            if status.deploy_failed and learner.killed is None:
                learner.killed = "deploy"  # the platform could not start it (S105)
            log.info("job %s attempt %d learner %d ended: exit code %s%s", job.id, learner.attempt, learner.rank,
                     status.exit_code, f" ({status.reason})" if status.reason else "")
            self._raw_output(db, job, learner, status.reason)
            if status.exit_code != 0:
                self._store_chunk_record(job, learner)
            self.learners.kill(learner)  # what it left: its process group, or its service, secret and config

    def _watch_shards(self, db: Session) -> None:
        """A parameter-server shard that died is started again on its port; it resumes from its checkpoint. Each
        revival counts as a platform restart; beyond the budget the attempt's learners are killed (it fails)."""
        for job_id, cluster in list(self.clusters.items()):
            dead = cluster.dead_shards()
            job = db.get(JobRow, job_id) if dead else None
            if job is None:
                continue
            policy = restart_policy(job)
            for index in dead:
                if take_restart(job, policy, Fault.PLATFORM) is not None:
                    log.error("job %s: shard %d died beyond the platform restart budget", job_id, index)
                    cluster.stop_shards()
                    for learner in db.scalars(select(LearnerRow).where(LearnerRow.job_id == job_id,
                                                                       LearnerRow.ended_at.is_(None))):
                        learner.killed = "ps"
                        self.learners.kill(learner)
                    break
                try:
                    code = cluster.revive(index)
                    line = f"parameter-server shard {index} exited {code}: restarted from its checkpoint"
                except OSError as exc:
                    line = f"parameter-server shard {index} could not be restarted: {exc}"
                log.warning("job %s: %s", job_id, line)
                events.append(db, job, "log", {"line": line, "rank": -1 - index, "source": "launcher"},
                              attempt=job.attempt)

    def _police(self, learner: LearnerRow, job: JobRow, now: datetime) -> None:
        """The watchdog and the halt of one live learner."""
        if learner.killed is not None:
            self.learners.kill(learner)  # again: it has not died yet
            return
        limit = self.settings.job_heartbeat_timeout if learner.last_seen else self.settings.job_start_timeout
        since = max(learner.last_seen or learner.started_at, self._started)  # a restarted manager gives time
        if (now - since).total_seconds() > limit:
            log.warning("job %s attempt %d learner %d (%s) sent nothing for %.0f s: hung, killed", job.id,
                        learner.attempt, learner.rank, learner.pid or learner.service_id,
                        (now - since).total_seconds())
            learner.killed = "hung"
            self.learners.kill(learner)
        elif job.halt_at is not None:
            # SIGTERM once it has reported (its handler is installed by then); before, the answer to its first
            # report asks it to halt
            if not learner.halt_sent and learner.last_seen is not None:
                learner.halt_sent = True
                self.learners.terminate(learner)
            if (now - job.halt_at).total_seconds() > self.settings.job_halt_grace:
                log.warning("job %s learner %d did not halt within %.0f s: killed", job.id, learner.rank,
                            self.settings.job_halt_grace)
                learner.killed = "halt"
                self.learners.kill(learner)

    def _raw_output(self, db: Session, job: JobRow, learner: LearnerRow, reason: str | None) -> None:
        """What the learner printed outside its own capture (a crash before it started capturing) into the log,
        and the launcher's word on how it ended (a swarm task's state and error)."""
        lines = self.learners.output_tail(learner, RAW_TAIL)
        if reason:
            lines.append(f"learner {learner.rank}: {reason}")
        for line in lines:
            events.append(db, job, "log", {"line": line, "rank": learner.rank, "source": "launcher"},
                          attempt=learner.attempt)

    def _store_chunk_record(self, job: JobRow, learner: LearnerRow) -> None:
        """A distributed learner that ended badly (killed -9: it could not store it itself) has its chunk record
        stored from where the launcher keeps it (a local learner's working folder; a swarm learner's shared volume),
        so the job's record holds every chunk the cursor marked done (:mod:`labswarm.train.distributed.record`).
        A learner restarted alone appends to the same file and stores it again later."""
        path = self.learners.chunk_record(learner)
        if not path.is_file():
            return
        try:
            self.runtime.storage(job).put_file(layout.chunks_key(learner.attempt, learner.rank), path)
        except StorageError as exc:
            log.warning("job %s: learner %d's chunk record not stored: %s", job.id, learner.rank, exc)

    def kill_and_wait(self, learners: list[LearnerRow], timeout: float = 15.0, job_id: str | None = None) -> None:
        """Kill these learners (process groups, or services) and wait until they are gone (a delete); with
        ``job_id``, that job's shards and coordinator too (first: its learners cannot be restarted alone then)."""
        cluster = self.clusters.pop(job_id, None) if job_id is not None else None
        if cluster is not None:
            cluster.close(discard=True)  # a delete: the shards' checkpoints go too
        deadline = time.monotonic() + timeout
        for learner in learners:
            if learner.pid is None and learner.service_id is None:
                continue
            self.learners.kill(learner)
            while self.learners.poll(learner).alive:
                if time.monotonic() > deadline:
                    log.error("learner %s did not die within %.0f s", learner.pid or learner.service_id, timeout)
                    break
                time.sleep(0.05)
