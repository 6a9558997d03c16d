"""One active session per experiment (a partial unique index on sessions.experiment).

The index covers the sessions whose status is ``running`` or ``paused``, so two concurrent starts cannot both insert
one (SQLite and PostgreSQL both have partial indexes).

A database where a race already left several active sessions of one experiment keeps the newest (by creation time,
then id) and fails the others, with the reason in ``error``, before the index is made.

Revision 0002 (after '0001').
"""

from __future__ import annotations

from datetime import UTC, datetime

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

ACTIVE_SQL = "status IN ('running', 'paused')"
INDEX = "uq_sessions_active_experiment"

sessions = sa.table("sessions", sa.column("id", sa.String), sa.column("experiment", sa.String),
                    sa.column("status", sa.String), sa.column("error", sa.Text),
                    sa.column("created_at", sa.DateTime), sa.column("finished_at", sa.DateTime))


def upgrade() -> None:
    conn = op.get_bind()
    active = conn.execute(
        sa.select(sessions.c.id, sessions.c.experiment).where(sessions.c.status.in_(("running", "paused")))
        .order_by(sessions.c.experiment, sessions.c.created_at.desc(), sessions.c.id.desc())).all()
    seen: dict[str, str] = {}
    for session_id, experiment in active:
        if experiment not in seen:
            seen[experiment] = session_id
            continue
        conn.execute(sessions.update().where(sessions.c.id == session_id).values(
            status="failed", finished_at=datetime.now(UTC).replace(tzinfo=None),
            error=f"another session of experiment {experiment!r} ({seen[experiment]}) was active too; only one "
                  "may be (migration 0002)"))
    op.create_index(INDEX, "sessions", ["experiment"], unique=True, sqlite_where=sa.text(ACTIVE_SQL),
                    postgresql_where=sa.text(ACTIVE_SQL))


def downgrade() -> None:
    op.drop_index(INDEX, table_name="sessions")
