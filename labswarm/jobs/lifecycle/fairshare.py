"""Weighted fair share between users: the order in which the lifecycle starts queued jobs, and the machine's
default number of learner slots.

Each time slots are free, the next job is the best job of the user who is furthest below their share:

1. the fewest learner slots held now per unit of weight (``held / weight``): the instantaneous fair share of
   YARN's Fair Scheduler (its ``FairSharePolicy`` compares each queue's usage divided by its weight), so slots
   freed together are spread over the users who wait;
2. then the least slot-time used per unit of weight (``used / weight``), where ``used`` is the learner-seconds of
   the user's attempts (running ones up to now), each second decayed by ``2^(-age / half_life)``: Slurm's
   fair-share usage with its ``PriorityDecayHalfLife`` (``fair_share_half_life``, 7 days by default). Ordering by
   ``used / weight`` is ordering by Slurm's classic factor ``2^(-(used / total) / (weight / weights))``, which
   falls as usage rises against shares; it is the virtual finish time of weighted fair queuing (Demers, Keshav,
   Shenker, SIGCOMM 1989) with slot-seconds as the service;
3. then, among that user's jobs, the higher ``priority``, then the earlier submission (then the id): a user's
   priorities order their own jobs, not other users' (a priority cannot buy a larger share).

With one slot and two users of equal weight, their jobs alternate (each start makes the other user the one
below their share); a user of weight 2 gets about two slots' time for the other's one. The job chosen holds the
ones behind it when it does not fit (strict order: a large job is not starved by small ones); a user at a
running quota (:mod:`labswarm.auth.quotas`) is passed over instead, the reason written on their queued jobs.

Usage is read from the attempts of the jobs in the database: a deleted job's usage is forgotten with it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from labswarm.jobs.records.models import AttemptRow, JobRow
from labswarm.jobs.spec.states import HOLDS_SLOTS, JobState
from labswarm.threads import usable_cores

#: Past this many half-lives an attempt's usage (< 2^-30 of it) is not read.
FORGOTTEN_AFTER = 30


def machine_slots() -> int:
    """The default ``job_slots``: the CPU cores this process may run on (:func:`~labswarm.threads.usable_cores`),
    at least 1."""
    return len(usable_cores())


def decayed_seconds(started: datetime, ended: datetime | None, now: datetime, half_life: float) -> float:
    """Seconds from ``started`` to ``ended`` (``None``: ``now``), each weighted ``2^(-age / half_life)`` with its
    age at ``now``: ``H / ln 2 * (2^(-(now - end) / H) - 2^(-(now - start) / H))``, in seconds (naive UTC)."""
    end = min(ended or now, now)
    if end <= started:
        return 0.0
    age_end, age_start = (now - end).total_seconds(), (now - started).total_seconds()
    return half_life / math.log(2) * (2.0 ** (-age_end / half_life) - 2.0 ** (-age_start / half_life))


def usage(db: Session, owners: Iterable[str], now: datetime, half_life: float) -> dict[str, float]:
    """Each of ``owners``' decayed learner-seconds (:func:`decayed_seconds` x learners, over their jobs'
    attempts); 0 for one with none."""
    owners = set(owners)
    used = dict.fromkeys(owners, 0.0)
    if not owners:
        return used
    since = now - timedelta(seconds=FORGOTTEN_AFTER * half_life)
    rows = db.execute(select(JobRow.owner, JobRow.learners, AttemptRow.started_at, AttemptRow.ended_at)
                      .join(JobRow, JobRow.id == AttemptRow.job_id)
                      .where(JobRow.owner.in_(owners), or_(AttemptRow.ended_at.is_(None), AttemptRow.ended_at > since)))
    for owner, learners, started, ended in rows:
        used[owner] += learners * decayed_seconds(started, ended, now, half_life)
    return used


def held(db: Session) -> tuple[dict[str, int], dict[str, int]]:
    """The learners and the GPUs each user's jobs hold now (those in a state that holds slots), by user."""
    learners: dict[str, int] = {}
    gpus: dict[str, int] = {}
    rows = db.execute(select(JobRow.owner, JobRow.learners, JobRow.manifest)
                      .where(JobRow.status.in_([s.value for s in HOLDS_SLOTS])))
    for owner, count, manifest in rows:
        learners[owner] = learners.get(owner, 0) + count
        gpus[owner] = gpus.get(owner, 0) + job_gpus(count, manifest)
    return learners, gpus


def job_gpus(learners: int, manifest: dict | None) -> int:
    """The GPUs a job of ``learners`` learners holds: ``resources.gpus`` each."""
    return learners * int(((manifest or {}).get("resources") or {}).get("gpus", 0) or 0)


class FairQueue:
    """The queued jobs in fair-share order (see the module docstring), taken one at a time.

    Args:
        queued: the queued jobs (any order).
        held: learners each user holds now (charged as jobs are taken).
        used: each user's decayed slot-seconds (:func:`usage`).
        weight: a user's fair-share weight (> 0).
    """

    def __init__(self, queued: Iterable[JobRow], held: dict[str, int], used: dict[str, float],
                 weight: Callable[[str], float]) -> None:
        self.held, self.used, self.weight = dict(held), used, weight
        self.jobs: dict[str, list[JobRow]] = {}
        for job in sorted(queued, key=lambda j: (-j.priority, j.submitted_at, j.id), reverse=True):
            self.jobs.setdefault(job.owner, []).append(job)  # each user's best job last (popped)

    def _key(self, owner: str) -> tuple[float, float, int, datetime, str]:
        head, weight = self.jobs[owner][-1], self.weight(owner)
        return (self.held.get(owner, 0) / weight, self.used.get(owner, 0.0) / weight, -head.priority,
                head.submitted_at, head.id)

    def peek(self) -> JobRow | None:
        """The next job, or ``None`` when none is left."""
        if not self.jobs:
            return None
        return self.jobs[min(self.jobs, key=self._key)][-1]

    def take(self, job: JobRow) -> None:
        """Take ``job`` (the one :meth:`peek` gave): its user now holds its learners too."""
        self.jobs[job.owner].pop()
        if not self.jobs[job.owner]:
            del self.jobs[job.owner]
        self.held[job.owner] = self.held.get(job.owner, 0) + job.learners

    def drop(self, owner: str) -> list[JobRow]:
        """Pass over ``owner`` (at a quota) for the rest of this order; their jobs left, best first."""
        return self.jobs.pop(owner, [])[::-1]

    def order(self) -> list[JobRow]:
        """Take every job in turn: the whole order (as if each fit)."""
        out = []
        while (job := self.peek()) is not None:
            self.take(job)
            out.append(job)
        return out


def queue_order(db: Session, weight: Callable[[str], float], half_life: float, now: datetime) -> list[JobRow]:
    """The queued jobs in the order they would start if each fit (their queue positions, 1 first)."""
    queued = list(db.scalars(select(JobRow).where(JobRow.status == JobState.QUEUED.value)))
    if not queued:
        return []
    return FairQueue(queued, held(db)[0], usage(db, {j.owner for j in queued}, now, half_life), weight).order()
