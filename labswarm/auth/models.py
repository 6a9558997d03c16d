"""The table of the users' weights and quotas an admin set over the API (revision 0011).

One row per user with overrides (:mod:`labswarm.auth.overrides`); a user without a row keeps what the settings and
the tokens file give them (:mod:`labswarm.auth.quotas`).
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import JSON, Float, String
from sqlalchemy.orm import Mapped, mapped_column

from labswarm.db import Base, utcnow


class UserPolicyRow(Base):
    """An admin's overrides of one user's policy.

    ``user``: the user name (:data:`labswarm.auth.tokens.NAME`, at most 64 characters); ``weight``: their
    fair-share weight (> 0), ``None``: not overridden; ``quotas``: the quotas overridden, by name (a key of
    :data:`labswarm.auth.quotas.QUOTAS`; a ``null`` value: no quota for this user, whatever the defaults say; a key
    left out: not overridden); ``updated_by``: the admin who set them last, ``updated_at`` when (UTC).
    """

    __tablename__ = "user_policies"
    user: Mapped[str] = mapped_column(String(64), primary_key=True)
    weight: Mapped[float | None] = mapped_column(Float, nullable=True)
    quotas: Mapped[dict] = mapped_column(JSON, default=dict)
    updated_by: Mapped[str] = mapped_column(String(64))
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)
