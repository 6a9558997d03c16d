"""A session's history kept (issue 27, item 5): the table ``session_series``.

One row per point of a session's time series (:class:`labswarm.sessions.models.SeriesPointRow`): ``time`` (Unix
s), ``depth``, the ``published`` and ``finished`` counters, ``publish_rate``, ``consume_rate`` and ``asked_rate``
(samples/s, nullable); indexed by ``(session_id, time)``. Bounded per session by :mod:`labswarm.sessions.history`
(downsampled as the session ages). Sessions that ended before this revision have no history.

Revision 0008 (after '0007').
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "session_series",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("session_id", sa.String(32), nullable=False),
        sa.Column("time", sa.Float(), nullable=False),
        sa.Column("depth", sa.Integer(), nullable=False),
        sa.Column("published", sa.Integer(), nullable=False),
        sa.Column("finished", sa.Integer(), nullable=False),
        sa.Column("publish_rate", sa.Float(), nullable=True),
        sa.Column("consume_rate", sa.Float(), nullable=True),
        sa.Column("asked_rate", sa.Float(), nullable=True),
        sa.ForeignKeyConstraint(["session_id"], ["sessions.id"]),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_session_series_session_time", "session_series", ["session_id", "time"])


def downgrade() -> None:
    op.drop_index("ix_session_series_session_time", table_name="session_series")
    op.drop_table("session_series")
