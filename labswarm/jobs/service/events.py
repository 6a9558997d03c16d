"""A job's event stream, under its former name: it lives in :mod:`labswarm.jobs.records.events`, below the service
and the lifecycle alike. Kept for the callers outside the jobs service's own modules (the ``/v1/jobs`` routes)
until they import from there."""

from labswarm.jobs.records.events import LOG_TAIL, append, iso, known_keys, log_tail, transition

__all__ = ["LOG_TAIL", "append", "iso", "known_keys", "log_tail", "transition"]
