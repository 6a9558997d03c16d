"""The experiment registry: validated experiment configurations stored by name, each with its owner.

A stored configuration that no longer validates (the code changed since it was registered), or whose paths lie
outside this manager's data roots (they changed since: the roots are those of the running process), is kept and
listed; :meth:`ExperimentRegistry.problem` says why it is invalid, :meth:`ExperimentRegistry.config` refuses it
(no session starts on it, no worker is served it), and the session service reports it and fails that
experiment's active sessions with the reason when the manager starts; the others run.

Owners (issue 11): an experiment records the user who registered it. Names are global (a name is a queue
name): a ``user`` registering a name that another user holds gets a :class:`~labswarm.errors.Conflict` that
says the name is taken, not by whom; an admin may replace anyone's experiment, whose owner stays. Reads take an
``owner`` filter (``None``: an admin, who sees every experiment); another user's experiment is
:class:`~labswarm.errors.NotFound`, as one that does not exist.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from labswarm.config.experiment import ExperimentConfig, parse_experiment
from labswarm.config.roots import check_experiment_paths, check_labels_paths, experiment_paths
from labswarm.db import utcnow
from labswarm.errors import ConfigError, Conflict, DatasetError, NotFound
from labswarm.paths import DataRoots
from labswarm.sessions.models import DEFAULT_OWNER, ExperimentRow, active_session


class ExperimentRegistry:
    """Registers, lists and reads experiments; caches each validated configuration.

    Args:
        db: a factory of database sessions (context managers).
        roots: the directories the paths of a registered experiment must lie in; default: the current directory.
    """

    def __init__(self, db: Callable[[], AbstractContextManager[Session]], roots: DataRoots | None = None) -> None:
        self.db = db
        self.roots = roots or DataRoots()
        self._configs: dict[str, ExperimentConfig] = {}

    def register(self, data: dict[str, Any] | str, owner: str = DEFAULT_OWNER, *, admin: bool = True
                 ) -> ExperimentRow:
        """Validate and store an experiment (replacing one of the same name without an active session).

        Args:
            data: the experiment as YAML text or a mapping.
            owner: the user registering it, recorded on a new experiment (a replaced one keeps its owner); default
                :data:`~labswarm.sessions.models.DEFAULT_OWNER`.
            admin: whether that user may replace another user's experiment (an admin may).

        Raises:
            ConfigError: invalid configuration (each field with its dotted path and the reason), or a path outside
                the data roots (:mod:`labswarm.paths`), refused before anything is opened or created.
            Conflict: the name is another user's (``admin`` false; the owner is not named), or the experiment has
                an active session and a different configuration.
        """
        config = parse_experiment(data, source="request body")
        check_experiment_paths(config, self.roots, source="request body")
        with self.db() as db:
            row = db.get(ExperimentRow, config.name)
            if row is not None and row.owner != owner and not admin:
                raise Conflict(f"experiment name {config.name!r} is taken (names are global: they name queues); "
                               "choose another name")
            changed = row is not None and row.fingerprint != config.fingerprint()
            if changed and (active := active_session(db, config.name)):
                raise Conflict(f"experiment {config.name!r} has an active session {active}; cancel it first")
            if row is None:
                row = ExperimentRow(name=config.name, owner=owner)
                db.add(row)
            row.config = config.model_dump(mode="json")
            row.fingerprint = config.fingerprint()
            row.updated_at = utcnow()
            db.commit()
            self._configs.pop(config.name, None)
            return row

    def list(self, owner: str | None = None) -> list[ExperimentRow]:
        """The registered experiments of ``owner`` (``None``: every one), by name."""
        stmt = select(ExperimentRow).order_by(ExperimentRow.name)
        if owner is not None:
            stmt = stmt.where(ExperimentRow.owner == owner)
        with self.db() as db:
            return list(db.scalars(stmt))

    def get(self, name: str, owner: str | None = None) -> ExperimentRow:
        """The stored experiment ``name``.

        Args:
            name: the experiment.
            owner: when given, the experiment must be this user's.

        Raises:
            NotFound: no such experiment, or (``owner`` given) another user's.
        """
        with self.db() as db:
            row = db.get(ExperimentRow, name)
        if row is None or (owner is not None and row.owner != owner):
            raise NotFound(f"no experiment {name!r}")
        return row

    def config(self, name: str, row: ExperimentRow | None = None) -> ExperimentConfig:
        """The validated configuration of a registered experiment, its paths inside this registry's data roots
        (checked once per process: the roots are the running manager's).

        Args:
            name: the experiment.
            row: its stored row, when the caller has it (saves a read).

        Raises:
            NotFound: no such experiment.
            ConfigError: the stored configuration no longer validates, or names a path outside the data roots
                (each field with its dotted path and the reason; source: ``stored configuration of experiment
                'name'``).
            DatasetError: its labels CSV exists but cannot be read as one.
        """
        cached = self._configs.get(name)
        if cached is None:
            source = f"stored configuration of experiment {name!r}"
            config = parse_experiment((row or self.get(name)).config, source=source)
            check_experiment_paths(config, self.roots, source=source)
            cached = self._configs[name] = config
        return cached

    def config_and_clips(self, name: str, row: ExperimentRow | None = None) -> tuple[ExperimentConfig, int]:
        """What a session start needs, with one read of the labels CSV: the configuration (as :meth:`config`'s,
        cached the same way), the rows of its labels CSV checked again against the data roots (the file may have
        changed since registration) and their number, in the same pass (200k rows: one read instead of three).

        Args:
            name: the experiment.
            row: its stored row, when the caller has it (saves a read).

        Returns:
            ``(configuration, clips)``: clips = rows of the labels CSV (samples = clips x transformations).

        Raises:
            NotFound: no such experiment.
            ConfigError: as :meth:`config`'s; or a row's audio path lies outside the data roots
                (:class:`~labswarm.paths.OutsideDataRoots`, the rows named by line number).
            DatasetError: the labels CSV is missing or cannot be read as one.
        """
        config = self._configs.get(name)
        if config is None:
            source = f"stored configuration of experiment {name!r}"
            config = parse_experiment((row or self.get(name)).config, source=source)
            self.roots.check_all(experiment_paths(config), source=source)
        clips = check_labels_paths(config, self.roots)
        self._configs[name] = config
        return config, clips

    def problem(self, name: str, row: ExperimentRow | None = None) -> str | None:
        """Why the stored configuration of ``name`` is invalid (it no longer validates, or names a path outside
        the data roots), in one line; ``None`` when it is valid.

        Raises:
            NotFound: no such experiment.
        """
        try:
            self.config(name, row)
        except ConfigError as exc:
            reasons = "; ".join(f"{path or '<root>'}: {reason}" for path, reason in exc.errors)
            return f"the stored configuration of experiment {name!r} no longer validates ({reasons}); register it again"
        except DatasetError as exc:
            return f"the stored configuration of experiment {name!r} is invalid: {exc}"
        return None

    def problems(self) -> dict[str, str]:
        """Every stored experiment that is invalid, with its :meth:`problem` (the manager reports them when it
        starts)."""
        return {row.name: problem for row in self.list() if (problem := self.problem(row.name, row)) is not None}
