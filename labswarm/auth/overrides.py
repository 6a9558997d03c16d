"""The users' policies as the manager applies them: the settings' and the tokens file's (:mod:`labswarm.auth.quotas`),
then what an admin set over the API (``/v1/quotas/{user}``), stored in the database (``user_policies``,
:class:`~labswarm.auth.models.UserPolicyRow`) so that they outlive the manager process.

Layers, each key of the later winning: the settings' defaults (``LABSWARM_QUOTA_*``, ``LABSWARM_USER_WEIGHTS``), the
user's tokens-file entry (``weight``, ``quotas``), the admin's overrides. An override of a quota to ``None`` lifts
that quota for the user; a key the admin left out keeps the layer below. One :class:`PolicyStore` serves one
manager process (the sessions' and the jobs' services share it): its overrides are read from the database once
and kept in memory, each change written through, so a quota or a weight set by an admin holds from the next
request or scheduling pass on.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import replace
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from labswarm.auth.models import UserPolicyRow
from labswarm.auth.quotas import QUOTAS, Policies, Policy
from labswarm.db import utcnow
from labswarm.settings import Settings


class PolicyStore:
    """Every user's :class:`~labswarm.auth.quotas.Policy`: ``base`` (settings and tokens file), then the admin's
    overrides stored in the database.

    Args:
        base: the policies of the settings and the tokens file (:meth:`Policies.from_settings`).
        db: opens a database session (a context manager) on the manager's database.
    """

    def __init__(self, base: Policies, db: Callable[[], AbstractContextManager[Session]]) -> None:
        self.base = base
        self._db = db
        self._lock = threading.Lock()
        self._overrides: dict[str, tuple[float | None, dict[str, int | None]]] | None = None

    @classmethod
    def from_settings(cls, settings: Settings, db: Callable[[], AbstractContextManager[Session]]) -> PolicyStore:
        """The store of the settings' and the tokens file's policies (:meth:`Policies.from_settings`) with the
        overrides of the database ``db`` opens.

        Raises:
            ConfigError: an invalid ``weight`` or ``quotas`` in the tokens file.
        """
        return cls(Policies.from_settings(settings), db)

    def of(self, user: str) -> Policy:
        """``user``'s policy now: the base one with the admin's overrides applied."""
        policy = self.base.of(user)
        found = self._loaded().get(user)
        if found is None:
            return policy
        weight, quotas = found
        if weight is not None:
            policy = replace(policy, weight=weight)
        changes: dict[str, Any] = {k: v for k, v in quotas.items() if k in QUOTAS}
        return replace(policy, **changes)

    def weight(self, user: str) -> float:
        """``user``'s fair-share weight now (> 0)."""
        return self.of(user).weight

    def overrides(self, user: str) -> dict[str, Any]:
        """What an admin set for ``user``: ``{"weight": float | None, "quotas": {name: int | None}}`` (``weight``
        ``None``, ``quotas`` empty: nothing set)."""
        weight, quotas = self._loaded().get(user, (None, {}))
        return {"weight": weight, "quotas": dict(quotas)}

    def users(self) -> list[str]:
        """The users with a policy of their own (a tokens-file entry or ``LABSWARM_USER_WEIGHTS`` that sets one, or
        an admin's overrides), sorted; everyone else has the default policy (:attr:`Policies.default`)."""
        return sorted(set(self.base.users) | set(self._loaded()))

    def set(self, user: str, weight: float | None, quotas: dict[str, int | None], by: str) -> Policy:
        """Replace the admin's overrides of ``user`` by ``weight`` (``None``: not overridden) and ``quotas`` (the
        quotas overridden, by name; ``None`` as a value lifts that quota); write them to the database, then apply
        them. Nothing set (``weight`` ``None`` and no quota) is :meth:`clear`: no empty row is stored, and the user
        is listed only when a policy of their own remains. Returns the user's policy now.

        Raises:
            ValueError: an unknown quota name, a negative quota or a weight <= 0 (the API validates first).
        """
        if unknown := sorted(set(quotas) - set(QUOTAS)):
            raise ValueError(f"unknown quotas {unknown}: one of {sorted(QUOTAS)}")
        if any(v is not None and v < 0 for v in quotas.values()) or (weight is not None and weight <= 0):
            raise ValueError("quotas must be >= 0 and the weight > 0")
        if weight is None and not quotas:
            return self.clear(user)
        with self._lock:
            overrides = self._load()
            with self._db() as db:
                row = db.get(UserPolicyRow, user) or UserPolicyRow(user=user)
                row.weight, row.quotas, row.updated_by, row.updated_at = weight, dict(quotas), by, utcnow()
                db.add(row)
                db.commit()
            # copy on write: readers iterate the dict without the lock (users(), of())
            self._overrides = {**overrides, user: (weight, dict(quotas))}
        return self.of(user)

    def clear(self, user: str) -> Policy:
        """Remove the admin's overrides of ``user`` (from the database, then here). Returns their policy now."""
        with self._lock:
            overrides = self._load()
            with self._db() as db:
                row = db.get(UserPolicyRow, user)
                if row is not None:
                    db.delete(row)
                    db.commit()
            self._overrides = {name: found for name, found in overrides.items() if name != user}  # copy on write
        return self.of(user)

    def _loaded(self) -> dict[str, tuple[float | None, dict[str, int | None]]]:
        """The overrides, read from the database at the first use."""
        overrides = self._overrides
        if overrides is None:
            with self._lock:
                overrides = self._load()
        return overrides

    def _load(self) -> dict[str, tuple[float | None, dict[str, int | None]]]:
        """The overrides (the lock held), read once."""
        if self._overrides is None:
            with self._db() as db:
                rows = db.execute(select(UserPolicyRow.user, UserPolicyRow.weight, UserPolicyRow.quotas))
                self._overrides = {user: (weight, dict(quotas or {})) for user, weight, quotas in rows}
        return self._overrides
