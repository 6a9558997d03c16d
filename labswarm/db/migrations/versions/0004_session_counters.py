"""Counts of each session's ledger per status on the session row (issue 10, item 3): progress reads one row.

``sessions.pending`` (ledger status ``published``), ``done``, ``cached``, ``failed``: integers, 0 by default,
filled here from the ledger of every existing session (one ``GROUP BY`` per status over ``samples``). From then on
the ledger's writes keep them (labswarm/sessions/ledger.py).

Revision 0004 (after '0003').
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

#: Column -> the ledger status it counts.
COLUMNS = {"pending": "published", "done": "done", "cached": "cached", "failed": "failed"}


def upgrade() -> None:
    with op.batch_alter_table("sessions") as batch:
        for column in COLUMNS:
            batch.add_column(sa.Column(column, sa.Integer(), server_default="0", nullable=False))
    for column, status in COLUMNS.items():
        op.execute(sa.text(
            f"UPDATE sessions SET {column} = (SELECT count(*) FROM samples "
            f"WHERE samples.session_id = sessions.id AND samples.status = '{status}')"))


def downgrade() -> None:
    with op.batch_alter_table("sessions") as batch:
        for column in COLUMNS:
            batch.drop_column(column)
