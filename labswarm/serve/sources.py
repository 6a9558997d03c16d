"""Where the served models come from: a manager's training jobs (:class:`JobModels`) or one model file
(:class:`FileModel`, ``labswarm serve``). Each says whether a caller may use a model, and loads it."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Protocol

from labswarm.auth.tokens import User
from labswarm.errors import Conflict, NotFound
from labswarm.jobs.service.service import JobService
from labswarm.jobs.spec.states import JobState
from labswarm.predict import Predictor


class ModelSource(Protocol):
    """The models an endpoint serves, by key (the ``{job}`` of the URL).

    Attributes:
        instant: :meth:`check` does no I/O (it may run on the event loop: a cached model is then answered without
            a hand-over to a thread).
    """

    instant: bool

    def check(self, key: str, user: User | None) -> None:
        """Raise unless ``user`` may use the model of ``key`` now.

        Raises:
            NotFound: no such model, or not the user's (the same answer: nothing is disclosed).
            Conflict: the model is not ready (its job is still training).
        """

    def load(self, key: str, threads: int) -> Predictor:
        """The model of ``key``, loaded (see :class:`~labswarm.predict.Predictor`).

        Raises:
            NotFound: it has no model.
            CheckpointError: its model file is not usable.
        """


class JobModels:
    """The trained models of a manager's jobs: a job's owner and the admins may use it, once it is completed.

    Args:
        jobs: the manager's job service.
    """

    instant = False  # check() reads the database

    def __init__(self, jobs: JobService) -> None:
        self.jobs = jobs

    def check(self, key: str, user: User | None) -> None:
        """See :meth:`ModelSource.check`: another user's job is a :class:`NotFound`, as on every jobs route."""
        owner = None if user is None or user.is_admin else user.name
        with self.jobs.db() as db:
            job = self.jobs.get(db, key, owner)
            status = job.status
        if status != JobState.COMPLETED.value:
            raise Conflict(f"job {key} is {status}: its model is served once the job is completed")

    def load(self, key: str, threads: int) -> Predictor:
        """Download the job's model file from its results store, load it, delete the file."""
        path = self.jobs.model_file(key)
        try:
            return Predictor(path, threads=threads)
        finally:
            shutil.rmtree(path.parent, ignore_errors=True)


class FileModel:
    """One model file, served under ``name`` (``labswarm serve``: the job id it came from, or the file's stem).

    Every caller the app authenticated may use it.
    """

    instant = True  # check() compares names

    def __init__(self, path: Path, name: str) -> None:
        self.path = path
        self.name = name

    def check(self, key: str, user: User | None) -> None:
        """See :meth:`ModelSource.check`."""
        if key != self.name:
            raise NotFound(f"no model {key!r}: this server serves {self.name!r}")

    def load(self, key: str, threads: int) -> Predictor:
        """Load the file."""
        return Predictor(self.path, threads=threads)
