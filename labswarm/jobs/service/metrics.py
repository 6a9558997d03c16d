"""Prometheus metrics of the training jobs, collected from the database at scrape time (the manager's
``/metrics``, beside the sessions' series of :mod:`labswarm.sessions.metrics`).

As for sessions, only the jobs not yet terminal and the :data:`RECENT` most recently submitted terminal ones are
collected (a few reads per job, whatever the number of jobs ever run). Names follow Prometheus' naming guide.

- ``labswarm_jobs{status}``: jobs per status, all of them (gauge);
- ``labswarm_job_status{job, name, status}``: 1 for the job's status, 0 for the others (a state set, gauge);
- ``labswarm_job_attempt``: the current attempt's number, from 1 (gauge);
- ``labswarm_job_learners``: learners the job asks for (gauge);
- ``labswarm_job_epoch``: the epoch being trained (or last trained), from the learners' progress (gauge);
- ``labswarm_job_loss``: the training loss of that progress, mean cross-entropy in nats (gauge);
- ``labswarm_job_validation_accuracy_ratio``: the last metrics record's validation accuracy, 0 to 1 (gauge);
- ``labswarm_job_samples_per_second``: training samples per second, summed over the learners (gauge).

A value a job does not have yet (no progress, no metrics record, a NaN loss) is no sample, not a NaN.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from sqlalchemy import func, select

from labswarm.jobs.records.models import JobEventRow, JobRow, LearnerRow
from labswarm.jobs.service.service import JobService
from labswarm.jobs.spec.states import TERMINAL, JobState

#: Terminal jobs collected besides the others, newest first.
RECENT = 10
_TERMINAL = [state.value for state in TERMINAL]


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and math.isfinite(value) else None


class JobCollector(Collector):
    """Collects the jobs' series from a :class:`~labswarm.jobs.service.service.JobService` when scraped."""

    def __init__(self, service: JobService) -> None:
        self.service = service

    def collect(self) -> Iterator[GaugeMetricFamily]:
        labels = ["job", "name"]
        families = {
            "status": GaugeMetricFamily("labswarm_job_status", "1 for the job's status, 0 for the others.",
                                        labels=[*labels, "status"]),
            "attempt": GaugeMetricFamily("labswarm_job_attempt", "The current attempt, from 1.", labels=labels),
            "learners": GaugeMetricFamily("labswarm_job_learners", "Learners the job asks for.", labels=labels),
            "epoch": GaugeMetricFamily("labswarm_job_epoch", "Epoch being trained (or last trained).", labels=labels),
            "loss": GaugeMetricFamily("labswarm_job_loss", "Training loss of the last progress, nats.",
                                      labels=labels),
            "accuracy": GaugeMetricFamily("labswarm_job_validation_accuracy_ratio",
                                          "Validation accuracy of the last metrics record.", labels=labels),
            "rate": GaugeMetricFamily("labswarm_job_samples_per_second",
                                      "Training samples per second, all learners.", labels=labels),
        }
        counts = GaugeMetricFamily("labswarm_jobs", "Jobs per status.", labels=["status"])
        with self.service.db() as db:
            per_status = {status: count for status, count in
                          db.execute(select(JobRow.status, func.count()).group_by(JobRow.status))}
            jobs = list(db.scalars(select(JobRow).where(JobRow.status.not_in(_TERMINAL))))
            jobs += db.scalars(select(JobRow).where(JobRow.status.in_(_TERMINAL))
                               .order_by(JobRow.submitted_at.desc(), JobRow.id).limit(RECENT))
            for job in jobs:
                self._job(db, job, families)
        for state in JobState:
            counts.add_metric([state.value], per_status.get(state.value, 0))
        yield counts
        yield from families.values()

    def _job(self, db: Any, job: JobRow, families: dict[str, GaugeMetricFamily]) -> None:
        key = [job.id, job.name or ""]
        for state in JobState:
            families["status"].add_metric([*key, state.value], 1.0 if job.status == state.value else 0.0)
        families["attempt"].add_metric(key, job.attempt)
        families["learners"].add_metric(key, job.learners)
        progress = [lr.progress or {} for lr in db.scalars(
            select(LearnerRow).where(LearnerRow.job_id == job.id, LearnerRow.attempt == job.attempt)
            .order_by(LearnerRow.rank))]
        epochs = [e for e in (_number(p.get("epoch")) for p in progress) if e is not None]
        if epochs:
            families["epoch"].add_metric(key, max(epochs))
        loss = _number(progress[0].get("loss")) if progress else None
        if loss is not None:
            families["loss"].add_metric(key, loss)
        rates = [r for r in (_number(p.get("samples_per_s")) for p in progress) if r is not None]
        if rates:
            families["rate"].add_metric(key, sum(rates))
        record = db.scalar(select(JobEventRow.payload).where(JobEventRow.job_id == job.id,
                                                             JobEventRow.kind == "metric")
                           .order_by(JobEventRow.seq.desc()).limit(1))
        accuracy = _number((record or {}).get("val_accuracy"))
        if accuracy is not None:
            families["accuracy"].add_metric(key, accuracy)
