"""The runtime context of the jobs' lifecycle: what the job service hands down to it (database, lock, settings,
local folder, the manager's URL, each job's results store), so that no part of the lifecycle holds a reference
back to the service that owns it."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session

from labswarm.auth.overrides import PolicyStore
from labswarm.jobs.records.models import JobRow
from labswarm.jobs.spec import layout
from labswarm.settings import Settings
from labswarm.storage.base import Storage


@dataclass(frozen=True)
class JobRuntime:
    """What the parts of the jobs service share (the service builds it; the lifecycle, its deploys and outcomes
    are given it).

    Attributes:
        settings: the manager's settings (``job_*``, ``swarm_*``).
        db: opens a database session (a context manager).
        lock: the one lock under which every change of a job happens (a re-entrant lock).
        home: the jobs' local folder, ``<home>/jobs``: each attempt's learner specs, raw output, working folders.
        manager_url: the manager's URL as learners on this machine reach it, asked at each deploy (the serving
            process sets it); ``None`` while it is not served.
        policies: the users' weights and quotas (:mod:`labswarm.auth.overrides`: the settings', the tokens file's
            and an admin's), shared with the sessions' service; ``None``: the settings' and the tokens file's only.
    """

    settings: Settings
    db: Callable[[], AbstractContextManager[Session]]
    lock: AbstractContextManager[Any]
    home: Path
    manager_url: Callable[[], str | None]
    policies: PolicyStore | None = None

    def storage(self, job: JobRow) -> Storage:
        """The job's folder of its results store."""
        return layout.job_storage(job.manifest["results_store"], job.id)
