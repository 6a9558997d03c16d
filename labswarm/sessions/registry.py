"""The experiment registry: validated experiment configurations stored by name.

A stored configuration that no longer validates (the code changed since it was registered) is kept and listed;
:meth:`ExperimentRegistry.problem` says why it is invalid, :meth:`ExperimentRegistry.config` refuses it, and the
session service fails that experiment's active sessions with the reason when the manager starts, the others run.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from labswarm.config import ExperimentConfig, parse_experiment
from labswarm.db import utcnow
from labswarm.errors import ConfigError, Conflict, NotFound
from labswarm.paths import DataRoots, check_experiment_paths
from labswarm.sessions.models import ExperimentRow, active_session


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

    def register(self, data: dict[str, Any] | str) -> ExperimentRow:
        """Validate and store an experiment (replacing one of the same name without an active session).

        Args:
            data: the experiment as YAML text or a mapping.

        Raises:
            ConfigError: invalid configuration (each field with its dotted path and the reason), or a path outside
                the data roots (:mod:`labswarm.paths`), refused before anything is opened or created.
            Conflict: the experiment has an active session and a different configuration.
        """
        config = parse_experiment(data, source="request body")
        check_experiment_paths(config, self.roots, source="request body")
        with self.db() as db:
            row = db.get(ExperimentRow, config.name)
            changed = row is not None and row.fingerprint != config.fingerprint()
            if changed and (active := active_session(db, config.name)):
                raise Conflict(f"experiment {config.name!r} has an active session {active}; cancel it first")
            if row is None:
                row = ExperimentRow(name=config.name)
                db.add(row)
            row.config = config.model_dump(mode="json")
            row.fingerprint = config.fingerprint()
            row.updated_at = utcnow()
            db.commit()
            self._configs.pop(config.name, None)
            return row

    def list(self) -> list[ExperimentRow]:
        """Every registered experiment, by name."""
        with self.db() as db:
            return list(db.scalars(select(ExperimentRow).order_by(ExperimentRow.name)))

    def get(self, name: str) -> ExperimentRow:
        """The stored experiment ``name``.

        Raises:
            NotFound: no such experiment.
        """
        with self.db() as db:
            row = db.get(ExperimentRow, name)
        if row is None:
            raise NotFound(f"no experiment {name!r}")
        return row

    def config(self, name: str) -> ExperimentConfig:
        """The validated configuration of a registered experiment.

        Raises:
            NotFound: no such experiment.
            ConfigError: the stored configuration no longer validates (each field with its dotted path and the
                reason; source: ``stored configuration of experiment 'name'``).
        """
        cached = self._configs.get(name)
        if cached is None:
            cached = self._configs[name] = parse_experiment(self.get(name).config,
                                                            source=f"stored configuration of experiment {name!r}")
        return cached

    def problem(self, name: str) -> str | None:
        """Why the stored configuration of ``name`` no longer validates, in one line; ``None`` when it does.

        Raises:
            NotFound: no such experiment.
        """
        try:
            self.config(name)
        except ConfigError as exc:
            reasons = "; ".join(f"{path or '<root>'}: {reason}" for path, reason in exc.errors)
            return f"the stored configuration of experiment {name!r} no longer validates ({reasons}); register it again"
        return None
