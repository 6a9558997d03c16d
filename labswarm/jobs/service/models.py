"""The jobs' tables, under their former name: they live in :mod:`labswarm.jobs.records.models`, below the service
and the lifecycle alike. Kept for the callers outside the jobs package (the dashboard, the database's list of
table modules) until they import from there."""

from labswarm.jobs.records.models import AttemptRow, JobEventRow, JobRow, LearnerRow, naive_utcnow

__all__ = ["AttemptRow", "JobEventRow", "JobRow", "LearnerRow", "naive_utcnow"]
